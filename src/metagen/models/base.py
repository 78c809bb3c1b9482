"""The `LanguageModel` interface every token-level algorithm runs on, and the declared contracts
of what it hands out: `Cache` (every model's cache), `PagedCache` (a cache whose slots can be
shared and copied between caches), `DepthTruncatable` (a model whose first layers form a model)
and `EmbeddingInput` (a model fed input vectors in place of token ids).

A feature that needs a capability checks the declared type (`isinstance(cache, PagedCache)`) and
refuses by name what does not declare it; a class that declares one subclasses the protocol, and
`tests/models/test_contracts.py` checks it defines every member with the protocol's signature.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

import numpy as np
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


@runtime_checkable
class Cache(Protocol):
    """What every `LanguageModel.new_cache()` returns: rows of cached tokens, of any lengths,
    that loops fork, reorder, roll back and keep aside without running the model again.

    Arguments are checked before anything changes (`models.checks`): rows, lengths and counts are
    ints in range (TypeError / ValueError naming the argument), and a snapshot is accepted only by
    the cache that made it. Implementations: `models.cache.KVCache` (paged: moves slot ids),
    `models.transformers_adapter.TransformersCache` (copies K/V), `models.kgram.KGramCache`.
    """

    @property
    def batch_size(self) -> int:
        """Number of rows."""

    @property
    def lengths(self) -> list[int]:
        """Cached tokens per row, `(B,)` as a list."""

    def length(self, row: int) -> int:
        """Cached tokens of `row`."""

    def select(self, indices: Sequence[int]) -> None:
        """Rows become `[rows[i] for i in indices]` (repeats fork, omissions drop)."""

    def fork(self, row: int, n: int) -> list[int]:
        """Append `n` copies of `row`; returns their row numbers."""

    def truncate(self, row: int, length: int) -> None:
        """Keep the first `length` cached tokens of `row`."""

    def snapshot(self, row: int) -> object:
        """`row` kept outside the batch, until `release`."""

    def restore(self, snapshots: Sequence) -> None:
        """Rows become copies of `snapshots` (this cache's, live), in order; the snapshots stay valid."""

    def release(self, snapshot) -> None:
        """Give a snapshot's hold back (once)."""

    def reset(self, batch_size: int = 1) -> None:
        """Drop every row and start over with `batch_size` (an int >= 0) empty rows."""


@runtime_checkable
class PagedCache(Cache, Protocol):
    """A `Cache` whose rows are page tables of slots that rows, snapshots and other caches share:
    what the serving engine's prefix cache (`share`, `slots`, `released`), the prompt cache, the
    early-exit drafter's copy of the target's prompt (`copy_prefix`) and tree verification
    (`keep_path`) need.
    Implementation: `models.cache.KVCache` (what `DecoderModel.new_cache` makes)."""

    num_layers: int

    def slots(self, row: int) -> np.ndarray:
        """Slot ids of `row`'s cached tokens, `(length,)`."""

    def released(self, row: int) -> int:
        """How many of `row`'s oldest positions a sliding window released (0 without one)."""

    def share(self, slots: Sequence[int]) -> object:
        """A snapshot of slots in use, taking a reference to each (no K/V copy)."""

    def copy_prefix(self, source: PagedCache, source_row: int, length: int, row: int = 0) -> None:
        """Fill the empty `row` with the first `length` tokens of `source`'s `source_row` (this
        cache's layers from `source`'s first layers; same heads, head size and KV format)."""

    def keep_path(self, row: int, start: int, kept: Sequence[int]) -> None:
        """After a tree of m tokens was appended to `row` at [start, start + m) (`forward`'s
        `tree`), keep only the fed tokens `kept` (indices in [0, m), increasing: a root-to-node
        path, whose keys sit at positions start, start + 1, ...) and release the rest: the row
        becomes its first `start` tokens followed by the kept ones, length start + len(kept)."""


class LanguageModel(ABC):
    """A causal LM that extends cached rows with new tokens and returns next-token logits.

    The cache (`new_cache()`, a `Cache`) holds any number of rows of different lengths; `forward`
    appends `tokens[b]` (one or more) to row b for every row at once. Rows are forked, reordered and
    dropped with `cache.select(indices)` / `cache.fork(row, n)` and rolled back with
    `cache.truncate(row, length)` — none of which recompute the cached keys and values. A model
    whose caches are `PagedCache`s says so in `new_cache`'s return type (`DecoderModel`).

    source: the file or directory the weights were loaded from; "" when the model was not loaded
        from a file (built in memory), which is what features that reload the model refuse.
    kv_dtype: the element format of the caches `new_cache` makes (a `models.cache.KV_DTYPES`
        name); None when the model has no such choice (the default format is then used).
    """

    name: str = ""
    tokenizer: object  # metagen.models.tokenizer.Tokenizer
    source: str = ""
    kv_dtype: str | None = None
    activations: str | None = None

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
    def new_cache(self, batch_size: int = 1) -> Cache:
        """An empty cache with `batch_size` rows (an int >= 0; TypeError / ValueError otherwise)."""

    @abstractmethod
    def forward(
        self,
        cache: Cache,
        tokens: Sequence[Sequence[int]] | torch.Tensor,
        *,
        logits: LogitsMode = "last",
        hidden: bool = False,
        tree: Sequence[Sequence[int] | None] | None = None,
    ) -> ForwardOutput:
        """Append `tokens` (one sequence per cache row, each non-empty) and return logits.

        tokens: (B, T) LongTensor or B lists of ids (ragged allowed).
        tree: None (every row a chain, as always), or per row None (a chain) or that row's
            `parents` (m ints for its m fed tokens): parents[i] is the index of token i's parent
            among the row's fed tokens, in [0, i), or −1 for a child of the row's last cached
            token. Token i then sits at position L + depth(i) (L the row's cached length) and
            attends to the row's cached keys, its ancestors among the fed tokens and itself, so
            its logits are those of feeding its root-to-node chain alone (tree verification,
            SpecInfer). The fed tokens still take the row's next m cache entries in fed order;
            a `PagedCache`'s `keep_path` then keeps one root-to-node path. A bad tree (wrong length,
            a parent outside [-1, i)) is refused naming `tree[b]`; a model that cannot run
            trees refuses any tree by name (NotImplementedError).
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
        name = self.name or type(self).__name__
        raise NotImplementedError(
            f"model {name!r} ({type(self).__name__}) does not say how many bytes one cached token takes "
            f"(LanguageModel.kv_bytes_per_token), so the memory check cannot run")

    def prefill(self, token_ids: Sequence[int], batch_size: int = 1, **kwargs) -> tuple[Cache, ForwardOutput]:
        """New cache holding `token_ids` once, forked into `batch_size` (an int >= 1) rows, and its
        output."""
        batch_size = checks.bounded("batch_size", batch_size, 1)
        cache = self.new_cache(1)
        return fork_rows(cache, self.forward(cache, [list(token_ids)], **kwargs), batch_size)


def refuse_tree(model: LanguageModel, tree: object) -> None:
    """NotImplementedError naming `model` when a `forward` it cannot run with trees got one."""
    if tree is not None:
        name = model.name or type(model).__name__
        raise NotImplementedError(f"tree={type(tree).__name__}: model {name!r} ({type(model).__name__}) does not "
                                  f"run token trees in forward; feed each root-to-node path as its own row")


def fork_rows(cache: Cache, out: ForwardOutput, batch_size: int) -> tuple[Cache, ForwardOutput]:
    """A one-row cache and the output of its forward, forked into `batch_size` rows (the cache's
    rows share the prefix; the output's rows are copies, written independently later)."""
    if batch_size > 1:
        cache.select([0] * batch_size)
        out = ForwardOutput(_repeat_rows(out.logits, batch_size), _repeat_rows(out.hidden, batch_size),
                            out.num_new * batch_size)
    return cache, out


@runtime_checkable
class DepthTruncatable(Protocol):
    """A model whose first layers, with its final norm and LM head, form a model of their own
    sharing its weights (early exit; Kangaroo-style self-drafting). Implementation: `DecoderModel`."""

    def truncated(self, num_layers: int) -> LanguageModel:
        """The first `num_layers` layers (an int in [1, layers − 1]) as a model; its own caches."""


@runtime_checkable
class EmbeddingInput(Protocol):
    """A model that takes input vectors in place of token ids (superposed decoding feeds a
    weighted sum of embedding rows). Implementation: `DecoderModel`."""

    def input_embeddings(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows of the input embedding table for `ids`: `(*ids.shape, H)`."""

    def forward_embeddings(self, cache: Cache, embeddings: torch.Tensor, *, logits: LogitsMode = "last",
                           hidden: bool = False) -> ForwardOutput:
        """`forward` with `embeddings` (B, T, H) fed where token embeddings go; feeding
        `input_embeddings(ids)` equals feeding `ids` exactly."""


def _repeat_rows(tensor: torch.Tensor | None, batch_size: int) -> torch.Tensor | None:
    """(1, ...) -> (batch_size, ...) copies (rows are later written independently)."""
    return None if tensor is None else tensor.expand(batch_size, *tensor.shape[1:]).contiguous()
