"""A tiny language model whose whole sequence distribution can be enumerated exactly.

Vocabulary (V = 5): 0 = EOS "</s>", 1 = "a", 2 = "b", 3 = "c", 4 = BOS "<s>".

It is a second-order Markov chain: the next-token logits after a context ending in (u, w) are

    z = FIRST[w] + SECOND[u]        (SECOND[u] = 0 when the context has a single token)

FIRST holds log-probabilities chosen so that greedy decoding ("a" first, p = 0.45) misses the
most likely sequence ("b EOS", p ≈ 0.35 · 0.78), and so that length normalisation prefers the
long "c c c" run. SECOND makes the logits depend on the token *before* the one just fed, so a
cache that hands a row the wrong history (a bad `select` in beam search, say) changes the
numbers. The cache keeps each row's tokens as a plain list.

Helpers enumerate every sequence up to a length and give each one its exact probability under
the model, or under a per-step adaptation of the logits (temperature, top-k, ...).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence

import torch

from metagen.models.base import ForwardOutput, LanguageModel
from metagen.models.kgram import KGramCache as ToyCache  # rows of token lists: select, fork, truncate

EOS, A, B, C, BOS = 0, 1, 2, 3, 4
VOCAB = 5
PIECES = ("</s>", "a", "b", "c", "<s>")
SPECIAL = frozenset({EOS, BOS})

_FIRST_PROBS = (
    (0.30, 0.25, 0.20, 0.15, 0.10),  # after EOS (reached only with ignore_eos)
    (0.22, 0.26, 0.24, 0.20, 0.08),  # after "a": nearly flat
    (0.78, 0.10, 0.05, 0.05, 0.02),  # after "b": almost surely EOS
    (0.03, 0.01, 0.015, 0.935, 0.01),  # after "c": "c" again
    (0.04, 0.45, 0.33, 0.17, 0.01),  # after BOS
)
FIRST = torch.tensor([[math.log(p) for p in row] for row in _FIRST_PROBS], dtype=torch.float64)  # (V, V)
SECOND = torch.tensor(  # (V, V), added for the token before the last one
    [
        [0.00, 0.10, -0.05, 0.20, -0.10],
        [0.05, -0.15, 0.10, 0.00, 0.07],
        [-0.10, 0.05, 0.15, -0.05, 0.02],
        [0.12, 0.00, -0.08, 0.06, -0.03],
        [0.03, 0.09, -0.12, 0.04, 0.01],
    ],
    dtype=torch.float64,
)


def next_logits(context: Sequence[int]) -> torch.Tensor:
    """Float32 logits (V,) of the next token after `context` (non-empty)."""
    logits = FIRST[context[-1]] + (SECOND[context[-2]] if len(context) > 1 else 0.0)
    return logits.float()


class ToyTokenizer:
    """One character per token; EOS and BOS are special."""

    chat_template = None
    vocab_size = VOCAB

    def __init__(self, eos_token_ids: Sequence[int] = (EOS,)) -> None:
        self.eos_token_ids = tuple(eos_token_ids)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return ([BOS] if add_special_tokens else []) + [PIECES.index(ch) for ch in text]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return "".join(PIECES[i] for i in ids if not (skip_special_tokens and i in SPECIAL))


class ToyModel(LanguageModel):
    """The second-order Markov chain above behind the `LanguageModel` interface.

    `calls` records, per forward, the number of new tokens of each row. `eos_token_ids` makes
    other tokens end a sequence too (models such as Llama 3 have several).
    """

    name = "toy"

    def __init__(self, max_context: int = 64, eos_token_ids: Sequence[int] = (EOS,)) -> None:
        self.tokenizer = ToyTokenizer(eos_token_ids)
        self._max_context = max_context
        self.calls: list[list[int]] = []

    @property
    def vocab_size(self) -> int:
        return VOCAB

    @property
    def max_context(self) -> int:
        return self._max_context

    @property
    def kv_bytes_per_token(self) -> int:
        """0: the cache keeps token ids, no keys or values."""
        return 0

    def new_cache(self, batch_size: int = 1) -> ToyCache:
        return ToyCache(batch_size)

    def flops_per_token(self, context_length: int) -> float:
        """A made-up linear cost (100 per token plus 1 per attended key) for Cost bookkeeping."""
        return 100.0 + context_length

    def forward(self, cache, tokens, *, logits="last", hidden=False) -> ForwardOutput:
        if hidden:
            raise NotImplementedError("the toy model has no hidden states")
        rows = tokens.tolist() if isinstance(tokens, torch.Tensor) else [[int(t) for t in row] for row in tokens]
        if len(rows) != cache.batch_size:
            raise ValueError(f"got tokens for {len(rows)} rows but the cache has {cache.batch_size} rows")
        per_row = []
        for cached, new in zip(cache.rows, rows):
            if not new:
                raise ValueError("every row needs at least one new token")
            steps = []
            for token in new:
                if not 0 <= token < VOCAB:
                    raise ValueError(f"token id {token} is out of range")
                cached.append(token)
                steps.append(next_logits(cached))
            if len(cached) > self._max_context:
                raise ValueError(f"row has {len(cached)} tokens, more than the context {self._max_context}")
            per_row.append(steps)
        self.calls.append([len(new) for new in rows])
        counts = [len(steps) for steps in per_row]
        if logits == "none":
            return ForwardOutput(None, None, counts)
        if logits == "last":
            return ForwardOutput(torch.stack([steps[-1] for steps in per_row]), None, counts)
        width = max(counts)
        padded = torch.zeros(len(rows), width, VOCAB)  # (B, T, V)
        for b, steps in enumerate(per_row):
            padded[b, : len(steps)] = torch.stack(steps)
        return ForwardOutput(padded, None, counts)


# ----------------------------------------------------------------------------- enumeration

Adapt = Callable[[torch.Tensor], torch.Tensor]


def enumerate_sequences(max_tokens: int, vocab: int = VOCAB) -> list[tuple[int, ...]]:
    """Every completion of at most `max_tokens` tokens: those ending at their first EOS, and
    those of exactly `max_tokens` tokens without EOS."""
    sequences = []
    for length in range(1, max_tokens + 1):
        for body in itertools.product([t for t in range(vocab) if t != EOS], repeat=length - 1):
            sequences.append((*body, EOS))
    sequences += list(itertools.product([t for t in range(vocab) if t != EOS], repeat=max_tokens))
    return sequences


def step_logprobs(prompt: Sequence[int], sequence: Sequence[int], adapt: Adapt | None = None) -> list[float]:
    """log p(sequence[i] | prompt + sequence[:i]) in float64, optionally under adapted logits."""
    values = []
    for i, token in enumerate(sequence):
        logits = next_logits([*prompt, *sequence[:i]]).double()
        if adapt is not None:
            logits = adapt(logits)
        values.append(float(torch.log_softmax(logits, dim=-1)[token]))
    return values


def sequence_distribution(
    prompt: Sequence[int], max_tokens: int, adapt: Adapt | None = None
) -> dict[tuple[int, ...], float]:
    """Exact probability of every completion of at most `max_tokens` tokens (they sum to 1)."""
    return {
        sequence: math.exp(sum(step_logprobs(prompt, sequence, adapt)))
        for sequence in enumerate_sequences(max_tokens)
    }


def top_k_temperature(k: int, t: float) -> Adapt:
    """Reference adaptation, written out by hand: keep the k largest logits, divide by t."""

    def adapt(logits: torch.Tensor) -> torch.Tensor:
        kth = sorted(logits.tolist(), reverse=True)[k - 1]
        return torch.where(logits >= kth, logits / t, torch.tensor(-math.inf, dtype=logits.dtype))

    return adapt
