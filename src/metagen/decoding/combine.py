"""Logits combiners: next-token scores made from several models' logits at one step.

A `LogitsCombiner` names its `companions` (models run next to the main model on the same rows,
`RowBatch(companions=)`) and turns the step's logits — the main model's first, then each
companion's, every one `(B, V)` — into the scores `(B, V)` the sampler chain processes:

    scores = combiner.combine([main_logits, *companion_logits])   # (B, V)
    tokens = chain.choose(chain.process(scores), generator)

Contrastive decoding (Li et al. 2023) is one: the main model is the expert, its one companion
the amateur, and the scores are `sampling.contrastive` (log p_exp − log p_ama on the
α-plausible set). DExperts (Liu et al. 2021, p_base · (p_expert / p_anti)^α) is another of the
same shape: two companions and a sum of log-softmaxes.

Every model of a step must share one tokenizer (`check_same_vocabulary`): the combiner adds
and subtracts scores of the same token id.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from torch import Tensor

from metagen.sampling import contrastive


@runtime_checkable
class LogitsCombiner(Protocol):
    """Scores `(B, V)` from the logits of the main model and its companions at one step."""

    @property
    def companions(self) -> tuple:
        """The models (`LanguageModel`s) run next to the main model, in the order `combine` gets them."""

    def combine(self, logits: Sequence[Tensor]) -> Tensor:
        """`logits[0]`: the main model's `(B, V)`; `logits[1 + i]`: companion i's `(B, V)`.
        Returns new `(B, V)` scores, usable as logits; the inputs are not modified."""


@dataclass(frozen=True)
class ContrastiveConfig:
    """Contrastive decoding (Li et al. 2023) as a `LogitsCombiner`: the main model is the expert.

    amateur: the smaller model (same tokenizer) whose preferences are subtracted.
    alpha: plausibility threshold in [0, 1]: only tokens with p_exp(v) ≥ α · max_u p_exp(u)
        can be chosen (the paper uses 0.1).
    amateur_temperature: τ > 0 dividing the amateur's logits before its softmax.
    """

    amateur: object
    alpha: float = 0.1
    amateur_temperature: float = 1.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.alpha <= 1.0:
            raise ValueError(f"alpha={self.alpha!r} is out of range: must be in [0, 1]")
        if not 0.0 < self.amateur_temperature < float("inf"):
            raise ValueError(f"amateur_temperature={self.amateur_temperature!r} is out of range: must be in (0, inf)")

    @property
    def companions(self) -> tuple:
        return (self.amateur,)

    def combine(self, logits: Sequence[Tensor]) -> Tensor:
        """`contrastive(expert, amateur, alpha, amateur_temperature)`: (B, V) → (B, V), O(B·V)."""
        expert, amateur = logits
        return contrastive(expert, amateur, self.alpha, self.amateur_temperature)


def model_label(model) -> str:
    """A model's name for messages: its `name`, else its class."""
    return getattr(model, "name", "") or type(model).__name__


def vocabulary_fingerprint(tokenizer, vocab_size: int) -> tuple:
    """The id → token spelling of every id below `vocab_size` (`convert_ids_to_tokens` when the
    tokenizer has it, else each id decoded alone): equal fingerprints mean the same token → id
    mapping. O(V)."""
    ids = list(range(vocab_size))
    if hasattr(tokenizer, "convert_ids_to_tokens"):
        return tuple(tokenizer.convert_ids_to_tokens(ids))
    return tuple(tokenizer.decode([i]) for i in ids)


def check_same_vocabulary(main, companion) -> None:
    """ValueError naming both models unless `companion` has `main`'s vocabulary size and token
    → id mapping (the same tokenizer object is taken as is; else `vocabulary_fingerprint`)."""
    if companion.vocab_size != main.vocab_size:
        raise ValueError(f"companion model {model_label(companion)!r} has vocab_size={companion.vocab_size}, "
                         f"model {model_label(main)!r} has {main.vocab_size}: a combiner needs one tokenizer")
    if companion.tokenizer is main.tokenizer:
        return
    if vocabulary_fingerprint(companion.tokenizer, companion.vocab_size) != vocabulary_fingerprint(
            main.tokenizer, main.vocab_size):
        raise ValueError(f"companion model {model_label(companion)!r} maps tokens to ids differently from model "
                         f"{model_label(main)!r} (same vocab_size {main.vocab_size}): a combiner needs one tokenizer")
