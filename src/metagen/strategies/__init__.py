"""Meta-generation strategies: they call a `Generator` many times and pick or build an answer."""

from metagen.strategies.best_of_n import BestOfNConfig, best_of_n
from metagen.strategies.result import Candidate, StrategyResult
from metagen.strategies.self_consistency import SelfConsistencyConfig, self_consistency
from metagen.strategies.weighted_voting import WeightedVotingConfig, weighted_voting

__all__ = [
    "BestOfNConfig",
    "Candidate",
    "SelfConsistencyConfig",
    "StrategyResult",
    "WeightedVotingConfig",
    "best_of_n",
    "self_consistency",
    "weighted_voting",
]
