"""`Cost`: what a generation, a scorer call or a whole strategy spent.

Strategies add the costs of every model call they make (their own, their scorers' and their
verifiers'), so accuracy can be drawn against compute for any of them.

Every decoding loop counts its model's forwards with the two functions here (the sampling and
speculative loops, beam search, tokenwise controlled decoding, the tree expander, the serving
engine's calls), so a forward means the same in all of them:

    cost += prefill_cost(model, len(prompt_ids), n)            # the prompt once, forked into n rows
    cost += forward_cost(model, cache_lengths, fed_per_row)    # each decode / verification forward
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
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
    draft_tokens: speculative decoding: draft tokens proposed to the target (every node of a tree draft).
    accepted_tokens: draft tokens the verification accepted (a row that stops on EOS or a stop
        string inside an accepted draft emits fewer of them).
    target_steps: target forwards that produced tokens, counted per row: a forward counts one for
        each row it gives the distribution that row's next token is taken from (the prefill for
        each of the n rows it is forked into, each decode step, each verification). Plain
        decoding takes one per generated token; speculative decoding fewer. Beam search counts one
        per live beam per step (the prefill's one row included): each beam's next token — its
        candidates' extensions — is drawn from that forward's logits, so `block_efficiency` is
        the tokens it committed per beam-step. Tokenwise controlled decoding and the tree
        expander feed every drawn token and count the forward that feeds it (each of the k
        candidate rows in tokenwise CD), not their prefill: generated_tokens == target_steps.
    scorer_flops: the part of `flops` spent by scorers and value models (PRMs, value heads,
        judges) inside search strategies (None when unknown, like `flops`).
    sandbox_seconds: CPU seconds (user + system) of the programs a strategy ran in the sandbox
        (a code prompt's docstring examples: code_cluster, best_of_n_value --value tests,
        verifier_refine); compute no FLOPs count, reported beside them. The evaluation's own
        grading with hidden tests is not a strategy's cost and is not in it.
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
    sandbox_seconds: float = 0.0

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


def forward_cost(model, starts: Sequence[int], counts: int | Sequence[int] = 1, *, produced: bool = True) -> Cost:
    """The `Cost` of one model forward over len(starts) rows, row b feeding `counts[b]` tokens (or
    `counts` for every row) at positions starts[b], starts[b] + 1, ...: one model call, FLOPs
    Σ_b forward_flops(model, starts[b], counts[b]) and, when the forward `produced` each row's
    next token (its logits are what the row's next token is drawn from), one target step per
    row (see `Cost.target_steps`). O(rows)."""
    if isinstance(counts, int):  # rows at one position (a decode step) cost one estimate times their number
        flops = sum((forward_flops(model, start, counts) * rows for start, rows in Counter(starts).items()), 0.0)
    elif len(counts) != len(starts):
        raise ValueError(f"counts has {len(counts)} entries for {len(starts)} rows: one per row")
    else:
        flops = sum((forward_flops(model, start, count) for start, count in zip(starts, counts)), 0.0)
    return Cost(model_calls=1, flops=flops, target_steps=len(starts) if produced else 0)


def prefill_cost(model, length: int, rows: int = 1, *, reused: bool = False, produced: bool = True) -> Cost:
    """The `Cost` of a prompt of `length` tokens prefilled once and forked into `rows` rows: one
    forward of the prompt (`forward_cost` of `length` tokens at position 0), the prompt computed
    once and reused by the other rows − 1, and, when `produced`, one target step per row (each
    row's first token is drawn from it). `reused`: the prompt's keys and values came from a
    cache (`PromptCache`): no model call, no FLOPs, all `rows` copies reused."""
    steps = rows if produced else 0
    if reused:
        return Cost(prompt_tokens_reused=length * rows, target_steps=steps)
    cost = forward_cost(model, [0], length, produced=False)
    cost.prompt_tokens_computed, cost.prompt_tokens_reused = length, length * (rows - 1)
    cost.target_steps = steps
    return cost


def forward_flops(model, start: int, count: int) -> float:
    """FLOPs of running `count` tokens at positions start, ..., start + count − 1 (each token
    attends to the tokens before it and itself). O(1): the attention term is linear in context."""
    if count <= 0:
        return 0.0
    first = model.flops_per_token(start + 1)
    last = model.flops_per_token(start + count)
    return count * (first + last) / 2.0
