"""Evaluation: tasks (arithmetic, JSONL, HumanEval code problems graded in the sandbox), a
resumable harness over strategies × budgets, and accuracy-vs-compute plots."""

from metagen.eval.config import EvalConfig, EvalReport
from metagen.eval.running import evaluate
from metagen.eval.summary import format_table, summarize
from metagen.eval.metrics import pass_at_k
from metagen.eval.points import CurvePoint
from metagen.eval.tasks import Problem, arithmetic_problems, humaneval_problems, load_jsonl, write_jsonl

__all__ = [
    "CurvePoint",
    "EvalConfig",
    "EvalReport",
    "Problem",
    "arithmetic_problems",
    "evaluate",
    "format_table",
    "humaneval_problems",
    "load_jsonl",
    "pass_at_k",
    "summarize",
    "write_jsonl",
]
