"""Sizes in bytes as people write them: "256MiB", "1.5GB", "0" (parse_size) and back (format_size)."""

from __future__ import annotations

import re

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)?\s*$", re.IGNORECASE)
_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_size(text: str, name: str = "--cache-memory") -> int:
    """Bytes in `text`: a number with an optional unit, B, KB/MB/GB/TB (powers of 1000) or
    KiB/MiB/GiB/TiB (powers of 1024), e.g. "256MiB", "1.5GB", "0"; ValueError naming `name`."""
    found = _SIZE.match(str(text))
    if not found:
        raise ValueError(f"{name} {text!r} is not a size: write a number of bytes with an optional unit "
                         "B, KB, MB, GB, TB, KiB, MiB, GiB or TiB (e.g. 256MiB, 0 to disable)")
    number, unit = found.groups()
    return int(float(number) * _UNITS[(unit or "b").lower()])


def format_size(size: int) -> str:
    """`size` bytes in the largest decimal unit that keeps at least 1: "155.2 MB", "2.0 GB", "512 B"."""
    for unit, scale in (("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} B"
