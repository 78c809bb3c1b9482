"""Per-difficulty strategy choice evaluated offline (Snell et al. 2024, "Scaling LLM test-time
compute optimally can be more effective than scaling model parameters"): bin problems by a
difficulty estimate known before grading, pick a (model, strategy, n) per bin on a training
half, the most accurate assignment whose mean cost fits a budget, and compare on the held-out
half with the best single configuration at the same budget.

    difficulty   d_p = share of the top answer among the probe model's first k pool samples
                 (`cascade.agreement`; code problems: code_cluster's largest cluster)
    bin          b_p = min(⌊d_p · B⌋, B − 1)                 (B equal-width bins of [0, 1])
    split        problems shuffled by a fixed seed: the first ⌊P/2⌋ train, the rest held out
    charge       f(c, p) = probe_p + flops(c, p)             a configuration run afresh
                 f(c⁺, p) = max(probe_p, flops(c⁺, p))       a continuation c⁺ of the probe
    choice       (c_1..c_B) = argmax Σ_b Σ_{p ∈ train,b} score(c_b, p)
                              s.t.  (1/|train|) Σ_b Σ_{p ∈ train,b} f(c_b, p) ≤ C
    policy       held-out problem p in bin b gets c_b:  acc = mean_p score(c_b, p),
                 flops = mean_p f(c_b, p)
    single       c* = argmax_c acc_train(c) s.t. flops_train(c) ≤ C, on the held-out half
                 (continuations excluded: they need the probe)

A continuation keeps the probe's samples: a pooled strategy of the probe model at n ≥ k run on
the first n samples of its pool in stored order, which begin with the k the probe voted on (at
n = k it answers with the probe's own vote, for nothing more). Its score is that one run's, not
an average over n-subsets, because the bin was read from those very samples; its FLOPs are those
of the larger prefix drawn. A policy that cannot reuse the probe pays it in full on top of a
fresh configuration, so the comparison with the single configuration (which pays no probe) is
what a user deploying the policy would see.

The budget is the mean per problem, as for every point of the frontier, so an easy bin that
stops early pays for more samples on a hard one (Snell et al. fix the budget per question
instead). The choice is a multiple-choice knapsack, solved exactly: bin by bin, the
(cost, score) sums of every partial assignment are merged and those another partial assignment
dominates (no dearer and at least as accurate) are dropped, which never drops the best
completion. Ties go to the fewer FLOPs, then the configurations given first. A bin with no
training problem takes the single choice c* (its probe still paid); when no assignment fits,
the policy has no figure at that budget (None). Per-problem scores and FLOPs come from the
evaluation (`EvalReport.per_problem`) and the stored pools, so nothing is generated. Time:
O(C·P) per budget for C configurations and P problems, plus the merge, O(B·S·C) for S kept
partial assignments (at most the distinct cost sums; in practice tens).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from metagen.eval.cascade import agreement
from metagen.eval.code_prompts import request
from metagen.eval.points import stable_seed
from metagen.eval.pool import PoolGenerator
from metagen.eval.summary import CONTINUED
from metagen.strategies.registry import get_strategy
from metagen.tables import Table, with_notes

Key = tuple[str, str, int]  # (model, strategy, n)


@dataclass(frozen=True)
class Outcome:
    """One configuration's (or the policy's) figures on a set of problems: mean accuracy and FLOPs."""

    accuracy: float
    flops: float


@dataclass(frozen=True)
class PolicyChoice:
    """The answer at one budget (FLOPs per problem): the configuration chosen per bin (None:
    nothing fits it), the policy's and the single best configuration's held-out figures (None:
    not defined at this budget), and the single configuration chosen."""

    budget: float
    per_bin: tuple[Key | None, ...]
    policy: Outcome | None
    single: Key | None
    single_outcome: Outcome | None

    def to_dict(self) -> dict:
        def shown(outcome):
            return None if outcome is None else {"accuracy": outcome.accuracy, "flops": outcome.flops}

        return {"budget_flops": self.budget, "per_bin": [None if key is None else list(key) for key in self.per_bin],
                "policy": shown(self.policy), "single": None if self.single is None else list(self.single),
                "single_held_out": shown(self.single_outcome)}


def difficulty_bins(shares: Sequence[float], bins: int) -> list[int]:
    """b = min(⌊d · B⌋, B − 1) for each share d in [0, 1]: bin 0 the least agreement (hardest)."""
    if isinstance(bins, bool) or not isinstance(bins, int) or bins < 1:
        raise ValueError(f"bins={bins!r} is out of range: must be an integer >= 1")
    for share in shares:
        if not 0.0 <= share <= 1.0:
            raise ValueError(f"difficulty share {share!r} is out of range: must be in [0, 1]")
    return [min(math.floor(share * bins), bins - 1) for share in shares]


def split_halves(count: int, seed: int) -> tuple[list[int], list[int]]:
    """(train, held_out) problem indices: range(count) shuffled by an rng seeded from `seed`, the
    first ⌊count/2⌋ train, the rest held out (each sorted)."""
    order = list(range(count))
    random.Random(stable_seed(seed, "difficulty split")).shuffle(order)
    half = count // 2
    return sorted(order[:half]), sorted(order[half:])


def _charge(key: Key, flops: float, probe: float) -> float:
    """f(c, p): a continuation's prefix covers the probe; anything else pays the probe on top."""
    return max(probe, flops) if key[1].endswith(CONTINUED) else probe + flops


