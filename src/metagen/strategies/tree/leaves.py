"""What every tree search shares: its settings, and turning finished leaves into a result.

Aggregation of the finished solutions (the leaves):
- "best": the leaf with the highest value V;
- "majority": self-consistency over the leaves' extracted answers;
- "weighted": weighted voting, each leaf's answer weighted by its value.
Leaves cut before their constraint accepted them (`Node.complete` False) are never chosen while
a complete one exists (`prefer_complete`); an unfinished frontier node returned because nothing
finished carries the constraint's verdict on its path as it stands.
"""

from __future__ import annotations

from dataclasses import dataclass

from metagen.decoding.result import Completion, GenerationResult, prefer_complete
from metagen.sampling import SamplingParams
from metagen.scoring.answers import check_answer_field, extract_answer
from metagen.strategies.options import check_options, nested
from metagen.strategies.spec import shared
from metagen.strategies.tree.node import Node, StepConfig
from metagen.strategies.voting import tally, winner

@dataclass(frozen=True)
class TreeConfig:
    """params: how each step is sampled (stateless adapters; max_tokens bounds a solution);
    step: the step delimiter and length cap; aggregation: best | majority | weighted;
    pattern / math: answer extraction and comparison for the votes."""

    params: SamplingParams = SamplingParams(temperature=0.8, max_tokens=256)
    step: StepConfig = nested(StepConfig)
    aggregation: str = shared("aggregation")
    pattern: str | None = shared("pattern")
    math: bool = shared("math")
    answer_field: str | None = shared("answer_field")  # the answer is this field of a JSON output (not pattern)

    def __post_init__(self) -> None:
        check_options(self)  # every search's options: its own fields are declared beside them
        check_answer_field(self.pattern, self.answer_field)


def candidate_of(node: Node, config: TreeConfig) -> Completion:
    complete = node.complete
    if not node.finished and node.sampler is not None:  # a frontier node: would the constraint accept it now?
        complete = node.sampler.stop_verdict(0)[0]
    return Completion(node.text, node.path_ids(), node.path_logprobs(), finish_reason=node.finish_reason or "length",
                      score=node.value, answer=extract_answer(node.text, config.pattern, config.answer_field),
                      complete=complete)


def finish_search(expander, leaves: list[Node], config: TreeConfig,
                  unfinished: list[Node] = ()) -> GenerationResult:
    """GenerationResult over the finished `leaves` (or, when none finished within the budget, the
    `unfinished` frontier, marked finish_reason "length"), aggregated as configured."""
    nodes = list(leaves) or list(unfinished)
    if not nodes:
        raise RuntimeError("the search produced no node; raise its budget")
    candidates = [candidate_of(node, config) for node in nodes]
    values = [c.score if c.score is not None else 0.0 for c in candidates]
    if config.aggregation == "best":
        eligible = {id(c) for c in prefer_complete(candidates)}
        best = max((i for i, c in enumerate(candidates) if id(c) in eligible), key=lambda i: values[i])  # ties: first
        return GenerationResult(candidates, cost=expander.cost, chosen=candidates[best])
    weights = [1.0] * len(candidates) if config.aggregation == "majority" else [max(v, 0.0) for v in values]
    votes = tally(candidates, weights, config.math)
    return GenerationResult(candidates, cost=expander.cost, chosen=winner(candidates, votes, config.math), votes=votes)
