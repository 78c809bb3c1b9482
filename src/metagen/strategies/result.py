"""The result type every meta-generation strategy returns."""

from __future__ import annotations

from dataclasses import dataclass, field

from metagen.decoding.cost import Cost


@dataclass
class Candidate:
    """One generated output as a strategy saw it.

    token_ids: None when the generator could not know them (see `Completion.token_ids`).
    certainties: per-token KL(uniform ‖ p) when the generator reports it (self-certainty).
    score: the scorer's value (best-of-N, weighted voting), None when unscored.
    answer: the extracted answer (voting strategies), None when none was found.
    """

    text: str
    token_ids: list[int] | None = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str | None = None
    certainties: list[float] = field(default_factory=list)
    score: float | None = None
    answer: str | None = None


@dataclass
class StrategyResult:
    """chosen: the output the strategy returns; candidates: everything it generated, in order;
    votes: answer -> total vote (voting strategies); cost: every model call it made, scorers
    and verifiers included."""

    chosen: Candidate
    candidates: list[Candidate]
    cost: Cost
    votes: dict[str, float] = field(default_factory=dict)

    @property
    def text(self) -> str:
        return self.chosen.text

    @property
    def answer(self) -> str | None:
        return self.chosen.answer


def candidates_from(result) -> list[Candidate]:
    """Candidates from a `GenerationResult`'s completions."""
    return [
        Candidate(c.text, None if c.token_ids is None else list(c.token_ids), list(c.logprobs),
                  c.finish_reason, list(c.certainties))
        for c in result.completions
    ]
