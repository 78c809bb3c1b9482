r"""KL(π ‖ p) of a policy to its reference, estimated from the policy's own samples.

Where the outcomes cannot be enumerated (sequences of a language model), the divergence of an
aligned or steered policy π from its base p is estimated from samples y_1..y_N ~ π by their
log-likelihood ratios (Mudgal et al. 2024, "Controlled decoding from language models"; Beirami
et al. 2024 use it to check their best-of-n formula):

$$
\widehat{\mathrm{KL}} = \frac{1}{N} \sum_{i=1}^N \log \frac{\pi(y_i)}{p(y_i)},
\qquad \mathbb{E}\big[\widehat{\mathrm{KL}}\big] = \mathrm{KL}(\pi \,\|\, p),
\qquad \mathrm{Var}\big[\widehat{\mathrm{KL}}\big] = \frac{\mathrm{Var}_{y \sim \pi}[\log \pi(y)/p(y)]}{N},
$$

the variance estimated by the sample variance (`standard_error` = its square root). For a
sequence, log π(y)/p(y) is the sum of the per-token log ratios along y, which a decoder knows when
it samples (the processed distribution's log-probability of each token, beside the base model's).

The stepwise form replaces each token's log ratio by its conditional mean, the per-step divergence
of the two next-token distributions on the sampled path (the chain rule of KL):

$$
\widehat{\mathrm{KL}}_{\text{step}} = \frac{1}{N} \sum_{i=1}^N \sum_t
\mathrm{KL}\big(\pi(\cdot \mid y_{i,<t}) \,\|\, p(\cdot \mid y_{i,<t})\big),
$$

also unbiased; it removes the noise of which token was drawn at each step, but not that of which
path was taken (later steps' divergences depend on earlier draws), so its variance is usually,
not always, the smaller. It needs both full next-token distributions at every step (O(V) per
token), where the plain form needs one log-probability of each.

Shapes: one value per sample, (N,). O(N).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class KLEstimate:
    """value: the estimate in nats; standard_error: sqrt(sample variance / N) (nan for N = 1);
    samples: N."""

    value: float
    standard_error: float
    samples: int

    def interval(self, z: float = 1.96) -> tuple[float, float]:
        """value ∓ z · standard_error (a normal interval, 95% at z = 1.96)."""
        return self.value - z * self.standard_error, self.value + z * self.standard_error


def _mean_and_error(values, name: str) -> KLEstimate:
    values = np.asarray(values, dtype=np.float64)
    if values.ndim != 1 or values.size == 0:
        raise ValueError(f"{name} must be a non-empty (N,) array, got shape {values.shape}")
    if not np.all(np.isfinite(values)):
        raise ValueError(f"{name} must be finite (a sample the reference gives probability 0 makes the KL infinite)")
    n = values.size
    error = float(np.std(values, ddof=1) / math.sqrt(n)) if n > 1 else math.nan
    return KLEstimate(float(values.mean()), error, n)


def kl_from_log_ratios(log_policy, log_reference) -> KLEstimate:
    """The plain estimator from each sample's log π(y_i) and log p(y_i), both (N,) (for a sequence:
    sums of per-token log-probabilities). The samples must come from π."""
    log_policy = np.asarray(log_policy, dtype=np.float64)
    log_reference = np.asarray(log_reference, dtype=np.float64)
    if log_policy.shape != log_reference.shape:
        raise ValueError(f"log_policy and log_reference must have one shape, got {log_policy.shape} and "
                         f"{log_reference.shape}")
    with np.errstate(invalid="ignore"):
        return _mean_and_error(log_policy - log_reference, "log_policy - log_reference")


def kl_from_step_divergences(step_divergences) -> KLEstimate:
    """The stepwise estimator from each sample's Σ_t KL(π(·|y_<t) ‖ p(·|y_<t)), (N,)."""
    return _mean_and_error(step_divergences, "step_divergences")


def step_divergence(policy_logits, reference_logits) -> np.ndarray:
    """KL(softmax(policy) ‖ softmax(reference)) per row: (..., V) logits → (...,) nats; tokens the
    policy excludes (−inf) contribute 0, tokens only the reference excludes make it inf."""
    a = np.asarray(policy_logits, dtype=np.float64)
    b = np.asarray(reference_logits, dtype=np.float64)
    log_a = a - np.logaddexp.reduce(a, axis=-1, keepdims=True)
    log_b = b - np.logaddexp.reduce(b, axis=-1, keepdims=True)
    prob_a = np.exp(log_a)
    with np.errstate(invalid="ignore"):
        terms = np.where(prob_a > 0, prob_a * (log_a - log_b), 0.0)
    return terms.sum(axis=-1)
