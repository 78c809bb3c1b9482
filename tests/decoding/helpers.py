"""Chi-square check of sampled sequences against an enumerated distribution."""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Iterable, Mapping

from scipy.stats import chisquare

MIN_P_VALUE = 1e-3
MIN_EXPECTED = 5.0  # categories expected fewer times than this are pooled into one


def assert_follows(samples: Iterable[Hashable], expected: Mapping[Hashable, float]) -> None:
    """Chi-square goodness of fit of `samples` against the probabilities `expected`.

    Outcomes outside `expected` (or of probability 0) must never occur; rare outcomes are pooled
    so every category has an expected count of at least MIN_EXPECTED. Passes at p > 1e-3.
    """
    counts = Counter(samples)
    total = sum(counts.values())
    impossible = {outcome: n for outcome, n in counts.items() if expected.get(outcome, 0.0) <= 0.0}
    assert not impossible, f"drew outcomes of probability 0: {impossible}"
    observed, predicted, pooled_observed, pooled_predicted = [], [], 0, 0.0
    for outcome, probability in expected.items():
        if probability * total >= MIN_EXPECTED:
            observed.append(counts[outcome])
            predicted.append(probability * total)
        else:
            pooled_observed += counts[outcome]
            pooled_predicted += probability * total
    if pooled_predicted > 0:
        observed.append(pooled_observed)
        predicted.append(pooled_predicted)
    assert len(observed) >= 3, "too few categories for a meaningful test"
    scale = sum(observed) / sum(predicted)  # expected sums to 1 up to float rounding
    result = chisquare(observed, [p * scale for p in predicted])
    assert result.pvalue > MIN_P_VALUE, (observed, predicted, result)
