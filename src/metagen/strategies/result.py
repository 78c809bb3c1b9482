"""The result type every meta-generation strategy returns.

Complete outputs first: a candidate cut before its constraint accepted it (`complete=False`: a
structured output that hit max_tokens) is not valid output, so no strategy chooses one while a
complete candidate exists (`prefer_complete`); it may still count as a pseudo-reference (MBR).
`StrategyResult.incomplete` lists the candidates set aside that way, and `chosen.complete` says
whether the chosen one is valid (False only when every candidate was cut).
"""

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
    complete: None when no constraint judged the output; else whether it ended where its
        constraint accepts (False: cut by max_tokens, not valid output; see `Completion.complete`).
    """

    text: str
    token_ids: list[int] | None = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str | None = None
    certainties: list[float] = field(default_factory=list)
    score: float | None = None
    answer: str | None = None
    complete: bool | None = None


def prefer_complete(candidates: list[Candidate]) -> list[Candidate]:
    """The candidates a strategy may choose from: those not cut before their constraint accepted
    (complete is not False), or all of them when every one was cut."""
    complete = [c for c in candidates if c.complete is not False]
    return complete or list(candidates)


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

    @property
    def incomplete(self) -> list[int]:
        """Indices of the candidates cut before their constraint accepted them (never chosen
        while a complete candidate exists)."""
        return [i for i, c in enumerate(self.candidates) if c.complete is False]


def candidates_from(result) -> list[Candidate]:
    """Candidates from a `GenerationResult`'s completions."""
    return [
        Candidate(c.text, None if c.token_ids is None else list(c.token_ids), list(c.logprobs),
                  c.finish_reason, list(c.certainties), complete=c.complete)
        for c in result.completions
    ]
