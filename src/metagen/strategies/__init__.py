"""Meta-generation strategies: they call a `Generator` many times and pick or build an answer."""

from metagen.strategies.best_of_n import BestOfNConfig, best_of_n
from metagen.strategies.borda_voting import BordaVotingConfig, borda_voting
from metagen.strategies.result import Candidate, StrategyResult
from metagen.strategies.self_consistency import SelfConsistencyConfig, self_consistency
from metagen.strategies.weighted_voting import WeightedVotingConfig, weighted_voting

__all__ = [
    "BestOfNConfig",
    "BordaVotingConfig",
    "Candidate",
    "SelfConsistencyConfig",
    "StrategyResult",
    "WeightedVotingConfig",
    "best_of_n",
    "borda_voting",
    "self_consistency",
    "weighted_voting",
]
