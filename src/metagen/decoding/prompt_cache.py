"""`PromptCache`: the last prompt's keys and values, kept between one generator's calls.

A strategy that samples one prompt in rounds (adaptive self-consistency draws a few samples,
checks its stopping rule, draws again) calls `generate` with the same prompt many times. Without a
cache every call computes the prompt again; with it, a call whose prompt token ids equal the last
one's copies the stored keys and values into its new cache and takes the stored next-token logits,
so the prompt is computed once per prompt rather than once per round (vLLM's automatic prefix
caching and SGLang's RadixAttention do this across requests; this is their one-entry form for a
local model).

    prefill(model, ids, n):  ids == stored ids → new cache, copy_prefix(stored, len(ids)),
                                                 fork into n rows, logits = stored (repeated)
                             else              → model.prefill(ids) into a 1-row cache kept as
                                                 the entry, copied into the batch's cache as above

The entry's cache is never decoded in (the batch decodes in its copy), so the stored keys and
values stay exactly the prompt's and the outputs are those of a fresh prefill, token for token.
A hit costs length · layers slot copies and no forward; its `Cost` counts the prompt as reused
(`RowBatch.prefill_cost`). Memory: one prompt's keys and values (`model.kv_bytes_per_token` per
token) for as long as the generator lives.

Only caches that can copy a prefix from another cache (a `PagedCache`, whose `copy_prefix` does:
metagen's own decoder models) take part; any other model is prefilled as usual and nothing is
kept. A sliding window takes part too: a prefill in one forward releases nothing (a windowed cache releases
positions when a row grows past them), so the stored prompt is whole, and the copy releases its
old positions as its rows grow, as a fresh prefill's cache would.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from metagen.models.base import ForwardOutput, PagedCache, fork_rows

__all__ = ["PromptCache"]


class PromptCache:
    """One prompt's cache and next-token logits, reused by the next prefill of the same token ids
    on the same model (see the module docstring). Safe to share between threads: an entry, once
    stored, is only read, and a miss replaces it whole."""

    def __init__(self) -> None:
        self._entry: tuple[object, tuple[int, ...], PagedCache, object] | None = None  # model, ids, cache, logits (1, V)
        self._lock = threading.Lock()  # guards the counters
        self.hits = 0
        self.misses = 0

    def clear(self) -> None:
        """Drop the stored prompt (its memory is freed with it)."""
        with self._lock:
            self._entry = None

    def prefill(self, model, prompt_ids: Sequence[int], batch_size: int) -> tuple[object, ForwardOutput, bool]:
        """`model.prefill(prompt_ids, batch_size)`, reusing the stored prompt when its ids and
        model are these; returns `(cache, out, reused)` with `out.logits (batch_size, V)`."""
        ids = tuple(prompt_ids)
        entry = self._entry
        if entry is not None and entry[0] is model and entry[1] == ids:
            with self._lock:
                self.hits += 1
            return *_copy(model, entry[2], entry[3], batch_size), True
        keeper, out = model.prefill(ids)
        with self._lock:
            self.misses += 1
        if not isinstance(keeper, PagedCache):  # nothing to copy from: use it as is
            return *fork_rows(keeper, out, batch_size), False
        logits = out.logits.clone()  # (1, V)
        self._entry = (model, ids, keeper, logits)
        return *_copy(model, keeper, logits, batch_size), False


def _copy(model, keeper: PagedCache, logits, batch_size: int) -> tuple[PagedCache, ForwardOutput]:
    """A new cache holding `keeper`'s one row, forked into `batch_size` rows, and the output of
    its prefill (`logits (1, V)`, no new tokens computed)."""
    cache = model.new_cache(1)
    cache.copy_prefix(keeper, 0, keeper.length(0))
    return fork_rows(cache, ForwardOutput(logits.clone(), None, [0]), batch_size)  # the rows' logits are theirs to change
