"""Prompt log-probabilities (OpenAI's `echo` with `logprobs`), computed as the prompt's logits
arrive chunk by chunk and never held for the whole prompt.

For a prompt x_0 .. x_{T-1}, record t (t = 1 .. T-1) scores x_t under the logits z_{t-1} of
position t-1 (`token_records`: log p(x_t | x_<t) = z_{t-1}[x_t] - logsumexp(z_{t-1}), the top-k
of log_softmax(z_{t-1}) when asked); x_0 has none, and z_{T-1} predicts the first generated token.

A chunked prefill hands the logits of positions [a, a + C) as one `(C, V)` tensor. The scorer
keeps only the records (a few floats per token, what the response returns) and a copy of the
chunk's last row `(V,)`, which scores the next chunk's first token; each chunk is scored
`SCORE_ROWS` positions at a time. Memory: O(SCORE_ROWS · V) floats beside the caller's chunk,
independent of T (a whole-prompt `(T, V)` float32 tensor is 4·T·V bytes: ~200 KB per token at
V = 49,152). Time: O(T · V), one log-softmax per position, as a whole-prompt call.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from metagen.decoding.records import TokenRecord, token_records

SCORE_ROWS = 64  # positions per log-softmax: bounds the (rows, V) temporaries


class PromptScorer:
    """Records of prompt tokens 1 .. T-1 from the prompt's logits, fed in order by `add`.

    records: `records[t - 1]` is the `TokenRecord` of prompt token t (greedy-style: sampled 0).
    """

    def __init__(self, prompt_ids: Sequence[int], num_top: int = 0) -> None:
        self.prompt_ids = torch.tensor(list(prompt_ids), dtype=torch.long)  # (T,)
        self.num_top = num_top
        self.records: list[TokenRecord] = []
        self.positions = 0  # prompt positions whose logits were added
        self._last: Tensor | None = None  # (V,) logits of the last position added (a copy, not a view)

    def add(self, logits: Tensor) -> None:
        """Score the tokens the logits of the next C positions `(C, V)` predict (those inside
        the prompt). The caller may free `logits` afterwards: nothing here refers to it."""
        count, left = (logits.shape[0] if logits.dim() == 2 else 0), self.prompt_ids.shape[0] - self.positions
        if not 1 <= count <= left:
            raise ValueError(f"logits must be (C, V) with 1 <= C <= {left} (the prompt positions left), got "
                             f"{tuple(logits.shape)}")
        start = self.positions
        if self._last is not None:  # z_{start-1} scores x_start
            self._score(self._last[None], start)
        # logits[i] = z_{start+i} scores x_{start+i+1}: rows 0 .. C-2 (the last one waits for its token)
        for first in range(0, count - 1, SCORE_ROWS):
            self._score(logits[first:min(first + SCORE_ROWS, count - 1)], start + first + 1)
        self._last = logits[-1].clone()
        self.positions += count

    def _score(self, rows: Tensor, target: int) -> None:
        """Records of prompt tokens target .. target + R - 1 from `rows (R, V)`."""
        tokens = self.prompt_ids[target:target + rows.shape[0]]
        self.records += token_records(rows, tokens, None, self.num_top)
