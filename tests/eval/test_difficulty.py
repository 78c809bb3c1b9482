"""Per-difficulty strategy choice from stored pools (`eval/difficulty.py`): the bins, the split,
the per-bin choice under a budget and the held-out figures against a hand computation; the
probe round read from a pool; the policy reported by a sweep."""

from __future__ import annotations

import pytest

from metagen.eval import EvalConfig, Problem
from metagen.eval.difficulty import Outcome, difficulty_bins, difficulty_policy, format_policy, probe_round, \
    split_halves
from metagen.eval.summary import CONTINUED, summarize
from metagen.eval.running import evaluate_models
from metagen.sampling import SamplingParams
from tests.eval.dice import PROBLEMS
from tests.eval.test_cascade import _pool
from tests.eval.test_model_sweep import Models

SMALL, LARGE = ("s", "self_consistency", 1), ("l", "self_consistency", 4)
# 4 problems; seed 1 trains on [0, 1] and holds out [2, 3]. Shares 0.2, 0.9, 0.3, 1.0: bins 0, 1, 0, 1 of 2.
TABLE = {SMALL: ([0, 1, 0, 1], [2, 2, 2, 2]), LARGE: ([1, 0, 1, 1], [10, 10, 10, 10])}
SHARES, PROBE = [0.2, 0.9, 0.3, 1.0], [1, 1, 1, 1]


def test_bins_are_equal_width_with_full_agreement_in_the_last():
    assert difficulty_bins([0.0, 0.49, 0.5, 1.0], 2) == [0, 0, 1, 1]
    assert difficulty_bins([0.0, 0.33, 0.34, 0.67, 1.0], 3) == [0, 0, 1, 2, 2]
    with pytest.raises(ValueError, match="bins=0 is out of range"):
        difficulty_bins([0.5], 0)
    with pytest.raises(ValueError, match="share 1.5 is out of range"):
        difficulty_bins([1.5], 2)


def test_the_split_is_fixed_by_the_seed_and_covers_every_problem():
    assert split_halves(4, 1) == ([0, 1], [2, 3])
    train, held = split_halves(7, 3)
    assert split_halves(7, 3) == (train, held) and len(train) == 3 and sorted(train + held) == list(range(7))


def test_the_policy_matches_a_hand_computation():
    """Budget 12: single on train [0, 1]: both configurations 0.5, SMALL cheaper -> SMALL;
    held out 0.5 @ 2. Bin 0 (train [0]): LARGE right, 1 + 10 <= 12 -> LARGE; bin 1 (train [1]):
    SMALL right -> SMALL. Held out: problem 2 (bin 0) LARGE right, 1 + 10; problem 3 (bin 1)
    SMALL right, 1 + 2: policy 1.0 @ 7.
    Budget 5: LARGE fits no bin: SMALL everywhere, held out 0.5 @ 3 (its probe paid).
    Budget 2.5: the single SMALL fits (2), no bin does with its probe (3): no policy.
    Budget 1: nothing fits."""
    choices = difficulty_policy(TABLE, SHARES, PROBE, 2, [12, 5, 2.5, 1], seed=1)
    first, second, third, fourth = choices
    assert first.per_bin == (LARGE, SMALL) and first.single == SMALL
    assert first.policy == Outcome(1.0, 7.0) and first.single_outcome == Outcome(0.5, 2.0)
    assert second.per_bin == (SMALL, SMALL) and second.policy == Outcome(0.5, 3.0)
    assert third.per_bin == (None, None) and third.policy is None and third.single_outcome == Outcome(0.5, 2.0)
    assert fourth.single is None and fourth.single_outcome is None and fourth.policy is None
    text = format_policy(choices, 2, 2)
    assert "1.000 @ 7e-12" in text and "bin 0: l self_consistency n=4" in text and "nothing fits" in text
    assert "above the budget" not in text  # every held-out mean fits its budget here
    dearer = difficulty_policy({SMALL: ([0, 1, 0, 1], [2, 2, 3, 3])}, SHARES, PROBE, 2, [2.5, 4], seed=1)
    assert "held-out FLOPs above the budget at 2.5e-12 TFLOPs: the choices fit it on the training half" \
        in format_policy(dearer, 2, 2)  # SMALL trained at 2 FLOPs, held out at 3; at budget 4 both fit
    assert first.to_dict()["per_bin"] == [list(LARGE), list(SMALL)]