def _best(table: dict, problems: Sequence[int], budget: float, probe: Sequence[float]) -> Key | None:
    """The configuration of `table` most accurate on `problems` whose mean charge there (`_charge`
    with the per-problem probe FLOPs `probe`; a list of zeros for none) fits `budget`; ties: fewer
    FLOPs, then order."""
    if not problems:
        return None
    best, best_rank = None, None
    for key, (scores, flops) in table.items():
        mean_flops = sum(_charge(key, flops[i], probe[i]) for i in problems) / len(problems)
        if mean_flops > budget:
            continue
        rank = (-sum(scores[i] for i in problems) / len(problems), mean_flops)
        if best_rank is None or rank < best_rank:
            best, best_rank = key, rank
    return best


def _outcome(table: dict, chosen: Sequence[Key], problems: Sequence[int], probe: Sequence[float]) -> Outcome:
    """Mean score and FLOPs (`_charge`d) on `problems`, problem i answered by chosen[j] (j its place)."""
    scores = [table[key][0][i] for key, i in zip(chosen, problems)]
    flops = [_charge(key, table[key][1][i], probe[i]) for key, i in zip(chosen, problems)]
    return Outcome(sum(scores) / len(scores), sum(flops) / len(flops))


def _allot(table: dict, groups: Sequence[Sequence[int]], count: int, budget: float,
           probe: Sequence[float]) -> tuple[Key, ...] | None:
    """One configuration per group of training problems (a bin's), maximizing the summed score
    with the summed `_charge` over the `count` training problems at most budget · count; None
    when nothing fits. Exact: the Pareto-pruned merge of the module's docstring."""
    keys = list(table)
    states = [(0.0, 0.0, ())]  # (summed charge, summed score, indices into keys), non-dominated
    for group in groups:
        options = [(sum(_charge(key, table[key][1][i], probe[i]) for i in group),
                    sum(table[key][0][i] for i in group), j) for j, key in enumerate(keys)]
        states = _undominated([(cost + more, score + gain, chosen + (j,))
                               for cost, score, chosen in states for more, gain, j in _undominated(options)])
    fitting = [state for state in states if state[0] / count <= budget]
    if not fitting:
        return None
    chosen = max(fitting, key=lambda state: (state[1], -state[0], [-j for j in state[2]]))[2]
    return tuple(keys[j] for j in chosen)


def _undominated(states: list) -> list:
    """The states (cost, score, tie-breaker) no other beats: sorted by cost, then score descending,
    then tie-breaker, each kept only when more accurate than every cheaper-or-equal one before it."""
    kept, best = [], -math.inf
    for state in sorted(states, key=lambda state: (state[0], -state[1], state[2])):
        if state[1] > best:
            kept.append(state)
            best = state[1]
    return kept


