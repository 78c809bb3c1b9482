"""The `LanguageModel` interface every token-level algorithm runs on."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from metagen.models import checks

LogitsMode = Literal["last", "all", "none"]


@dataclass
class ForwardOutput:
    """What one forward returns.

    logits: (B, V) float32 for `logits="last"` (each row's last new token), (B, T, V) for
        `logits="all"` (T = the most new tokens in any row; row b's positions past
        `num_new[b]` are padding), None for `"none"`.
    hidden: final hidden states after the last norm at the same positions, float32, when asked.
    num_new: new tokens per row in this call.
    """

    logits: torch.Tensor | None
    hidden: torch.Tensor | None
    num_new: list[int]


class LanguageModel(ABC):
    """A causal LM that extends cached rows with new tokens and returns next-token logits.

    The cache (`new_cache()`) holds any number of rows of different lengths; `forward` appends
    `tokens[b]` (one or more) to row b for every row at once. Rows are forked, reordered and
    dropped with `cache.select(indices)` / `cache.fork(row, n)` and rolled back with
    `cache.truncate(row, length)` — none of which recompute or copy cached keys and values.
    """

    name: str
    tokenizer: object  # metagen.models.tokenizer.Tokenizer
    # new_cache() makes a paged `models.cache.KVCache`, whose slots rows and snapshots can share
    # (`share`, `release`, `pools`): what the serving engine's prefix cache needs.
    paged_cache: bool = False

    @property
    @abstractmethod
    def vocab_size(self) -> int: ...

    @property
    @abstractmethod
    def max_context(self) -> int: ...

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return frozenset(self.tokenizer.eos_token_ids)

    @abstractmethod
    def new_cache(self, batch_size: int = 1):
        """An empty cache with `batch_size` rows (an int >= 0; TypeError / ValueError otherwise)."""

    @abstractmethod
    def forward(
        self,
        cache,
        tokens: Sequence[Sequence[int]] | torch.Tensor,
        *,
        logits: LogitsMode = "last",
        hidden: bool = False,
    ) -> ForwardOutput:
        """Append `tokens` (one sequence per cache row, each non-empty) and return logits.

        tokens: (B, T) LongTensor or B lists of ids (ragged allowed).
        """

    def flops_per_token(self, context_length: int) -> float:
        """Estimated forward FLOPs for one token attending to `context_length` keys."""
        raise NotImplementedError(f"{type(self).__name__} does not estimate FLOPs")

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes one cached token's keys and values take in this model's caches: what the memory
        checks (`decoding.memory.check_batch_fits`, the serving engine's prefix cache budget)
        count per token. Every model must say (0 only where its cache holds no per-token
        tensors); one that does not refuses the memory check with NotImplementedError."""
        name = getattr(self, "name", "") or type(self).__name__
        raise NotImplementedError(
            f"model {name!r} ({type(self).__name__}) does not say how many bytes one cached token takes "
            f"(LanguageModel.kv_bytes_per_token), so the memory check cannot run")

    def prefill(self, token_ids: Sequence[int], batch_size: int = 1, **kwargs) -> tuple[object, ForwardOutput]:
        """New cache holding `token_ids` once, forked into `batch_size` (an int >= 1) rows, and its
        output."""
        batch_size = checks.bounded("batch_size", batch_size, 1)
        cache = self.new_cache(1)
        return fork_rows(cache, self.forward(cache, [list(token_ids)], **kwargs), batch_size)


def fork_rows(cache, out: ForwardOutput, batch_size: int) -> tuple[object, ForwardOutput]:
    """A one-row cache and the output of its forward, forked into `batch_size` rows (the cache's
    rows share the prefix; the output's rows are copies, written independently later)."""
    if batch_size > 1:
        cache.select([0] * batch_size)
        out = ForwardOutput(_repeat_rows(out.logits, batch_size), _repeat_rows(out.hidden, batch_size),
                            out.num_new * batch_size)
    return cache, out


def _repeat_rows(tensor: torch.Tensor | None, batch_size: int) -> torch.Tensor | None:
    """(1, ...) -> (batch_size, ...) copies (rows are later written independently)."""
    return None if tensor is None else tensor.expand(batch_size, *tensor.shape[1:]).contiguous()
