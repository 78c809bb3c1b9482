"""Meta-generation strategies: they call a `Generator` many times and pick or build an answer.

Names are imported on first use (`metagen._lazy`): a strategy module imports torch only when it runs."""

from metagen._lazy import lazy_package

# name -> the submodule that defines it
_EXPORTS = {
    "BestOfNConfig": "best_of_n",
    "best_of_n": "best_of_n",
    "BordaVotingConfig": "borda_voting",
    "borda_voting": "borda_voting",
    "CallTool": "chain",
    "Chain": "chain",
    "ChainRun": "chain",
    "ChainConfig": "chain",
    "ChainResult": "chain",
    "Generate": "chain",
    "ToolBinding": "chain",
    "TraceEntry": "chain",
    "Transform": "chain",
    "calculator_binding": "chain_programs",
    "calculator_chain": "chain_programs",
    "chain_of_thought": "chain_programs",
    "python_binding": "chain_programs",
    "SearchConfig": "chain_programs",
    "search_binding": "chain_programs",
    "search_chain": "chain_programs",
    "s2a": "chain_programs",
    "self_ask": "chain_programs",
    "self_ask_search": "chain_programs",
    "tool_loop": "chain_programs",
    "Bootstrap": "dsp",
    "DSPConfig": "dsp",
    "Demonstration": "dsp",
    "bootstrap": "dsp",
    "dsp": "dsp",
    "read_examples": "dsp",
    "search_predict": "dsp",
    "InContextNavigationConfig": "in_context_navigation",
    "NavigationResult": "in_context_navigation",
    "in_context_navigation": "in_context_navigation",
    "MBRConfig": "mbr",
    "mbr": "mbr",
    "SelfConsistencyConfig": "self_consistency",
    "self_consistency": "self_consistency",
    "SelfRefineConfig": "self_refine",
    "SelfRefineResult": "self_refine",
    "self_refine": "self_refine",
    "VerifierRefineConfig": "verifier_refine",
    "VerifierRefineResult": "verifier_refine",
    "verifier_refine": "verifier_refine",
    "WeightedVotingConfig": "weighted_voting",
    "weighted_voting": "weighted_voting",
}
lazy_package(__name__, _EXPORTS)

__all__ = sorted(_EXPORTS)
