"""Checks of arguments users hand to models and caches: integers, row lists, snapshots, text.

An integer argument (a row, a length, a count, a batch size) must be an int: a Python int or a
numpy / torch integer scalar (anything with `__index__`), never a bool or a float. `0.5` or
`True` as a row number is a bug upstream, and truncating it would hide it. Each check raises
TypeError for a wrong type and ValueError for a value out of range, naming the argument, its value
and what is allowed. They do integer work only (O(1) per integer, O(B) per row list, no tensor
reduction or host synchronisation), so every cache operation can afford them.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable

import numpy as np
import torch


def integer(name: str, value: object) -> int:
    """`value` as an int; TypeError for bools, floats and anything without `__index__`."""
    if isinstance(value, (bool, np.bool_)) or (isinstance(value, torch.Tensor) and value.dtype == torch.bool):
        raise TypeError(f"{name} must be an int, got the bool {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})") from None


def bounded(name: str, value: object, low: int, high: int | None = None) -> int:
    """An int in [low, high] (no upper bound when `high` is None)."""
    number = integer(name, value)
    if number < low or (high is not None and number > high):
        allowed = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ValueError(f"{name}={number} is out of range: must be {allowed}")
    return number


def row(name: str, value: object, batch_size: int) -> int:
    """A row number of a cache with `batch_size` rows: an int in [0, batch_size)."""
    number = integer(name, value)
    if not 0 <= number < batch_size:
        raise ValueError(f"{name}={number} is out of range: {_rows(batch_size)}")
    return number


def rows(name: str, values: Iterable[object], batch_size: int) -> np.ndarray:
    """Row numbers `(B',)` int64 from a flat sequence (list, tuple, integer array or tensor).

    O(B') integer checks; numpy arrays and CPU tensors are checked by dtype without a loop.
    """
    if isinstance(values, (np.ndarray, torch.Tensor)):
        array = np.asarray(values)
        if array.ndim != 1:
            raise ValueError(f"{name} must be a flat sequence of row numbers, got shape {array.shape}")
        if array.size and array.dtype.kind not in "iu":
            raise TypeError(f"{name} must hold ints, got dtype {values.dtype}")
        array = array.astype(np.int64, copy=False)
    elif isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise TypeError(f"{name} must be a sequence of row numbers, got {type(values).__name__}")
    else:
        array = np.array([integer(f"{name}[{i}]", value) for i, value in enumerate(values)], dtype=np.int64)
    outside = (array < 0) | (array >= batch_size)
    if outside.any():
        first = int(np.argmax(outside))
        raise ValueError(f"{name}[{first}]={int(array[first])} is out of range: {_rows(batch_size)}")
    return array


def increasing(name: str, values: object, high: int) -> np.ndarray:
    """Indices `(k,)` int64 from a flat sequence of ints in [0, high), strictly increasing (a
    root-to-node path of a fed tree, `KVCache.keep_path`). O(k)."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise TypeError(f"{name} must be a sequence of indices, got {type(values).__name__}")
    array = np.array([bounded(f"{name}[{i}]", value, 0, high - 1) for i, value in enumerate(values)],
                     dtype=np.int64)
    for i in np.nonzero(np.diff(array) <= 0)[0][:1] + 1:
        raise ValueError(f"{name}[{i}]={int(array[i])} is out of range: the indices must increase, so it must be "
                         f"> {name}[{i - 1}]={int(array[i - 1])}")
    return array


def snapshot(name: str, value: object, cache: object, kind: type) -> None:
    """`value` is a live snapshot (of type `kind`) made by `cache.snapshot()`.

    A snapshot refers to its own cache's storage (slot ids, copied keys and values); restored
    into another cache it would read the wrong keys and values, so that is refused.
    """
    if not isinstance(value, kind):
        raise TypeError(f"{name} must be a {kind.__name__} made by this cache's snapshot(), "
                        f"got {type(value).__name__}")
    if value.owner is not cache:
        raise ValueError(f"{name} was made by another cache: a snapshot can only be restored into or "
                         "released by the cache whose snapshot() made it")
    if value.released:
        raise ValueError(f"{name} was already released")


def snapshot_list(name: str, values: object, cache: object, kind: type) -> list:
    """A list of live snapshots of `cache` (a single snapshot is refused: pass `[snapshot]`)."""
    if isinstance(values, kind) or not isinstance(values, Iterable):
        raise TypeError(f"{name} must be a sequence of {kind.__name__}, got {type(values).__name__}"
                        + (": pass [snapshot]" if isinstance(values, kind) else ""))
    values = list(values)
    for index, value in enumerate(values):
        snapshot(f"{name}[{index}]", value, cache, kind)
    return values


def utf8_text(name: str, text: str) -> str:
    """`text` if UTF-8 can encode it; else ValueError naming its first lone surrogate.

    Lone surrogates (U+D800..U+DFFF) are what Python makes of bytes that are not UTF-8, e.g.
    `sys.argv` on Linux gives "\\udcff" for the byte 0xff; no tokenizer can encode them. O(len).
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise ValueError(
            f"{name} is not valid Unicode text: character {error.start} is the lone surrogate "
            f"{text[error.start]!r} (bytes that were not UTF-8?)"
        ) from None
    return text


def _rows(batch_size: int) -> str:
    return "the cache has no rows" if batch_size == 0 else f"the cache has rows 0..{batch_size - 1}"
