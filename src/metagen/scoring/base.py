"""The one interface of scorers and verifiers.

    scores = scorer.score(prompt, candidates)     # Scores(values, cost), higher is better
    verdict = verifier.verify(prompt, candidate)  # Verdict(passed, score, feedback, cost)

A scorer rates a batch of candidates of one prompt at once (so a judge or a reward model can
batch its own model calls) and reports what it spent as a `Cost`; strategies add that cost to
their own. A `Verifier` is a scorer whose score comes from a pass/fail check with feedback text
(tests, a reference answer); as a scorer it returns each verdict's `score`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from metagen.decoding.cost import Cost

if TYPE_CHECKING:  # scorers read the decoding floor's `Completion`, as strategies do
    from metagen.decoding.prompts import Prompt
    from metagen.decoding.result import Completion


@dataclass
class Scores:
    """values[i]: the score of candidates[i] (higher is better); cost: model calls spent on them."""

    values: list[float]
    cost: Cost = field(default_factory=Cost)


class Scorer(ABC):
    """Rates the candidates of one prompt."""

    name: str = "scorer"

    @abstractmethod
    def score(self, prompt: Prompt, candidates: Sequence[Completion]) -> Scores:
        """One score per candidate, in order, and the cost of computing them."""

    def __call__(self, prompt: Prompt, candidates: Sequence[Completion]) -> Scores:
        scores = self.score(prompt, candidates)
        if len(scores.values) != len(candidates):
            raise ValueError(
                f"scorer {self.name!r} returned {len(scores.values)} scores for {len(candidates)} candidates"
            )
        return scores


class FunctionScorer(Scorer):
    """A scorer from a per-candidate function (prompt_text, candidate) -> float that makes no
    model calls (its cost is zero)."""

    def __init__(self, function: Callable[[str, Completion], float], name: str | None = None) -> None:
        self.function = function
        self.name = name or getattr(function, "__name__", "function")

    def score(self, prompt: Prompt, candidates: Sequence[Completion]) -> Scores:
        text = prompt_text(prompt)
        return Scores([float(self.function(text, candidate)) for candidate in candidates])

    def __repr__(self) -> str:
        return f"FunctionScorer({self.name})"


def as_scorer(scorer: Scorer | Callable[[str, Completion], float]) -> Scorer:
    """`scorer` itself, or a per-candidate function wrapped as a zero-cost `FunctionScorer`."""
    if isinstance(scorer, Scorer):
        return scorer
    if callable(scorer):
        return FunctionScorer(scorer)
    raise TypeError(f"scorer must be a Scorer or a function (prompt, candidate) -> float, got {type(scorer).__name__}")


@dataclass
class Verdict:
    """passed: the candidate is accepted; score: in [0, 1] (e.g. the share of tests passed);
    feedback: what failed, to show a model revising the candidate; cost: model calls spent."""

    passed: bool
    score: float
    feedback: str = ""
    cost: Cost = field(default_factory=Cost)


class Verifier(Scorer):
    """A pass/fail check with feedback; as a scorer it returns each verdict's score."""

    name = "verifier"

    @abstractmethod
    def verify(self, prompt: Prompt, candidate: Completion) -> Verdict:
        """Check one candidate."""

    def verify_all(self, prompt: Prompt, candidates: Sequence[Completion]) -> list[Verdict]:
        return [self.verify(prompt, candidate) for candidate in candidates]

    def score(self, prompt: Prompt, candidates: Sequence[Completion]) -> Scores:
        verdicts = self.verify_all(prompt, candidates)
        cost = Cost()
        for verdict in verdicts:
            cost += verdict.cost
        return Scores([float(v.score) for v in verdicts], cost)


def prompt_text(prompt: Prompt) -> str:
    """The text of a prompt: the string itself, or the last user message's content for chat
    messages (token-id prompts have no text and give "")."""
    if isinstance(prompt, str):
        return prompt
    items = list(prompt)
    messages = [m for m in items if isinstance(m, Mapping)]
    users = [m for m in messages if m.get("role") == "user"]
    if users:
        return str(users[-1].get("content", ""))
    return str(messages[-1].get("content", "")) if messages else ""
