"""A prompt as request fields: which endpoint it goes to, with which fields, and the seeds of a
fan-out.

    "text", chat=False          -> ("completions",      {"prompt": "text"})
    "text", chat=True           -> ("chat/completions", {"messages": [{"role": "user", ...}]})
    [{"role": ..., ...}, ...]   -> ("chat/completions", {"messages": [...]})
    [token ids]                 -> ("completions",      {"prompt": [ids]})
    derived_seed(base, i)       =  blake2b("base:i") mod 2^31   (request i of a fan-out)
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence

from metagen.decoding.prompts import Prompt

SEED_BITS = 31  # llama.cpp takes uint32, some servers int32: stay below both


def derived_seed(base: int, index: int) -> int:
    """A seed for fan-out request `index`, a hash of (base, index) in [0, 2^31)."""
    digest = hashlib.blake2b(f"{base}:{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % (1 << SEED_BITS)


def prompt_request(prompt: Prompt, chat: bool) -> tuple[str, dict]:
    """(endpoint, prompt fields) for a prompt, or ValueError naming what is wrong with it."""
    if isinstance(prompt, (bytes, bytearray, memoryview)):
        raise ValueError("prompt is bytes: decode it to str first (e.g. prompt.decode('utf-8'))")
    if isinstance(prompt, str):
        if not prompt:
            raise ValueError("prompt is empty: give at least one character or token")
        if chat:
            return "chat/completions", {"messages": [{"role": "user", "content": prompt}]}
        return "completions", {"prompt": prompt}
    items = list(prompt) if isinstance(prompt, Sequence) else None
    if not items:
        raise ValueError(f"prompt {prompt!r} is empty or not a string, chat messages or token ids")
    if all(isinstance(item, Mapping) for item in items):
        return "chat/completions", {"messages": [dict(item) for item in items]}
    if all(isinstance(item, int) and not isinstance(item, bool) and item >= 0 for item in items):
        return "completions", {"prompt": items}
    raise ValueError("prompt mixes item types or has negative ids: a prompt is a string, a list of "
                     "chat messages, or a list of int token ids >= 0")
