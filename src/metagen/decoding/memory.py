"""A bound on batch sizes: refuse a batch that cannot fit in memory before it is allocated.

Per row a decoding loop holds
- a few float32 (positions, V) logit tensors at once — the raw logits, the adapted ones, their
  log-softmax and the sampling adapters' sorted copies: LOGIT_COPIES · positions · V · 4 bytes;
- the keys and values of its new tokens (the prompt's are shared): new_tokens · 2 · L · KVH · D
  · 4 bytes in a float32 cache (2 in bf16, 1 plus a 4-byte scale per head in int8: the model's
  `kv_bytes_per_token`, part of the `LanguageModel` interface; a model that cannot say refuses
  the check).
With companion models (a logits combiner's, `decoding.combine`), each adds its own cache bytes
per token and COMPANION_LOGIT_COPIES more logit tensors (its logits and their log-softmax).
A batch that cannot fit would otherwise start allocating (n = 100,000 rows over a 49,152-token
vocabulary asks for ~20 GB per logits copy) and fail late or drive the machine into swap.
"""

from __future__ import annotations

import os

LOGIT_COPIES = 6
COMPANION_LOGIT_COPIES = 2


def available_memory() -> int | None:
    """Bytes the kernel says can be allocated without swapping (Linux MemAvailable), else None."""
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def check_batch_fits(model, rows: int, new_tokens: int, positions: int = 1, *, what: str = "n") -> None:
    """ValueError naming `what` when `rows` rows of `new_tokens` tokens (scored `positions` at a
    time) cannot fit in the memory available now. `model`: one model, or a list of models run on
    the same rows (the main model first, then its companions): their cache bytes per token add
    up. A model whose `kv_bytes_per_token` cannot say raises its error here, whatever the memory
    available."""
    models = list(model) if isinstance(model, (list, tuple)) else [model]
    cache_per_token = sum(each.kv_bytes_per_token for each in models)
    available = available_memory()
    if available is None:
        return
    logits = (LOGIT_COPIES + COMPANION_LOGIT_COPIES * (len(models) - 1)) * positions * models[0].vocab_size * 4
    per_row = logits + new_tokens * cache_per_token
    if rows * per_row > available:
        raise ValueError(
            f"{what}={rows} is too large for this machine: {rows} rows need about {rows * per_row / 2**30:.1f} GiB "
            f"({logits / 2**20:.1f} MiB of logits and {(per_row - logits) / 2**20:.1f} MiB of cache for "
            f"{new_tokens} new tokens per row{_of_models(models)}), {available / 2**30:.1f} GiB is available: "
            f"use {what} <= {max(1, available // per_row)} or fewer new tokens"
        )


def _of_models(models: list) -> str:
    """", in the caches of models 'a' and 'b'" (or 'a', 'b' and 'c') for several models, "" for one."""
    if len(models) == 1:
        return ""
    names = [repr(getattr(m, "name", "") or type(m).__name__) for m in models]
    return ", in the caches of models " + ", ".join(names[:-1]) + " and " + names[-1]
