"""pass@k and the voting limit against exact counts and simulated voting."""

import math
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metagen.theory import answer_masses, pass_at_k, voting_limit


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 60).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(1, n))))
def test_pass_at_k_equals_binomial_ratio(args):
    n, c, k = args
    exact = 1 - math.comb(n - c, k) / math.comb(n, k)
    assert pass_at_k(n, c, k) == pytest.approx(exact, abs=1e-12)


def test_pass_at_k_is_stable_for_large_n():
    value = pass_at_k(10_000, 3, 100)  # C(10000, 100) overflows floats
    assert value == pytest.approx(1 - math.comb(9997, 100) / math.comb(10_000, 100), rel=1e-10)


def test_pass_at_k_matches_subsampling():
    rng = np.random.default_rng(0)
    n, c, k = 20, 4, 5
    pool = np.array([1] * c + [0] * (n - c))
    hits = [pool[rng.choice(n, k, replace=False)].any() for _ in range(20_000)]
    assert np.mean(hits) == pytest.approx(pass_at_k(n, c, k), abs=0.015)


def test_voting_limit_by_hand():
    paths = [0.2, 0.15, 0.25, 0.4]
    answers = ["a", "a", "b", "c"]  # masses a 0.35, b 0.25, c 0.4
    assert answer_masses(paths, answers) == pytest.approx({"a": 0.35, "b": 0.25, "c": 0.4})
    assert voting_limit(paths, answers, "c") == 1.0
    assert voting_limit(paths, answers, "a") == 0.0
    # weighted voting: v·g gives a 0.35, b 0.125, c 0.2 — the reward moves the vote to "a"
    weights = [1.0, 1.0, 0.5, 0.5]
    assert voting_limit(paths, answers, "a", weights) == 1.0
    # a two-way tie credits half
    assert voting_limit([0.4, 0.4, 0.2], ["x", "y", "z"], "x") == 0.5
    # zero-probability paths do not vote
    assert voting_limit([0.6, 0.4, 0.0], ["x", "y", "z"], "z", [1, 1, 100]) == 0.0
    with pytest.raises(ValueError):
        voting_limit([0.5, 0.5], ["x", "y"], "x", [0.0, 0.0])


def simulate_vote(paths, answers, weights, samples, trials, rng):
    """Fraction of `trials` weighted votes over `samples` draws, with each answer's win share
    (ties split uniformly), as a dict answer -> frequency."""
    labels = sorted(set(answers))
    index = np.array([labels.index(a) for a in answers])
    wins = Counter()
    draws = rng.choice(len(paths), size=(trials, samples), p=paths)  # (trials, samples)
    totals = np.zeros((trials, len(labels)))
    np.add.at(totals, (np.arange(trials)[:, None], index[draws]), np.asarray(weights)[draws])
    for row in totals:
        tied = np.flatnonzero(row == row.max())
        for t in tied:
            wins[labels[t]] += 1 / len(tied)
    return {label: wins[label] / trials for label in labels}


@pytest.mark.parametrize("weighted", [False, True])
def test_voting_converges_to_the_limit(weighted):
    rng = np.random.default_rng(1 + weighted)
    paths = np.array([0.2, 0.15, 0.25, 0.4])
    answers = ["a", "a", "b", "c"]
    weights = np.array([1.0, 1.0, 0.5, 0.5]) if weighted else np.ones(4)
    frequencies = simulate_vote(paths, answers, weights, samples=1500, trials=400, rng=rng)
    for label in "abc":
        assert frequencies[label] == pytest.approx(voting_limit(paths, answers, label, weights), abs=0.03)


def test_voting_with_a_tie_splits_evenly():
    rng = np.random.default_rng(7)
    paths = [0.3, 0.3, 0.2, 0.2]
    answers = ["x", "x", "y", "z"]  # x 0.6: no tie
    tie_paths = [0.4, 0.4, 0.2]
    tie_answers = ["x", "y", "z"]
    frequencies = simulate_vote(tie_paths, tie_answers, np.ones(3), samples=1000, trials=2000, rng=rng)
    assert frequencies["x"] == pytest.approx(0.5, abs=0.04)
    assert voting_limit(tie_paths, tie_answers, "x") == 0.5
    assert voting_limit(paths, answers, "x") == 1.0
