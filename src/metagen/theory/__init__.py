"""Theory of inference-time alignment over finite outcome sets, computed exactly.

Best-of-n (PMF, KL, bound, estimator, win rate), its asymptotic equivalence with KL-regularised
RL, KL estimated from samples by log-likelihood ratios, the mismatched tilt and the KL-regularized
optimum, Bradley–Terry / Elo / InfAlign rewards, pass@k and the voting limit. numpy/scipy only
(pass@k: the standard library); not imported by `metagen` itself, and names are imported on first
use (`metagen._lazy`), so `metagen.theory.pass_rate` costs nothing more. The k-gram
`LanguageModel` small enough to enumerate is `metagen.models.kgram`.
"""

from metagen._lazy import lazy_package

# name -> the submodule that defines it
_EXPORTS = {
    "bon_kl": "best_of_n",
    "bon_kl_bound": "best_of_n",
    "bon_kl_estimate": "best_of_n",
    "bon_pmf": "best_of_n",
    "bon_win_rate": "best_of_n",
    "kl_divergence": "best_of_n",
    "reward_cdf": "best_of_n",
    "AsymptoticsPoint": "bon_asymptotics",
    "asymptotics_curve": "bon_asymptotics",
    "bon_against_tilt": "bon_asymptotics",
    "KLEstimate": "kl_estimate",
    "kl_from_log_ratios": "kl_estimate",
    "kl_from_step_divergences": "kl_estimate",
    "step_divergence": "kl_estimate",
    "best_of_n_transform": "rewards",
    "calibrate_reward": "rewards",
    "elo_expected": "rewards",
    "fit_bradley_terry": "rewards",
    "worst_of_n_transform": "rewards",
    "pass_at_k": "pass_rate",
    "answer_masses": "scaling",
    "voting_limit": "scaling",
    "KLRegularizedOptimum": "tilt",
    "alpha_for_kl": "tilt",
    "kl_regularized_optimum": "tilt",
    "max_tilt_kl": "tilt",
    "tilt": "tilt",
}
lazy_package(__name__, _EXPORTS)

__all__ = sorted(_EXPORTS)
