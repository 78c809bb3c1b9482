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

`TokenHealingProcessor` enforces it for B rows with the same interface as `StructuredProcessor`.
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

import numpy as np
import torch
from torch import Tensor

from metagen.sampling.processor import LogitsProcessor
from metagen.structured.bitmask import apply_token_bitmask, bool_to_bitmask
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


class TokenHealingProcessor(LogitsProcessor):
    """B rows whose first generated tokens must reproduce `removed_text` (see the module docstring)."""

    argmax_invariant = False

    def __init__(self, tokenizer: Tokenizer, removed_text: str, batch_size: int = 1) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size} must be >= 1")
        self.name = "token_healing"
        self.removed_text = removed_text
        self._target = removed_text.encode("utf-8")
        self._vocab = vocabulary(tokenizer)
        self._history: list[list[int]] = [[] for _ in range(batch_size)]  # bytes of r covered after each token

    @property
    def batch_size(self) -> int:
        return len(self._history)

    def _covered(self, row: int) -> int:
        history = self._history[row]
        return history[-1] if history else 0

    def allowed(self, row: int) -> Tensor | None:
        """Ids the row may take next (K,), or None when the row is free."""
        remaining = self._target[self._covered(row):]
        if not remaining:
            return None
        prefixes = torch.tensor(self._vocab.proper_prefixes(remaining), dtype=torch.long)
        return torch.cat([self._vocab.starting_with(remaining), prefixes])

    def fill_bitmask(self) -> Tensor:
        """The allowed tokens of every row as a bitmask (B, ceil(V / 32)) int32 (free rows: all ones)."""
        keep = np.ones((self.batch_size, self._vocab.size), dtype=bool)  # numpy: no torch dispatch per row
        for row in range(self.batch_size):
            ids = self.allowed(row)
            if ids is not None:
                keep[row] = False
                keep[row, ids.numpy()] = True
        return bool_to_bitmask(torch.from_numpy(keep))

    def apply(self, logits: Tensor) -> Tensor:
        """New logits (B, V) float32; rows still reproducing r keep only the allowed tokens."""
        if logits.dim() != 2 or logits.shape[0] != self.batch_size:
            raise ValueError(f"logits must be (B, V) with B = {self.batch_size}, got {tuple(logits.shape)}")
        if all(self.allows_stop(row) for row in range(self.batch_size)):  # every row reproduced r
            return logits.float().clone()
        mask = self.fill_bitmask()
        if logits.shape[1] > 32 * mask.shape[1]:  # ids past the tokenizer's vocabulary: free where the row is
            free = torch.tensor([self.allows_stop(row) for row in range(self.batch_size)])
            out = apply_token_bitmask(logits, mask)
            return torch.where(free.unsqueeze(1), logits.float(), out)
        return apply_token_bitmask(logits, mask)

    def accept(self, tokens: Tensor) -> None:
        """Advance each row by its token (B,) long (negative: skipped); ValueError for a forbidden one."""
        listed = tokens.tolist() if isinstance(tokens, Tensor) else list(tokens)
        if len(listed) != self.batch_size:
            raise ValueError(f"tokens must have one entry per row ({self.batch_size}), got {len(listed)}")
        for row, token in enumerate(int(token) for token in listed):
            if token >= 0:
                self._history[row].append(self._advance(row, token))

    def _advance(self, row: int, token: int) -> int:
        covered = self._covered(row)
        remaining = self._target[covered:]
        if not remaining:
            return covered
        data = self._vocab.table[token] if 0 <= token < self._vocab.size else None
        if data and data.startswith(remaining):
            return len(self._target)
        if data and remaining.startswith(data):
            return covered + len(data)
        raise ValueError(f"row {row}: token {token} ({data!r}) does not continue the healed prompt text "
                         f"{self.removed_text!r} (remaining {remaining!r})")

    def rollback(self, counts: Tensor) -> None:
        """Forget the last counts[b] accepted tokens of row b."""
        for row, count in enumerate(int(count) for count in (counts.tolist() if isinstance(counts, Tensor) else counts)):
            if count < 0 or count > len(self._history[row]):
                raise ValueError(f"rollback of {count} tokens in row {row}, which accepted {len(self._history[row])}")
            del self._history[row][len(self._history[row]) - count:]

    def select(self, indices: Tensor) -> None:
        """Rows become old rows indices[i]; repeats are copies (a fork)."""
        self._history = [list(self._history[index]) for index in _order(indices, self.batch_size)]

    def fork(self, indices: Tensor) -> TokenHealingProcessor:
        clone = object.__new__(TokenHealingProcessor)
        clone.__dict__.update(self.__dict__)
        clone._history = [list(self._history[index]) for index in _order(indices, self.batch_size)]
        return clone

    @classmethod
    def concat(cls, parts) -> TokenHealingProcessor:
        """One processor whose rows are copies of the rows of `parts` (same removed text), in order."""
        first = parts[0]
        if any(not isinstance(part, TokenHealingProcessor) or part.removed_text != first.removed_text for part in parts):
            raise ValueError("concat joins TokenHealingProcessors of one removed text only")
        clone = object.__new__(TokenHealingProcessor)
        clone.__dict__.update(first.__dict__)
        clone._history = [list(history) for part in parts for history in part._history]
        return clone

    def reset(self) -> None:
        self._history = [[] for _ in range(self.batch_size)]

    def allows_stop(self, row: int) -> bool:
        """EOS only once the removed text is reproduced."""
        return self._covered(row) == len(self._target)

    def forced(self, row: int) -> list[int]:
        """The single allowed token while r is incomplete, if there is exactly one; else []."""
        ids = self.allowed(row)
        return [int(ids[0])] if ids is not None and ids.numel() == 1 else []

    def finished(self, row: int) -> bool:
        return False  # healing never ends a row


def _order(indices: Tensor, batch_size: int) -> list[int]:
    order = indices.tolist() if isinstance(indices, Tensor) else [int(index) for index in indices]
    if not order or any(not 0 <= index < batch_size for index in order):
        raise ValueError(f"row indices {order} must be non-empty and in [0, {batch_size})")
    return order
