"""Sampling adapters, token choice and the sampler chain.

Every adapter is a pure function `(logits (..., V), ...) -> new float32 logits (..., V)` that sets
removed tokens to -inf and never modifies its input. Everything a decoding loop runs on logits is
a `LogitsProcessor` (`processor.py`): stateless adapters wrapped by `StatelessProcessor`, and
stateful ones (penalty counts, n-gram history, momentum decoding, mirostat, constraints) that carry their state
explicitly and follow the KV cache (accept / rollback / select / fork / concat / reset).
`SamplerChain.from_params(SamplingParams(...), ...)` composes them for a decoding loop.

Logits from outside may hold finite values and -inf (a removed token). NaN, +inf and rows that
are all -inf are refused with a ValueError naming the row and token, by `SamplerChain.process`
before any adapter runs (the one full check of a decoding step: one reduction and one host
synchronisation) and by `sample` / `greedy` called on their own; `SamplerChain.choose` looks only
at the B values it chose. Adapters called on their own never remove a NaN / +inf entry, so the
choice after them still reports it.
"""

from metagen._lazy import lazy_package

# name -> the submodule that defines it, imported on first use (`metagen._lazy`): SamplingParams
# imports no torch
_EXPORTS = {
    "token_counts": "_tokens",
    "SamplerChain": "chain",
    "StructuredProcessor": "constraint",
    "SpanProcessor": "span",
    "contrastive": "contrastive",
    "epsilon": "epsilon",
    "entropy": "eta",
    "eta": "eta",
    "LogitBias": "logit_bias",
    "bias_vector": "logit_bias",
    "logit_bias": "logit_bias",
    "min_p": "min_p",
    "Mirostat": "mirostat",
    "mirostat_truncate": "mirostat",
    "mirostat_update": "mirostat",
    "MomentumState": "momentum",
    "loop_depths": "momentum",
    "momentum_scores": "momentum",
    "NoRepeatNgramState": "no_repeat_ngram",
    "banned_tokens": "no_repeat_ngram",
    "no_repeat_ngram": "no_repeat_ngram",
    "SamplingParams": "params",
    "frequency_penalty": "penalties",
    "frequency_penalty_from_counts": "penalties",
    "presence_penalty": "penalties",
    "presence_penalty_from_counts": "penalties",
    "repetition_penalty": "penalties",
    "repetition_penalty_from_mask": "penalties",
    "PenaltyState": "penalty_state",
    "LogitsProcessor": "processor",
    "NO_OPINION": "processor",
    "StopVerdict": "processor",
    "StatelessProcessor": "processor",
    "EmptiedRowError": "sample",
    "TokenLogprobs": "sample",
    "check_choosable": "sample",
    "greedy": "sample",
    "sample": "sample",
    "token_logprobs": "sample",
    "temperature": "temperature",
    "TokenHealingProcessor": "token_healing",
    "top_k": "top_k",
    "top_p": "top_p",
    "typical": "typical",
}
lazy_package(__name__, _EXPORTS)

__all__ = sorted(_EXPORTS)
