"""The diversity term of diverse beam search (Vijayakumar et al. 2018, "Diverse Beam Search").

Beam search's B beams are split into G groups of B/G beams. The groups advance in turn, each
step: group g ranks its candidates y (a beam extended by one token, cumulative log-probability
log p(y)) by the augmented score

    log p(y) − λ · Δ(y, Y_t^0 … Y_t^{g−1})

where Y_t^h are the beams group h < g kept at this step t and Δ counts how often they repeat y:

    hamming:  Δ = #{earlier selections whose token at step t is y_t}          (the paper's choice)
    ngram n:  Δ = #{earlier selections whose last n tokens equal y's last n}   (n = 1 is hamming)

At step t < n the n-gram is the last t tokens (every beam of a step holds t tokens). The penalty
only reorders a group's candidates: hypotheses keep the model's own log-probability as score.

`StepSelections` holds the selections of one step, built afresh at the start of each step; its
`penalty` is the (rows, V) Δ of a group's beams. Cost: hamming O(V) per group (one count
vector shared by every row); ngram O(rows · V) per group and O(n) per selection.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

# The CLI's --diversity choices: this module imports torch where it computes, not on import.
DIVERSITY_KINDS = ("hamming", "ngram")


class StepSelections:
    """The tokens the earlier groups kept at one step, and the Δ they give a later group.

    kind: "hamming" or "ngram"; n: the n-gram length (ngram only); vocab_size: V.
    """

    def __init__(self, kind: str, n: int, vocab_size: int) -> None:
        if kind not in DIVERSITY_KINDS:
            raise ValueError(f"diversity={kind!r} is not one of {', '.join(DIVERSITY_KINDS)}")
        self.n = 1 if kind == "hamming" else n
        self.vocab_size = vocab_size
        self.counts: dict[tuple[int, ...], torch.Tensor] = {}  # (n−1)-gram before the token -> (V,) counts

    def _context(self, prefix: Sequence[int]) -> tuple[int, ...]:
        """The n−1 tokens (or fewer, early on) that precede a candidate's token."""
        return tuple(prefix[len(prefix) - self.n + 1:]) if self.n > 1 else ()

    def add(self, prefix: Sequence[int], token: int) -> None:
        """Record a kept beam: `prefix` (its tokens before this step) extended by `token`."""
        import torch

        context = self._context(prefix)
        if context not in self.counts:
            self.counts[context] = torch.zeros(self.vocab_size)
        self.counts[context][token] += 1

    def penalty(self, prefixes: Sequence[Sequence[int]]) -> torch.Tensor | None:
        """Δ of every candidate of the beams `prefixes`: (len(prefixes), V), None when nothing
        was selected yet (the first group, or no earlier group kept a beam)."""
        import torch

        if not self.counts:
            return None
        if self.n == 1:
            return self.counts[()].expand(len(prefixes), -1)
        zero = torch.zeros(self.vocab_size)
        return torch.stack([self.counts.get(self._context(prefix), zero) for prefix in prefixes])