def test_the_budget_is_a_mean_so_an_easy_bin_pays_for_a_hard_one():
    """Budget 7: LARGE costs 11 with its probe in bin 0, over 7 on its own, but bin 1's SMALL
    costs 3: (11 + 3) / 2 = 7 fits, and answers both training problems. Held out: 1.0 @ 7, where
    the single best (SMALL) answers one."""
    choice = difficulty_policy(TABLE, SHARES, PROBE, 2, [7], seed=1)[0]
    assert choice.per_bin == (LARGE, SMALL) and choice.policy == Outcome(1.0, 7.0)
    assert choice.single == SMALL and choice.single_outcome == Outcome(0.5, 2.0)


def test_the_assignment_is_the_best_of_every_assignment_on_random_tables():
    """_allot against brute force over every assignment of 5 configurations to 3 bins."""
    import itertools
    import random

    from metagen.eval.difficulty import _allot, _charge

    rng = random.Random(0)
    for _ in range(60):
        count = 9
        table = {(f"m{j}", "s" + (CONTINUED if j == 4 else ""), j): (
            [float(rng.random() < 0.5) for _ in range(count)], [float(rng.choice([1, 2, 4, 8])) for _ in range(count)])
            for j in range(5)}
        probe = [float(rng.choice([0, 1, 3])) for _ in range(count)]
        groups = [[0, 1, 2], [3, 4], [5, 6, 7, 8]]
        budget = rng.choice([2.0, 4.0, 6.0, 9.0])
        best = None
        for keys in itertools.product(table, repeat=3):
            cost = sum(_charge(key, table[key][1][i], probe[i]) for key, group in zip(keys, groups) for i in group)
            score = sum(table[key][0][i] for key, group in zip(keys, groups) for i in group)
            if cost / count <= budget and (best is None or (score, -cost) > best):
                best = (score, -cost)
        chosen = _allot(table, groups, count, budget, probe)
        if best is None:
            assert chosen is None
            continue
        cost = sum(_charge(key, table[key][1][i], probe[i]) for key, group in zip(chosen, groups) for i in group)
        assert (sum(table[key][0][i] for key, group in zip(chosen, groups) for i in group), -cost) == best


def test_a_continuation_of_the_probe_pays_the_larger_prefix_not_the_probe_again():
    """CONT reuses the probe (1 FLOP): charged max(1, 2) = 2, not 1 + 2. Budget 2.5, where no
    fresh configuration fits a bin with its probe (3): bin 0 (train [0], CONT right) and bin 1
    (train [1], CONT right) take CONT; held out: problem 2 wrong, problem 3 right, 0.5 @ 2.
    The single choice never takes a continuation (it runs no probe): SMALL, 0.5 @ 2.
    A continuation cheaper than its probe (0.5) is charged the probe's 1."""
    cont = ("s", "self_consistency" + CONTINUED, 4)
    table = {**TABLE, cont: ([1, 1, 0, 1], [2, 2, 2, 2])}
    choice = difficulty_policy(table, SHARES, PROBE, 2, [2.5], seed=1)[0]
    assert choice.per_bin == (cont, cont) and choice.policy == Outcome(0.5, 2.0)
    assert choice.single == SMALL and choice.single_outcome == Outcome(0.5, 2.0)
    cheap = {cont: ([1, 1, 1, 1], [0.5, 0.5, 0.5, 0.5])}
    assert difficulty_policy(cheap, SHARES, PROBE, 2, [1.0], seed=1)[0].policy == Outcome(1.0, 1.0)
    assert "bin 0: s self_consistency (probe reused) n=4" in format_policy([choice], 2, 2)


class _Units:
    """The part of `ModelUnits` a pooled summary reads: a label, a set-up and each problem's pool."""

    def __init__(self, label, pools):
        self.label, self.setup, self.pools = label, {}, pools

    def pool(self, problem):
        return self.pools[problem.id]


