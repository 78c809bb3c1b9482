"""Primitive generators (the sampling loop, beam search) and the sequence-level `Generator`
interface with its `Cost`, which meta-generation strategies build on; the one result type
(`Completion` per sequence, `GenerationResult` per call) every loop and strategy returns.

Names are imported on first use (`metagen._lazy`): `capabilities`, `Cost`, `prompts`, the
result types and `RequestFailedError` import no torch."""

from metagen._lazy import lazy_package

# name -> the submodule that defines it
_EXPORTS = {
    "Cost": "cost",
    "ContrastiveConfig": "combine",
    "DExpertsConfig": "combine",
    "LogitsCombiner": "combine",
    "SwitchingCombiner": "combine",
    "EntropyAdaptiveConfig": "entropy_adaptive",
    "AdaDecConfig": "adadec",
    "fit_entropy_threshold": "adadec",
    "Generator": "generator",
    "LocalGenerator": "generator",
    "LocalModel": "generator",
    "BeamSearchConfig": "beam_search",
    "beam_search": "beam_search",
    "encode_prompt": "prompts",
    "NgramCounts": "ngram_counts",
    "SuperposedConfig": "superposed",
    "superposed_decode": "superposed",
    "Completion": "result",
    "GenerationResult": "result",
    "prefer_complete": "result",
    "RequestFailedError": "errors",
    "Row": "rows",
    "StopRules": "stop_rules",
    "TokenRecord": "records",
    "request_chain": "request",
    "token_records": "records",
    "StreamEvent": "result",
    "generate": "sample_loop",
    "generate_batch": "sample_loop",
    "stream": "sample_loop",
}
lazy_package(__name__, _EXPORTS)

__all__ = list(_EXPORTS)
