"""Logits combiners: next-token scores made from several models' logits at one step.

A `LogitsCombiner` names its `companions` (models run next to the main model on the same rows,
`RowBatch(companions=)`) and turns the step's logits — the main model's first, then each
companion's, every one `(B, V)` — into the scores `(B, V)` the sampler chain processes:

    scores = combiner.combine([main_logits, *companion_logits])   # (B, V)
    tokens = chain.choose(chain.process(scores), generator)

Contrastive decoding (Li et al. 2023) is one: the main model is the expert, its one companion
the amateur, and the scores are `sampling.contrastive` (log p_exp − log p_ama on the
α-plausible set; with `beta`, O'Brien & Lewis 2023's (1 + β)·s_exp − β·s_ama on the logits).
DExperts (Liu et al. 2021) and proxy tuning (Liu et al. 2024) are another (`DExpertsConfig`):
two companions and a sum of log-softmaxes.

A `SwitchingCombiner` (entropy-adaptive decoding, `decoding.entropy_adaptive`) instead picks,
row by row and step by step, which model's logits the row's token comes from; its companions
run only at the steps some row needs them (`RowBatch` syncs them lazily, `lazy_companions`).

Every model of a step must share one tokenizer (`check_same_vocabulary`): the combiner adds
and subtracts scores of the same token id.

A companion that is the main model itself (DExperts with the base as its own expert, the
contrast log p + α·(log p − log p_anti)) runs no forward and keeps no cache of its own: it takes
the main model's logits (`CompanionSlots`), so its work is not done, nor counted, twice.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch
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
    """Contrastive decoding as a `LogitsCombiner`: the main model is the expert. On the tokens
    with p_exp(v) ≥ α · max_u p_exp(u) (−inf elsewhere) the score is

        log p_exp(v) − log p_ama(v)              beta None: Li et al. 2023, "Contrastive Decoding:
                                                 Open-ended Text Generation as Optimization"
        (1 + β) · s_exp(v) − β · s_ama(v)        beta β ≥ 0, s the logits: O'Brien & Lewis 2023,
                                                 "Contrastive Decoding Improves Reasoning in
                                                 Large Language Models"

    amateur: the smaller model (same tokenizer) whose preferences are subtracted.
    alpha: plausibility threshold in [0, 1]: only tokens with p_exp(v) ≥ α · max_u p_exp(u)
        can be chosen (both papers use 0.1).
    amateur_temperature: τ > 0 dividing the amateur's logits (before its softmax).
    beta: None for Li et al.'s log-probability difference, or O'Brien & Lewis's weight β, a
        finite number ≥ 0 (0: the expert alone, masked; they use 0.5 for reasoning).
    """

    amateur: object
    alpha: float = 0.1
    amateur_temperature: float = 1.0
    beta: float | None = None

    def __post_init__(self) -> None:
        if not 0.0 <= self.alpha <= 1.0:
            raise ValueError(f"alpha={self.alpha!r} is out of range: must be in [0, 1]")
        if not 0.0 < self.amateur_temperature < float("inf"):
            raise ValueError(f"amateur_temperature={self.amateur_temperature!r} is out of range: must be in (0, inf)")
        if self.beta is not None and not 0.0 <= self.beta < float("inf"):
            raise ValueError(f"beta={self.beta!r} is out of range: must be None or a finite number >= 0")

    @property
    def companions(self) -> tuple:
        return (self.amateur,)

    def combine(self, logits: Sequence[Tensor]) -> Tensor:
        """`contrastive(expert, amateur, alpha, amateur_temperature, beta)`: (B, V) → (B, V), O(B·V)."""
        expert, amateur = logits
        return contrastive(expert, amateur, self.alpha, self.amateur_temperature, self.beta)


@dataclass(frozen=True)
class DExpertsConfig:
    """DExperts (Liu et al. 2021, "DExperts: Decoding-Time Controlled Text Generation with Experts
    and Anti-Experts") and proxy tuning (Liu et al. 2024, "Tuning Language Models by Proxy") as a
    `LogitsCombiner`: the main model is the base, steered by the difference of two companions,

        scores = log p_base + α · (log p_expert − log p_anti),   i.e.  p ∝ p_base · (p_expert / p_anti)^α

    (proxy tuning: the expert a tuned small model, the anti-expert its untuned base, α = 1).

    expert: the model (same tokenizer) whose preferences are added.
    anti_expert: the model (same tokenizer) whose preferences are subtracted.
    alpha: the steering strength α, a finite number ≥ 0 (0: the base alone).
    """

    expert: object
    anti_expert: object
    alpha: float = 1.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.alpha < float("inf"):
            raise ValueError(f"alpha={self.alpha!r} is out of range: must be a finite number >= 0 "
                             "(to steer the other way, swap expert and anti_expert)")

    @property
    def companions(self) -> tuple:
        return (self.expert, self.anti_expert)

    def combine(self, logits: Sequence[Tensor]) -> Tensor:
        """log_softmax(base) + α · (log_softmax(expert) − log_softmax(anti)), in float32:
        3 × (B, V) → (B, V), O(B·V). The log-softmaxes keep each model's normalisation out of
        the scores (softmax of the raw-logit sum is the same distribution)."""
        base, expert, anti = (torch.log_softmax(x.float(), dim=-1) for x in logits)
        return base + self.alpha * (expert - anti)


@runtime_checkable
class ModelSwitch(Protocol):
    """One request's state of a `SwitchingCombiner`: which rows take the companions' logits.
    Its per-row state follows the cache's rows (`select`)."""

    tokens: dict
    """Tokens each model gave so far (summed over rows), by role name."""

    def decide(self, logits: Tensor) -> Tensor:
        """Given the main model's logits `(B, V)` of this step, the rows `(B,)` bool whose token
        this step comes from the companions; records the step."""

    def combine(self, logits: Sequence[Tensor | None], use: Tensor) -> Tensor:
        """Scores `(B, V)`: `logits[0]` the main model's, `logits[1 + i]` companion i's (None when
        no row used them this step), `use` the `decide` of this step."""

    def select(self, indices: Sequence[int]) -> None:
        """Rows become `[rows[i] for i in indices]` (repeats fork)."""


@runtime_checkable
class SwitchingCombiner(Protocol):
    """A combiner that runs its companions only at the steps some row needs them."""

    @property
    def companions(self) -> tuple:
        """The models run, when needed, next to the main model."""

    def start(self, rows: int) -> ModelSwitch:
        """A fresh `ModelSwitch` for a request of `rows` rows."""


class CompanionSlots:
    """Which of a combiner's companions run a forward of their own (`running`: every companion
    that is not the main `model` object itself) and how the step's logits are put back in the
    order `combine` takes them (`full`): a companion that is the main model takes the main
    logits. Computing them again would give the same tensor at the cost of a second forward, a
    second cache and a second memory check of the same rows."""

    def __init__(self, model, companions: Sequence) -> None:
        self.is_main = tuple(companion is model for companion in companions)
        self.running = tuple(companion for companion in companions if companion is not model)

    def full(self, main: Tensor, running_logits: Sequence) -> list:
        """`[main, *companion logits]` in the combiner's order, from the running companions'
        logits (in `running`'s order; entries may be None, as a switch leaves them)."""
        given = iter(running_logits)
        return [main, *(main if is_main else next(given) for is_main in self.is_main)]


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
