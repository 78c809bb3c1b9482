"""Tools a chain can call between generations: text in, text out, errors as "error: ..." text."""

from metagen.tools.base import ERROR_PREFIX, FunctionTool, Tool, ToolError
from metagen.tools.calculator import Calculator, evaluate
from metagen.tools.python import PythonTool

__all__ = ["ERROR_PREFIX", "Calculator", "FunctionTool", "PythonTool", "Tool", "ToolError", "evaluate"]
