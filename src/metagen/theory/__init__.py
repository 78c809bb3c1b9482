"""Theory of inference-time alignment over finite outcome sets, computed exactly.

Best-of-n (PMF, KL, bound, estimator, win rate), the mismatched tilt and the KL-regularized
optimum, Bradley–Terry / Elo / InfAlign rewards, pass@k and the voting limit, and a k-gram
`LanguageModel` small enough to enumerate. numpy/scipy (and torch for the model) only; not
imported by `metagen` itself.
"""

from metagen.theory.best_of_n import (
    bon_kl,
    bon_kl_bound,
    bon_kl_estimate,
    bon_pmf,
    bon_win_rate,
    kl_divergence,
    reward_cdf,
)
from metagen.theory.kgram import KGramCache, KGramModel, SymbolTokenizer
from metagen.theory.rewards import (
    best_of_n_transform,
    calibrate_reward,
    elo_expected,
    fit_bradley_terry,
    worst_of_n_transform,
)
from metagen.theory.scaling import answer_masses, pass_at_k, voting_limit
from metagen.theory.tilt import KLRegularizedOptimum, alpha_for_kl, kl_regularized_optimum, max_tilt_kl, tilt

__all__ = [
    "KGramCache",
    "KGramModel",
    "KLRegularizedOptimum",
    "SymbolTokenizer",
    "alpha_for_kl",
    "answer_masses",
    "best_of_n_transform",
    "bon_kl",
    "bon_kl_bound",
    "bon_kl_estimate",
    "bon_pmf",
    "bon_win_rate",
    "calibrate_reward",
    "elo_expected",
    "fit_bradley_terry",
    "kl_divergence",
    "kl_regularized_optimum",
    "max_tilt_kl",
    "pass_at_k",
    "reward_cdf",
    "tilt",
    "voting_limit",
    "worst_of_n_transform",
]
