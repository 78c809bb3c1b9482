"""`SamplerChain`: an ordered list of `LogitsProcessor`s plus the token choice.

A chain is itself a sampler (llama.cpp's design): it maps logits `(B, V)` to processed logits
with `process`, picks tokens with `choose`, and advances its processors with `accept`; `rollback`, `select`, `fork`, `concat` and `reset` pass through to every processor,
so a loop calls them wherever it touches its KV cache (see `metagen.sampling.processor`). Which
processors are in the chain is decided once; the per-token path is a loop over a tuple, with no
reflection and no lookups.

`from_params` builds the chain of a `SamplingParams` in this order (an adapter at its neutral
value is left out):

    masks -> logit_bias -> repetition / frequency / presence penalties -> no_repeat_ngram
    -> temperature -> top_k -> top_p -> min_p -> typical -> epsilon -> eta   (or -> mirostat)

and, under greedy decoding only, momentum decoding last (`momentum`: it ranks the model's
confidence after every edit above, and its output is a score to take the argmax of, not logits).

`masks` are extra processors given by the caller (a constraint on the output's structure). They
come first: a mask says which tokens may be generated at all, so every later step works on the
allowed set only — the truncations measure their mass among allowed tokens and can never leave
a row with nothing allowed, and the penalties and temperature leave -inf at -inf.

Why the rest of this order:
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
the same). A chain built directly with `greedy=True` likewise skips its stateless processors
that declare `argmax_invariant`.

Invalid logits are reported before any adapter runs: `process` (and so `next_tokens`) checks its
input once with `check_choosable` (finite values and -inf are allowed; NaN, +inf and all -inf
rows raise ValueError naming the row and token). A truncation would otherwise turn a NaN into
-inf and sample anyway, or blame the truncation. That is the one full check of a decoding step
(the model does not check its logits): `choose` looks only at the B values it chose (`draw`,
`argmax`) and runs `check_choosable` only when one of them is bad, for its message.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial

import torch
from torch import Tensor

from ._common import float_logits
from ._tokens import PromptIds
from .epsilon import epsilon
from .eta import eta
from .logit_bias import LogitBias, bias_vector
from .min_p import min_p
from .mirostat import Mirostat
from .momentum import MomentumState
from .no_repeat_ngram import NoRepeatNgramState
from .params import SamplingParams
from .penalty_state import PenaltyState
from .processor import NO_OPINION, LogitsProcessor, StatelessProcessor, StopVerdict, overrides_stop_hooks
from .sample import EmptiedRowError, argmax, check_choosable, draw
from .temperature import temperature
from .top_k import top_k
from .top_p import top_p
from .typical import typical

# processor name -> the SamplingParams field that asked for it
_FIELDS = {"structured": "structured_outputs", "no_repeat_ngram": "no_repeat_ngram_size", "penalties": "penalties",
           "mirostat": "mirostat_tau", "momentum": "momentum_ngram"}


def _choose_greedy(logits: Tensor, generator: torch.Generator | None) -> tuple[Tensor, Tensor]:
    return argmax(logits)


class SamplerChain:
    """Processors + token choice for a batch of B rows (usually built with `from_params`).

    Attributes:
        processors: every processor, in the order they run.
        names: the processors that `process` runs, e.g. ("penalties", "temperature", "top_p").
        greedy: choose the argmax instead of sampling.
        params: the SamplingParams the chain was built from (None when built directly).
    """

    def __init__(
        self,
        processors: Sequence[LogitsProcessor] = (),
        *,
        greedy: bool = False,
        params: SamplingParams | None = None,
    ) -> None:
        for processor in processors:
            if not isinstance(processor, LogitsProcessor):
                raise TypeError(f"a chain holds LogitsProcessors, got {type(processor).__name__}")
        self.processors: tuple[LogitsProcessor, ...] = tuple(processors)
        self.greedy = greedy
        self.params = params
        # Greedy: a stateless processor that cannot move the argmax need not run.
        self._active = tuple(p for p in self.processors
                             if not (greedy and p.argmax_invariant and p.stateless))
        self.names: tuple[str, ...] = tuple(p.name for p in self._active)
        self._stateful = tuple(p for p in self.processors if not p.stateless)
        self._judges = tuple(p for p in self.processors if overrides_stop_hooks(p))
        self._choose: Callable[[Tensor, torch.Generator | None], tuple[Tensor, Tensor]] = (
            _choose_greedy if greedy else draw)

    @classmethod
    def from_params(
        cls,
        params: SamplingParams,
        batch_size: int,
        vocab_size: int,
        prompt_ids: PromptIds = None,
        device: torch.device | str | None = None,
        *,
        masks: Sequence[LogitsProcessor] = (),
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
            masks: processors run first (constraints), each with the state after the prompt of
                one row (forked into the B rows) or of B rows (copied); the given objects are
                never changed.
        """
        if device is None and isinstance(prompt_ids, Tensor):
            device = prompt_ids.device
        processors = [_rows_of(mask, batch_size) for mask in masks]
        if params.logit_bias:
            processors.append(LogitBias(bias_vector(params.logit_bias_map, vocab_size, device)))
        if (params.repetition_penalty != 1.0 or params.frequency_penalty != 0.0
                or params.presence_penalty != 0.0):
            processors.append(PenaltyState.from_prompt(
                prompt_ids, batch_size, vocab_size, device, repetition_penalty=params.repetition_penalty,
                frequency_penalty=params.frequency_penalty, presence_penalty=params.presence_penalty))
        if params.no_repeat_ngram_size > 0:
            processors.append(NoRepeatNgramState.from_prompt(
                params.no_repeat_ngram_size, prompt_ids, batch_size, params.max_tokens, device))
        if params.momentum_ngram > 0:  # SamplingParams allows it with temperature 0 only
            processors.append(MomentumState.from_prompt(
                prompt_ids, batch_size, params.momentum_ngram, params.momentum_resistance,
                params.momentum_candidates, params.max_tokens, device))
        if not params.greedy:
            processors += _sampling_adapters(params, vocab_size)
            if params.mirostat_tau is not None:
                processors.append(Mirostat.create(batch_size, params.mirostat_tau, params.mirostat_eta, device,
                                                  version=params.mirostat_mode))
        return cls(processors, greedy=params.greedy, params=params)

    # ------------------------------------------------------------------ the stateful parts

    def _find(self, kind: type) -> LogitsProcessor | None:
        return next((p for p in self.processors if isinstance(p, kind)), None)

    @property
    def penalties(self) -> PenaltyState | None:
        return self._find(PenaltyState)

    @property
    def ngrams(self) -> NoRepeatNgramState | None:
        return self._find(NoRepeatNgramState)

    @property
    def mirostat(self) -> Mirostat | None:
        return self._find(Mirostat)

    @property
    def momentum(self) -> MomentumState | None:
        return self._find(MomentumState)

    @property
    def stateful(self) -> bool:
        """True when some processor keeps per-row state (penalties, n-gram blocking, momentum,
        mirostat, a constraint)."""
        return bool(self._stateful)

    @property
    def batch_size(self) -> int | None:
        """Rows of state B; None for a chain without state (it works for any number of rows)."""
        for state in self._stateful:
            return state.batch_size
        return None

    # ----------------------------------------------------------------------- one step

    def process(self, logits: Tensor) -> Tensor:
        """Apply the processors to `logits (B, V)`; returns new float32 logits (input untouched).

        Raises ValueError for NaN, +inf or an all -inf row, before any processor runs.
        """
        processed = float_logits(logits)
        check_choosable(processed)
        for processor in self._active:
            processed = processor.apply(processed)
        return processed.clone() if processed is logits else processed

    def choose(self, logits: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """Tokens `(B,)` from processed logits: argmax when greedy, else a draw with `generator`.

        Raises ValueError for NaN, +inf or an all -inf row (`check_choosable`); a row the
        processors emptied names them (e.g. a constraint whose allowed tokens n-gram blocking
        removed).
        """
        logits = float_logits(logits)
        tokens, ok = self._choose(logits, generator)  # (B,), (B,)
        if bool(ok.all()):  # O(B): the input of `process` was checked in full
            return tokens
        try:
            check_choosable(logits)  # raises, naming the row, the token and the reason
        except EmptiedRowError as error:
            if not self.names:
                raise
            # the input was checked in `process`, so together the processors left nothing (e.g.
            # structured_outputs allows only tokens that no_repeat_ngram_size forbids)
            fields = tuple(_FIELDS.get(name.split(":")[0], name) for name in self.names)
            raise EmptiedRowError(error.row, tuple(self.names), fields) from None
        raise AssertionError("check_choosable accepted logits whose choice was not finite")

    def accept(self, tokens: Tensor) -> None:
        """Advance every processor with the chosen `tokens (B,)` (negative entries mark rows that
        take no token: counted nowhere, mirostat's mu unchanged)."""
        for state in self._stateful:
            state.accept(tokens)

    def next_tokens(self, logits: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """One decoding step: `process`, `choose`, `accept`; returns tokens `(B,)`."""
        tokens = self.choose(self.process(logits), generator)
        self.accept(tokens)
        return tokens

    # ----------------------------------------------------------- following the KV cache

    def rollback(self, counts: Tensor) -> None:
        """Forget the last `counts[b]` accepted tokens of row b, `counts (B,)` long (follows
        `cache.truncate` after a speculative rejection)."""
        for state in self._stateful:
            state.rollback(counts)

    def reset(self) -> None:
        """Every processor back to its state right after the prompt."""
        for state in self._stateful:
            state.reset()

    def select(self, indices: Tensor) -> None:
        """Reorder / duplicate / drop rows' state in place to follow a KV-cache reorder:
        row i becomes old row `indices[i]` (`indices (B',)` LongTensor)."""
        for state in self._stateful:
            state.select(indices)

    def fork(self, indices: Tensor) -> SamplerChain:
        """A new chain whose state is rows `indices (B',)` of this one; this chain is unchanged
        (a tree node's snapshot)."""
        return self._with([p.fork(indices) for p in self.processors])

    @staticmethod
    def concat(chains: Sequence[SamplerChain]) -> SamplerChain:
        """One chain whose rows are those of `chains` in order (chains built alike; each is
        unchanged): restores several tree nodes as one batch."""
        first = chains[0]
        for chain in chains[1:]:
            if chain.names != first.names or chain.greedy != first.greedy:
                raise ValueError(f"cannot join chains {first.names} and {chain.names}: built differently")
        joined = [type(p).concat([chain.processors[i] for chain in chains]) for i, p in enumerate(first.processors)]
        return first._with(joined)

    def _with(self, processors: list[LogitsProcessor]) -> SamplerChain:
        return SamplerChain(processors, greedy=self.greedy, params=self.params)

    # ----------------------------------------------------------- where rows may end

    @property
    def judges_stop(self) -> bool:
        """True when some processor has an opinion on where rows end (a constraint)."""
        return bool(self._judges)

    def stop_verdict(self, row: int) -> StopVerdict:
        """(may_stop, must_stop) of row `row` after the tokens it accepted: may_stop is None when
        no processor has an opinion, else whether all of them allow ending there; must_stop is
        True when one says the row cannot go on."""
        if not self._judges:
            return NO_OPINION
        return (all(p.allows_stop(row) for p in self._judges), any(p.finished(row) for p in self._judges))

    def forced(self, row: int) -> list[int]:
        """Tokens some processor forces as the only continuation of row `row` ([] if none)."""
        for processor in self._judges:
            tokens = processor.forced(row)
            if tokens:
                return tokens
        return []


def _rows_of(processor: LogitsProcessor, batch_size: int) -> LogitsProcessor:
    """`processor` with `batch_size` rows of its own: one row forked B times, or B rows copied."""
    if processor.stateless:
        return processor
    rows = processor.batch_size
    if rows == 1:
        return processor.fork(torch.zeros(batch_size, dtype=torch.long))
    if rows == batch_size:
        return processor.fork(torch.arange(batch_size))
    raise ValueError(f"processor {processor.name!r} has {rows} rows: give it with 1 row (the state after "
                     f"the prompt) or {batch_size} (one per row)")


def _sampling_adapters(params: SamplingParams, vocab_size: int) -> list[StatelessProcessor]:
    """Temperature and the truncations of `params` as stateless processors, in chain order."""
    steps = []
    if params.temperature != 1.0:
        steps.append(("temperature", partial(temperature, t=params.temperature), True))
    if params.top_k > 0 and params.top_k < vocab_size:
        steps.append(("top_k", partial(top_k, k=params.top_k), True))
    if params.top_p < 1.0:
        steps.append(("top_p", partial(top_p, p=params.top_p), True))
    if params.min_p > 0.0:
        steps.append(("min_p", partial(min_p, p=params.min_p), True))
    if params.typical_p < 1.0:  # may remove the argmax (see `typical`)
        steps.append(("typical", partial(typical, mass=params.typical_p), False))
    if params.epsilon_cutoff > 0.0:
        steps.append(("epsilon", partial(epsilon, eps=params.epsilon_cutoff), True))
    if params.eta_cutoff > 0.0:
        steps.append(("eta", partial(eta, eta=params.eta_cutoff), True))
    return [StatelessProcessor(name, function, invariant) for name, function, invariant in steps]
