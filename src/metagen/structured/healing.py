"""Token healing: back up a prompt that ends mid-token and let the model pick the whole token.

A prompt such as "The url is http:" tokenizes as [... " http", ":"], but text continuing it
("://") is one token, "://": the model has rarely seen ":" alone before "//", so it continues
badly. Token healing (Lundberg, guidance, 2023) removes the trailing token(s) from the prompt and
constrains the first generated token(s) to reproduce the removed text r:

    heal_prompt: the largest k <= max_backup such that the bytes of the last k tokens are a
                 proper prefix of some vocabulary token (scanning k = 1, 2, ... while they are);
                 shorter prompt = ids[:-k], r = their text
    constraint:  with g the bytes generated so far (a prefix of r), the next token t is allowed iff
                 t starts with r[len(g):]  (it completes r, and may go on), or
                 t is a non-empty proper prefix of r[len(g):]  (more constrained tokens follow)
                 once r is reproduced the row is free

`metagen.sampling.token_healing.TokenHealingProcessor` enforces it for B rows, a processor like
`StructuredProcessor`.
The mask is a range lookup in the vocabulary sorted by bytes (tokens starting with the remaining
text are contiguous there) plus a dictionary lookup for each prefix of it: O(|r| + log V) per
row, then one pass to write the bitmask. Special tokens never heal a prompt and are never allowed
while r is incomplete (EOS neither: the prompt's text comes first).

Chat prompts: the template's own tail is healed like any text, e.g. the "\n" after
"<|im_start|>assistant" (tokens such as "\n\n" extend it), so the model may open its answer with
a blank line; special tokens themselves are never backed up.

Measured on the embedded model, greedy: "The url is http:" continues "8080/example.com" as
tokenized, and "://www.example.com/api" healed; "def hello_wor" continues "l\n" and "world_".

With a structured constraint, build the `StructuredProcessor` with `prefix=r`: its grammar is then
r followed by the constrained text, and the two processors compose (the allowed sets intersect;
the structured one is the smaller). The text the row generates starts with r, which belonged to
the prompt: `strip_healed_prefix` removes it from the output.
"""

from __future__ import annotations

import bisect
import weakref
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from metagen.structured.engine import token_bytes

if TYPE_CHECKING:
    from collections.abc import Sequence

    from metagen.models.tokenizer import Tokenizer

DEFAULT_MAX_BACKUP = 3
_VOCABULARIES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class _Vocabulary:
    """A tokenizer's non-special tokens sorted by bytes, and a bytes -> ids index."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        table = token_bytes(tokenizer)
        pairs = sorted((data, token_id) for token_id, data in enumerate(table) if data)
        self.table = table
        self.keys = [data for data, _ in pairs]
        self.ids = torch.tensor([token_id for _, token_id in pairs], dtype=torch.long)  # (N,)
        self.by_bytes: dict[bytes, list[int]] = {}
        for data, token_id in pairs:
            self.by_bytes.setdefault(data, []).append(token_id)
        self.size = len(table)

    def starting_with(self, text: bytes) -> Tensor:
        """Ids of the tokens whose bytes start with `text` (K,)."""
        low = bisect.bisect_left(self.keys, text)
        high = bisect.bisect_left(self.keys, text + b"\xff" * 8, lo=low)  # no token byte string goes past this
        while high < len(self.keys) and self.keys[high].startswith(text):
            high += 1
        return self.ids[low:high]

    def extends(self, text: bytes) -> bool:
        """True when some token's bytes start with `text` and are longer."""
        low = bisect.bisect_right(self.keys, text)
        return low < len(self.keys) and self.keys[low].startswith(text)

    def proper_prefixes(self, text: bytes) -> list[int]:
        """Ids of the tokens whose bytes are a non-empty proper prefix of `text`."""
        return [token_id for end in range(1, len(text)) for token_id in self.by_bytes.get(text[:end], ())]


def vocabulary(tokenizer: Tokenizer) -> _Vocabulary:
    cached = _VOCABULARIES.get(tokenizer)
    if cached is None:
        cached = _VOCABULARIES[tokenizer] = _Vocabulary(tokenizer)
    return cached


def heal_prompt(tokenizer: Tokenizer, ids: Sequence[int], max_backup: int = DEFAULT_MAX_BACKUP) -> tuple[list[int], str]:
    """(prompt ids without the healed tail, the removed text); (ids, "") when nothing heals.

    Never removes a special token, nor the whole prompt (the model needs a token to start from),
    nor a tail whose bytes are not whole UTF-8 characters.
    """
    ids = [int(token_id) for token_id in ids]
    vocab = vocabulary(tokenizer)
    best = 0
    removed = b""
    for k in range(1, min(max_backup, len(ids) - 1) + 1):
        data = vocab.table[ids[-k]] if 0 <= ids[-k] < vocab.size else None
        if data is None:  # a special token (or an id outside the vocabulary)
            break
        removed = data + removed
        if not vocab.extends(removed):
            break
        if _is_text(removed):
            best = k
    if best == 0:
        return ids, ""
    return ids[:-best], b"".join(vocab.table[token_id] for token_id in ids[-best:]).decode("utf-8")


def strip_healed_prefix(text: str, removed_text: str) -> str:
    """The generated text without the healed prefix (which belonged to the prompt)."""
    if not text.startswith(removed_text):
        raise ValueError(f"the generated text {text[:40]!r} does not start with the healed prefix {removed_text!r}")
    return text[len(removed_text):]


def _is_text(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True
