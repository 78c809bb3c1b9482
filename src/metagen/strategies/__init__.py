"""Meta-generation strategies: they call a `Generator` many times and pick or build an answer."""

from metagen.strategies.best_of_n import BestOfNConfig, best_of_n
from metagen.strategies.borda_voting import BordaVotingConfig, borda_voting
from metagen.strategies.chain import CallTool, Chain, ChainConfig, ChainResult, Generate, ToolBinding, TraceEntry, Transform
from metagen.strategies.chain_programs import (
    calculator_binding,
    calculator_chain,
    chain_of_thought,
    python_binding,
    self_ask,
    tool_loop,
)
from metagen.strategies.mbr import MBRConfig, mbr
from metagen.strategies.result import Candidate, StrategyResult
from metagen.strategies.self_consistency import SelfConsistencyConfig, self_consistency
from metagen.strategies.self_refine import SelfRefineConfig, SelfRefineResult, self_refine
from metagen.strategies.verifier_refine import VerifierRefineConfig, VerifierRefineResult, verifier_refine
from metagen.strategies.weighted_voting import WeightedVotingConfig, weighted_voting

__all__ = [
    "BestOfNConfig",
    "BordaVotingConfig",
    "CallTool",
    "Candidate",
    "Chain",
    "ChainConfig",
    "ChainResult",
    "Generate",
    "MBRConfig",
    "SelfConsistencyConfig",
    "SelfRefineConfig",
    "SelfRefineResult",
    "StrategyResult",
    "ToolBinding",
    "TraceEntry",
    "Transform",
    "VerifierRefineConfig",
    "VerifierRefineResult",
    "WeightedVotingConfig",
    "best_of_n",
    "borda_voting",
    "calculator_binding",
    "calculator_chain",
    "chain_of_thought",
    "mbr",
    "python_binding",
    "self_ask",
    "self_consistency",
    "self_refine",
    "tool_loop",
    "verifier_refine",
    "weighted_voting",
]