def difficulty_policy(table: dict[Key, tuple[Sequence[float], Sequence[float]]], shares: Sequence[float],
                      probe: Sequence[float], bins: int, budgets: Sequence[float], seed: int) -> list[PolicyChoice]:
    """One `PolicyChoice` per budget. table: configuration -> (per-problem scores, per-problem
    FLOPs), every list in the same problem order, FLOPs known; a key whose strategy ends in
    `CONTINUED` is a continuation of the probe (`summary.summarize(continue_after=k)`), offered
    per bin only; shares: each problem's first-round agreement d_p; probe: each problem's FLOPs
    for that first round. ValueError for lists of unequal length, fewer than 2 problems, or a
    configuration of unknown FLOPs (None)."""
    count = len(shares)
    if count < 2:
        raise ValueError(f"the difficulty policy needs at least 2 problems (a training and a held-out half), "
                         f"got {count}")
    if len(probe) != count:
        raise ValueError(f"probe has {len(probe)} problems, shares {count}: give one per problem")
    for key, (scores, flops) in table.items():
        if len(scores) != count or len(flops) != count:
            raise ValueError(f"configuration {key} has {len(scores)} scores and {len(flops)} FLOPs "
                             f"for {count} problems")
        if any(value is None for value in flops):
            raise ValueError(f"configuration {key} has unknown FLOPs: it cannot be placed under a budget")
    binned = difficulty_bins(shares, bins)
    train, held = split_halves(count, seed)
    zeros = [0.0] * count
    choices = []
    fresh = {key: value for key, value in table.items() if not key[1].endswith(CONTINUED)}
    trained = [b for b in range(bins) if any(binned[i] == b for i in train)]
    groups = [[i for i in train if binned[i] == b] for b in trained]
    for budget in budgets:
        single = _best(fresh, train, budget, zeros)
        allotted = dict(zip(trained, _allot(table, groups, len(train), budget, probe) or [None] * len(trained)))
        per_bin = tuple(allotted[b] if b in allotted else single for b in range(bins))
        needed = {binned[i] for i in held}
        policy = None
        if all(per_bin[b] is not None for b in needed):
            policy = _outcome(table, [per_bin[binned[i]] for i in held], held, probe)
        outcome = None if single is None else _outcome(fresh, [single] * len(held), held, zeros)
        choices.append(PolicyChoice(float(budget), per_bin, policy, single, outcome))
    return choices


def format_policy(choices: Sequence[PolicyChoice], bins: int, held_out: int, markdown: bool = False) -> str:
    """The text (plain, or Markdown with a pipe table) of `difficulty_policy`: per budget
    (TFLOPs), the held-out accuracy and TFLOPs of the policy and of the single best
    configuration, and the choice per bin (bin 0 hardest); a note under the table where a held-out
    mean exceeds its budget (the choices fit it on the training half)."""
    def named(key):
        return "–" if key is None else " ".join(part for part in (key[0], key[1], f"n={key[2]}") if part)

    def shown(outcome):
        return "nothing fits" if outcome is None else f"{outcome.accuracy:.3f} @ {outcome.flops / 1e12:.4g}"

    rows = [[f"{choice.budget / 1e12:.4g}", shown(choice.policy), shown(choice.single_outcome),
             f"single: {named(choice.single)}; " + "; ".join(f"bin {b}: {named(key)}"
                                                            for b, key in enumerate(choice.per_bin))]
            for choice in choices]
    over = [f"{choice.budget / 1e12:.4g}" for choice in choices
            if any(outcome is not None and outcome.flops > choice.budget
                   for outcome in (choice.policy, choice.single_outcome))]
    notes = [f"held-out FLOPs above the budget at {', '.join(over)} TFLOPs: the choices fit it on the training "
             "half, and the held-out problems cost more"] if over else []
    return (f"per-difficulty policy ({bins} bins by first-round agreement, {held_out} held-out problems; "
            "accuracy @ TFLOPs per problem)" + "\n" * (1 + markdown)
            + with_notes(Table(["budget TFLOPs", "policy", "single best", "choices"], rows,
                               ["right", "left", "left", "left"]).render(markdown), notes, markdown))


def probe_round(pools: dict, problems: Sequence, config, k: int, modes: str | None = None) -> tuple[list, list]:
    """(shares, probe FLOPs): per problem, the agreement of the vote over the first k samples of
    its pool in stored order (self_consistency, code_cluster for a code problem) and their cost's
    FLOPs (None when unknown). pools: problem id -> the probe model's `Pool`."""
    shares, flops = [], []
    for problem in problems:
        spec = get_strategy("code_cluster" if problem.is_code else "self_consistency")
        prompt, params = request(problem, config, modes)
        result = spec.run(PoolGenerator(pools[problem.id], range(k)), prompt, k, params, config.options, None)
        shares.append(agreement(result.votes, k))
        flops.append(result.cost.flops)
    return shares, flops
