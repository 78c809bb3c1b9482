"""A tiny token-level constraint for the toy model (tests/decoding/toy_model.py): a DFA over the
toy's tokens, behind the stateful `LogitsProcessor` interface, with forced runs (jump-forward).

    state 0 --a--> 1 --c--> 2 --c--> 3,   0 --b--> 3,   3 --a--> 1,   3 --b--> 3,   3 --EOS--> end

EOS is allowed in state 3 only (the accepting state). In states 1 and 2 one token is allowed,
so `forced` returns the run [c, c] (state 1) or [c] (state 2). With `hints=True`, `forced` also
proposes runs where other tokens are allowed ([a, c, c] from state 0, [b, b] from state 3), as
llguidance's canonical runs may: the loop must then take them only when the draw agrees.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from metagen.sampling import LogitsProcessor

from .toy_model import EOS, VOCAB, A, B, C, enumerate_sequences, next_logits

END = -1
TRANSITIONS = {0: {A: 1, B: 3}, 1: {C: 2}, 2: {C: 3}, 3: {A: 1, B: 3, EOS: END}}
FORCED = {1: [C, C], 2: [C]}
HINTS = {0: [A, C, C], 1: [C, C], 2: [C], 3: [B, B]}


def walk(tokens: Sequence[int], state: int = 0) -> int | None:
    """The state after `tokens`, None when some token is not allowed."""
    for token in tokens:
        if state == END or token not in TRANSITIONS[state]:
            return None
        state = TRANSITIONS[state][token]
    return state


class ToyGrammar(LogitsProcessor):
    """B rows of the DFA above; `history[b]` is the states row b went through."""

    name = "toy_grammar"

    def __init__(self, rows: int = 1, *, hints: bool = False) -> None:
        self.history = [[0] for _ in range(rows)]
        self.hints = hints

    @property
    def batch_size(self) -> int:
        return len(self.history)

    def apply(self, logits: Tensor) -> Tensor:
        out = torch.full_like(logits, -math.inf, dtype=torch.float32)
        for b, states in enumerate(self.history):
            allowed = list(TRANSITIONS[states[-1]]) if states[-1] != END else [EOS]
            out[b, allowed] = logits[b, allowed].float()
        return out

    def accept(self, tokens: Tensor) -> None:
        for states, token in zip(self.history, tokens.tolist()):
            if token >= 0:
                state = walk([token], states[-1]) if states[-1] != END else (END if token == EOS else None)
                if state is None:
                    raise ValueError(f"token {token} not allowed in state {states[-1]}")
                states.append(state)

    def rollback(self, counts: Tensor) -> None:
        for states, count in zip(self.history, counts.tolist()):
            del states[len(states) - count:]

    def select(self, indices: Tensor) -> None:
        self.history = [list(self.history[i]) for i in indices.tolist()]

    def fork(self, indices: Tensor) -> ToyGrammar:
        clone = ToyGrammar(0, hints=self.hints)
        clone.history = [list(self.history[i]) for i in indices.tolist()]
        return clone

    def reset(self) -> None:
        self.history = [[0] for _ in self.history]

    def allows_stop(self, row: int) -> bool:
        return self.history[row][-1] in (3, END)

    def finished(self, row: int) -> bool:
        return self.history[row][-1] == END

    def forced(self, row: int) -> list[int]:
        return list((HINTS if self.hints else FORCED).get(self.history[row][-1], []))


def masked_law(prompt: Sequence[int], max_tokens: int) -> dict[tuple[int, ...], float]:
    """q(y) = prod_t p(y_t | y_<t) 1[y_t allowed] / Z_t over every completion of at most
    `max_tokens` tokens (EOS only in state 3), the law of per-step masked decoding."""
    law = {}
    for sequence in enumerate_sequences(max_tokens):
        if walk(sequence) is None:
            continue
        logprob = 0.0
        for i, token in enumerate(sequence):
            logits = next_logits([*prompt, *sequence[:i]]).double()
            allowed = list(TRANSITIONS[walk(sequence[:i])])
            masked = torch.full((VOCAB,), -math.inf, dtype=torch.float64)
            masked[allowed] = logits[allowed]
            logprob += float(torch.log_softmax(masked, dim=-1)[token])
        law[sequence] = math.exp(logprob)
    return law
