"""Sampling adapters, token choice and the sampler chain.

Every adapter is a pure function `(logits (..., V), ...) -> new float32 logits (..., V)` that sets
removed tokens to -inf and never modifies its input. Everything a decoding loop runs on logits is
a `LogitsProcessor` (`processor.py`): stateless adapters wrapped by `StatelessProcessor`, and
stateful ones (penalty counts, n-gram history, mirostat, constraints) that carry their state
explicitly and follow the KV cache (accept / rollback / select / fork / concat / reset).
`SamplerChain.from_params(SamplingParams(...), ...)` composes them for a decoding loop.

Logits from outside may hold finite values and -inf (a removed token). NaN, +inf and rows that
are all -inf are refused with a ValueError naming the row and token, by `SamplerChain.process`
before any adapter runs and by the token choice (`choose`, `sample`, `greedy`): one reduction and
one host synchronisation per call. Adapters called on their own never remove a NaN / +inf entry,
so the choice after them still reports it.
"""

from ._tokens import token_counts
from .chain import SamplerChain
from .contrastive import contrastive
from .epsilon import epsilon
from .eta import entropy, eta
from .logit_bias import LogitBias, bias_vector, logit_bias
from .min_p import min_p
from .mirostat import Mirostat, mirostat_truncate, mirostat_update
from .no_repeat_ngram import NoRepeatNgramState, banned_tokens, no_repeat_ngram
from .params import SamplingParams
from .penalties import (
    frequency_penalty,
    frequency_penalty_from_counts,
    presence_penalty,
    presence_penalty_from_counts,
    repetition_penalty,
    repetition_penalty_from_mask,
)
from .penalty_state import PenaltyState
from .processor import LogitsProcessor, StatelessProcessor
from .sample import EmptiedRowError, TokenLogprobs, check_choosable, greedy, sample, token_logprobs
from .temperature import temperature
from .top_k import top_k
from .top_p import top_p
from .typical import typical

__all__ = [
    "LogitBias",
    "LogitsProcessor",
    "Mirostat",
    "NoRepeatNgramState",
    "PenaltyState",
    "SamplerChain",
    "SamplingParams",
    "StatelessProcessor",
    "TokenLogprobs",
    "banned_tokens",
    "bias_vector",
    "check_choosable",
    "EmptiedRowError",
    "contrastive",
    "entropy",
    "epsilon",
    "eta",
    "frequency_penalty",
    "frequency_penalty_from_counts",
    "greedy",
    "logit_bias",
    "min_p",
    "mirostat_truncate",
    "mirostat_update",
    "no_repeat_ngram",
    "presence_penalty",
    "presence_penalty_from_counts",
    "repetition_penalty",
    "repetition_penalty_from_mask",
    "sample",
    "temperature",
    "token_counts",
    "token_logprobs",
    "top_k",
    "top_p",
    "typical",
]
