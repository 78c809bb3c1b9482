"""The tool protocol: a named function from text to text.

    tool.name, tool.description       # shown to a model in a prompt
    observation = tool("12 * 7")      # "84", or "error: ..." -- never raises

A strategy (e.g. `metagen.strategies.chain`) passes a tool the text a model wrote and puts the
returned text back into the model's context. Failures are part of that conversation, so they come
back as text starting with "error: " rather than as exceptions that would end the chain.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable

ERROR_PREFIX = "error: "


class ToolError(Exception):
    """Raised inside `Tool.run` for an expected failure; its message becomes the "error: " text."""


class Tool(ABC):
    """text -> text. Subclasses implement `run`; calling the tool turns any exception into
    "error: <message>"."""

    name: str = "tool"
    description: str = ""
    # the Cost (decoding/cost.py) of the last call beyond its wall time -- a model's tokens and
    # FLOPs, as a dense retriever's query encoding -- set by tools that run one; None: time only
    last_cost = None

    @abstractmethod
    def run(self, text: str) -> str:
        """The tool's answer to `text`; may raise (the caller sees the message)."""

    def __call__(self, text: str) -> str:
        try:
            return str(self.run(text))
        except ToolError as error:
            return ERROR_PREFIX + str(error)
        except Exception as error:  # noqa: BLE001 - a tool's failure is an observation, not a crash
            message = str(error) or type(error).__name__
            return ERROR_PREFIX + message

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


class FunctionTool(Tool):
    """A tool from a plain function str -> str (e.g. a lookup table, a search stub in tests)."""

    def __init__(self, function: Callable[[str], str], name: str | None = None, description: str = "") -> None:
        self.function = function
        self.name = name or getattr(function, "__name__", "tool")
        self.description = description or (function.__doc__ or "").strip()

    def run(self, text: str) -> str:
        return self.function(text)
