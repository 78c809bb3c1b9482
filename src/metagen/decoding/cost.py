"""`Cost`: what a generation, a scorer call or a whole strategy spent.

Strategies add the costs of every model call they make (their own, their scorers' and their
verifiers'), so accuracy can be drawn against compute for any of them.
"""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass
class Cost:
    """Counts of one or more model calls.

    model_calls: forward passes (a batched step over many rows counts once).
    prompt_tokens_computed: prompt tokens run through the model.
    prompt_tokens_reused: prompt tokens served from a shared cache prefix instead (e.g. the
        n − 1 extra copies of a prompt forked into n rows).
    generated_tokens: tokens sampled.
    flops: estimated forward FLOPs (2·params per token plus attention, from the architecture);
        None when unknown (a backend that cannot see its model), never a made-up 0. Unknown
        is absorbing: a sum with an unknown part is unknown.
    wall_seconds: elapsed time.
    draft_tokens: speculative decoding: draft tokens proposed to the target.
    accepted_tokens: draft tokens the verification accepted (a row that stops on EOS or a stop
        string inside an accepted draft emits fewer of them).
    target_steps: target forwards that produced tokens, counted per row (the prefill and each
        verification; plain decoding takes one per generated token).
    scorer_flops: the part of `flops` spent by scorers and value models (PRMs, value heads,
        judges) inside search strategies (None when unknown, like `flops`).
    """

    model_calls: int = 0
    prompt_tokens_computed: int = 0
    prompt_tokens_reused: int = 0
    generated_tokens: int = 0
    flops: float | None = 0.0
    wall_seconds: float = 0.0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    target_steps: int = 0
    scorer_flops: float | None = 0.0

    def __add__(self, other: "Cost") -> "Cost":
        if not isinstance(other, Cost):
            return NotImplemented
        return Cost(**{f.name: _add(getattr(self, f.name), getattr(other, f.name)) for f in fields(self)})

    def __iadd__(self, other: "Cost") -> "Cost":
        if not isinstance(other, Cost):
            return NotImplemented
        for f in fields(self):
            setattr(self, f.name, _add(getattr(self, f.name), getattr(other, f.name)))
        return self

    def scaled(self, factor: float) -> "Cost":
        """Every count times `factor` (a mean over k runs is the sum scaled by 1/k); unknown stays unknown."""
        return Cost(**{name: None if value is None else value * factor for name, value in self.to_dict().items()})

    @property
    def prompt_reuse_fraction(self) -> float:
        """Share of prompt tokens served from the cache rather than recomputed."""
        total = self.prompt_tokens_computed + self.prompt_tokens_reused
        return self.prompt_tokens_reused / total if total else 0.0

    @property
    def acceptance_rate(self) -> float | None:
        """Share of draft tokens the target accepted (None without drafts)."""
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else None

    @property
    def block_efficiency(self) -> float | None:
        """Generated tokens per target step (1 for plain decoding; None when not counted)."""
        return self.generated_tokens / self.target_steps if self.target_steps else None

    def to_dict(self) -> dict[str, float]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def _add(a, b):
    """a + b, None when either is unknown."""
    return None if a is None or b is None else a + b


def forward_flops(model, start: int, count: int) -> float:
    """FLOPs of running `count` tokens at positions start, ..., start + count − 1 (each token
    attends to the tokens before it and itself). O(1): the attention term is linear in context."""
    if count <= 0:
        return 0.0
    first = model.flops_per_token(start + 1)
    last = model.flops_per_token(start + count)
    return count * (first + last) / 2.0
