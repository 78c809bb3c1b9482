"""`SamplerChain`: the adapters chosen by a `SamplingParams`, applied in a fixed order.

A chain is itself a sampler (llama.cpp's design): it maps logits `(B, V)` to processed logits
with `process`, picks tokens with `choose`, and advances its state with `update`. Which adapters
are in the chain is decided once, in `from_params`; the per-token path is a loop over a tuple of
callables, with no reflection and no lookups.

Order (an adapter at its neutral value is left out):

    logit_bias -> repetition / frequency / presence penalties -> no_repeat_ngram
    -> temperature -> top_k -> top_p -> min_p -> typical -> epsilon -> eta   (or -> mirostat)

Why this order:
  * The bias and the penalties edit raw model scores: the OpenAI bias range [-100, 100] and the
    CTRL "divide positive logits" rule are defined on unscaled logits, so they come before
    temperature (vLLM and Hugging Face agree). vLLM's penalty order (repetition, then frequency,
    then presence) is kept; the bias goes first, as in vLLM, so a biased token is penalised too.
  * n-gram blocking is a hard ban (-inf); its position does not change the result, and it sits
    with the other history-based adapters.
  * Temperature comes before the truncations, so they cut the distribution that is actually
    sampled (vLLM and Hugging Face both apply top-k / top-p / min-p after temperature).
  * Truncations compose sequentially, each on the renormalised output of the previous one, in
    Hugging Face's warper order: top-k, top-p, min-p, typical, epsilon, eta. vLLM agrees on
    top-k before top-p (the order does not matter for min-p after top-k) but applies min-p
    before top-p; that differs when both are set, because top-p then measures its mass on the
    min-p-renormalised distribution. Here min-p only removes, from the nucleus, the tokens it
    would remove from the full distribution.
  * Mirostat (which excludes the truncations) comes last: it needs the final distribution.

With temperature 0 (greedy) the chain keeps bias, penalties and n-gram blocking, which change
the argmax, and drops temperature and truncations, which do not matter to an argmax (vLLM does
the same).

Invalid logits are reported before any adapter runs: `process` (and so `next_tokens`) checks its
input once with `check_choosable` (finite values and -inf are allowed; NaN, +inf and all -inf
rows raise ValueError naming the row and token), and `choose` checks what it chooses from. A
truncation would otherwise turn a NaN into -inf and sample anyway, or blame the truncation.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
from torch import Tensor

from ._common import float_logits
from ._tokens import PromptIds
from .epsilon import epsilon
from .eta import eta
from .logit_bias import bias_vector
from .min_p import min_p
from .mirostat import Mirostat
from .no_repeat_ngram import NoRepeatNgramState
from .params import SamplingParams
from .penalty_state import PenaltyState
from .sample import check_choosable, greedy, sample
from .temperature import temperature
from .top_k import top_k
from .top_p import top_p
from .typical import typical

Adapter = Callable[[Tensor], Tensor]


def _add_bias(logits: Tensor, bias: Tensor) -> Tensor:
    return logits.float() + bias  # (B, V) + (V,)


def _choose_greedy(logits: Tensor, generator: torch.Generator | None) -> Tensor:
    return greedy(logits)


class SamplerChain:
    """Adapters + token choice + their state for a batch of B rows (build with `from_params`).

    Attributes:
        params: the SamplingParams the chain was built from.
        names: the adapters in the order they run, e.g. ("penalties", "temperature", "top_p").
        penalties, ngrams, mirostat: the stateful parts, or None when not configured.
    """

    def __init__(
        self,
        params: SamplingParams,
        vocab_size: int,
        penalties: PenaltyState | None,
        ngrams: NoRepeatNgramState | None,
        mirostat: Mirostat | None,
        bias: Tensor | None,
    ) -> None:
        self.params = params
        self.vocab_size = vocab_size
        self.penalties = penalties
        self.ngrams = ngrams
        self.mirostat = mirostat
        self._bias = bias
        named = self._adapters()
        self.names: tuple[str, ...] = tuple(name for name, _ in named)
        self._steps: tuple[Adapter, ...] = tuple(step for _, step in named)
        self._stateful = tuple(s for s in (penalties, ngrams, mirostat) if s is not None)
        if params.greedy:
            self._choose: Callable[[Tensor, torch.Generator | None], Tensor] = _choose_greedy
        else:
            self._choose = sample

    @classmethod
    def from_params(
        cls,
        params: SamplingParams,
        batch_size: int,
        vocab_size: int,
        prompt_ids: PromptIds = None,
        device: torch.device | str | None = None,
    ) -> SamplerChain:
        """Build the chain and its state for B rows.

        Args:
            params: sampling parameters.
            batch_size: B, the number of rows decoded together.
            vocab_size: V; logit_bias ids must be < V.
            prompt_ids: the prompt(s) seen by the repetition penalty and n-gram blocking: None,
                one `(T,)` prompt for all rows (tensor or list), a `(B, T)` LongTensor with
                negative padding, or B lists of ints.
            device: device of the state; defaults to the prompt tensor's device, else CPU.
        """
        if device is None and isinstance(prompt_ids, Tensor):
            device = prompt_ids.device
        bias = bias_vector(params.logit_bias_map, vocab_size, device) if params.logit_bias else None
        penalties = None
        if (params.repetition_penalty != 1.0 or params.frequency_penalty != 0.0
                or params.presence_penalty != 0.0):
            penalties = PenaltyState.from_prompt(prompt_ids, batch_size, vocab_size, device)
        ngrams = None
        if params.no_repeat_ngram_size > 0:
            ngrams = NoRepeatNgramState.from_prompt(
                params.no_repeat_ngram_size, prompt_ids, batch_size, params.max_tokens, device
            )
        mirostat = None
        if params.mirostat_tau is not None:
            mirostat = Mirostat.create(batch_size, params.mirostat_tau, params.mirostat_eta, device)
        return cls(params, vocab_size, penalties, ngrams, mirostat, bias)

    def _adapters(self) -> list[tuple[str, Adapter]]:
        """(name, callable) of the active adapters, in chain order; built once."""
        params, steps = self.params, []
        if self._bias is not None:
            steps.append(("logit_bias", partial(_add_bias, bias=self._bias)))
        if self.penalties is not None:
            steps.append(("penalties", partial(
                self.penalties.apply,
                repetition_penalty=params.repetition_penalty,
                frequency_penalty=params.frequency_penalty,
                presence_penalty=params.presence_penalty,
            )))
        if self.ngrams is not None:
            steps.append(("no_repeat_ngram", self.ngrams.apply))
        if params.greedy:
            return steps
        if params.temperature != 1.0:
            steps.append(("temperature", partial(temperature, t=params.temperature)))
        if params.top_k > 0 and params.top_k < self.vocab_size:
            steps.append(("top_k", partial(top_k, k=params.top_k)))
        if params.top_p < 1.0:
            steps.append(("top_p", partial(top_p, p=params.top_p)))
        if params.min_p > 0.0:
            steps.append(("min_p", partial(min_p, p=params.min_p)))
        if params.typical_p < 1.0:
            steps.append(("typical", partial(typical, mass=params.typical_p)))
        if params.epsilon_cutoff > 0.0:
            steps.append(("epsilon", partial(epsilon, eps=params.epsilon_cutoff)))
        if params.eta_cutoff > 0.0:
            steps.append(("eta", partial(eta, eta=params.eta_cutoff)))
        if self.mirostat is not None:
            steps.append(("mirostat", self.mirostat.process))
        return steps

    @property
    def stateful(self) -> bool:
        """True when the chain keeps per-row state (penalties, n-gram blocking, mirostat)."""
        return bool(self._stateful)

    @property
    def batch_size(self) -> int:
        for state in self._stateful:
            return state.batch_size
        return -1  # stateless chains work for any number of rows

    def process(self, logits: Tensor) -> Tensor:
        """Apply the adapters to `logits (B, V)`; returns new float32 logits (input untouched).

        Raises ValueError for NaN, +inf or an all -inf row, before any adapter runs.
        """
        processed = float_logits(logits)
        check_choosable(processed)
        for step in self._steps:
            processed = step(processed)
        return processed.clone() if processed is logits else processed

    __call__ = process

    def choose(self, logits: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """Tokens `(B,)` from processed logits: argmax when greedy, else a draw with `generator`.

        Raises ValueError for NaN, +inf or an all -inf row (`check_choosable`).
        """
        return self._choose(logits, generator)

    def update(self, tokens: Tensor) -> None:
        """Advance penalty, n-gram and mirostat state with the chosen `tokens (B,)` (negative
        entries mark finished rows: counted nowhere, mirostat's mu unchanged)."""
        for state in self._stateful:
            state.update(tokens)

    def next_tokens(self, logits: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """One decoding step: `process`, `choose`, `update`; returns tokens `(B,)`."""
        tokens = self._choose(self.process(logits), generator)
        for state in self._stateful:
            state.update(tokens)
        return tokens

    def select(self, indices: Tensor) -> None:
        """Reorder / duplicate / drop rows' state in place to follow a KV-cache reorder:
        row i becomes old row `indices[i]` (`indices (B',)` LongTensor)."""
        for state in self._stateful:
            state.select(indices)

    def fork(self, indices: Tensor) -> SamplerChain:
        """A new chain whose state is rows `indices (B',)` of this one; this chain is unchanged."""
        return SamplerChain(
            self.params,
            self.vocab_size,
            self.penalties.fork(indices) if self.penalties is not None else None,
            self.ngrams.fork(indices) if self.ngrams is not None else None,
            self.mirostat.fork(indices) if self.mirostat is not None else None,
            self._bias,
        )