def test_the_probe_summary_runs_each_pooled_strategy_on_its_first_n_samples_in_stored_order():
    """Pools ['1', '1', '2', '2', '2'] (answer 1) and ['2', '1', '2', '1', '1'] (answer 1), probe
    k = 2. n = 2: votes over the first two: '1' right; a 1-1 tie ('2' first) wrong. n = 4: 2-2
    ties ('1' first: right; '2' first: wrong). n = 1 < k is no continuation; FLOPs 10 + n."""
    problems = [Problem("a", "q", "1"), Problem("b", "q", "1")]
    units = _Units("m", {"a": _pool(["1", "1", "2", "2", "2"], 10, 1), "b": _pool(["2", "1", "2", "1", "1"], 10, 1)})
    config = EvalConfig(("self_consistency",), ns=(1, 2, 4), params=SamplingParams(temperature=1.0))
    report = summarize(units, problems, config, continue_after=2)
    continued = {key: value for key, value in report.per_problem.items() if key[1].endswith(CONTINUED)}
    assert continued == {("m", "self_consistency" + CONTINUED, 2): ([1.0, 0.0], [12, 12]),
                         ("m", "self_consistency" + CONTINUED, 4): ([1.0, 0.0], [14, 14])}
    assert not any(point.strategy.endswith(CONTINUED) for point in report.points)  # no point of their own
    assert not any(key[1].endswith(CONTINUED) for key in summarize(units, problems, config).per_problem)


def test_a_bin_without_training_problems_takes_the_single_choice():
    """3 bins: shares 0.2, 0.3 -> bin 0, 0.9, 1.0 -> bin 2; bin 1 is empty and takes SMALL."""
    choice = difficulty_policy(TABLE, SHARES, PROBE, 3, [12], seed=1)[0]
    assert choice.per_bin == (LARGE, SMALL, SMALL)


def test_bad_tables_are_refused():
    with pytest.raises(ValueError, match="at least 2 problems"):
        difficulty_policy(TABLE, [0.5], [1], 2, [1], 0)
    with pytest.raises(ValueError, match="unknown FLOPs"):
        difficulty_policy({SMALL: ([0, 1], [1, None])}, [0.5, 0.5], [1, 1], 2, [1], 0)


def test_the_probe_round_reads_the_first_k_samples_in_stored_order():
    """First 2 of ['1', '1', '2', '2'] agree fully (share 1); of ['1', '2', '2', '2'] half; the
    probe's FLOPs are those 2 samples' (10 + 2·1)."""
    problems = [Problem("a", "q", "1"), Problem("b", "q", "2")]
    pools = {"a": _pool(["1", "1", "2", "2"], 10, 1), "b": _pool(["1", "2", "2", "2"], 10, 1)}
    config = EvalConfig(("self_consistency",), ns=(4,))
    shares, flops = probe_round(pools, problems, config, 2)
    assert shares == [1.0, 0.5] and flops == [12, 12]


def test_a_sweep_reports_the_policy(tmp_path):
    config = EvalConfig(("self_consistency",), ns=(1, 2), params=SamplingParams(temperature=1.0), difficulty_round=2,
                        difficulty_bins=2)
    report = evaluate_models([Models().run("a"), Models().run("b")], PROBLEMS, config, tmp_path)
    policy = report.difficulty
    assert policy["model"] == "a" and policy["held_out"] == 3 and policy["choices"]
    assert set(report.per_problem) == {(m, "self_consistency", n) for m in "ab" for n in (1, 2)} | {
        ("a", "self_consistency" + CONTINUED, 2)}  # the probe a's continuation at n = k = 2 only
    assert report.to_dict()["difficulty_policy"]["choices"][0]["budget_flops"] == policy["choices"][0].budget


@pytest.mark.parametrize("fields, named", [
    ({"difficulty_round": 1}, "difficulty_round=1 (--difficulty-round) is out of range"),
    ({"difficulty_round": 3}, "must be an integer in [2, 2]"),
    ({"difficulty_bins": 0}, "difficulty_bins=0 (--difficulty-bins) is out of range"),
])
def test_bad_policy_settings_are_refused_by_name(fields, named):
    with pytest.raises(ValueError, match=named.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        EvalConfig(("self_consistency",), ns=(1, 2), **fields)
