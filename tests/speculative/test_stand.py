"""STAND: the store of observed target distributions equals the hand-computed table, it is shared
by the rows of one request, its sampled trees keep the target's law exactly (chi-square over
whole sequences on the enumerable toy model, and the best-of-N choice's law), and greedy trees
give plain greedy's tokens on the embedded SmolLM2."""

from __future__ import annotations

import math
from bisect import bisect_left

import pytest
import torch

from metagen.decoding import generate
from metagen.sampling import SamplerChain, SamplingParams
from metagen.speculative import SpeculativeConfig, SpeculativeGenerator, make_drafter, speculative_generate
from metagen.speculative.stand import NgramDistributions, StandDrafter
from metagen.strategies.best_of_n import BestOfNConfig, best_of_n

from tests.decoding.helpers import assert_follows
from tests.decoding.toy_model import BOS, VOCAB, ToyModel
from tests.speculative.test_loop import PROMPT, chain_distribution
from tests.speculative.test_tree import TreeToyModel

TREE = SpeculativeConfig(num_draft_tokens=3, verify="multi-draft")


def chain_of(params: SamplingParams, rows: int) -> SamplerChain:
    return SamplerChain.from_params(params, rows, 8, [1])


# ------------------------------------------------------------------------------ the store


def test_store_after_hand_made_observations_equals_the_hand_computed_table():
    store = NgramDistributions(min_ngram=1, max_ngram=2, top_k=2)
    store.add([5, 6], [7, 1], [0.5, 0.25])
    store.add([9, 6], [7, 2], [0.25, 0.5])
    store.add([6], [3], [1.0])  # too short for the 2-gram
    assert store.table == {
        (6,): {7: 0.75, 1: 0.25, 2: 0.5, 3: 1.0},
        (5, 6): {7: 0.5, 1: 0.25},
        (9, 6): {7: 0.25, 2: 0.5},
    }
    assert store.lookup([0, 5, 6]) == {7: 0.5, 1: 0.25}  # the longest suffix with an entry
    assert store.lookup([4, 6]) == store.table[(6,)]
    assert store.lookup([4]) is None


def test_observe_stores_the_top_k_of_the_processed_distribution_per_committed_position():
    """Row 0 committed [3, 4] after context [..., 1, 2]: the position before 3 follows (1, 2),
    the one before 4 follows (2, 3); temperature 0.5 squares and renormalises the probabilities."""
    drafter = StandDrafter(max_ngram=2, top_k=2)
    drafter.start([1, 2], 1)
    params = SamplingParams(temperature=0.5)
    drafter.propose([[1, 2]], [3], chain_of(params, 1), None)  # nothing observed: no draft
    base = torch.tensor([[0.4, 0.25, 0.15, 0.1, 0.1, 0.0, 0.0, 0.0]] * 2).clamp(min=1e-30).log()
    drafter.observe([[2, 3]], base[None], [([0], 4)])  # t0 = 2, node 0 (token 3) kept, then 4 drawn
    q = [0.16 / 0.265, 0.0625 / 0.265]  # (0.4², 0.25²) / Σ p²: tokens 0 and 1
    table = {key: {t: round(p, 6) for t, p in entry.items()} for key, entry in drafter.store.table.items()}
    expected = {key: {0: round(q[0], 6), 1: round(q[1], 6)} for key in [(2,), (1, 2), (3,), (2, 3)]}
    assert table == expected


def test_the_store_is_shared_across_rows():
    """Row 0's observation after (6, 7) drafts for row 1 when row 1 reaches (6, 7)."""
    drafter = StandDrafter(widths=(2,), max_ngram=2, top_k=1)
    drafter.start([1], 2)
    params = SamplingParams(temperature=1.0)
    chain = chain_of(params, 2)
    empty = drafter.propose([[1, 6, 7], [1, 2, 3]], [1, 1], chain, None)
    assert empty.tokens == [[], []]
    logits = torch.full((1, 8), -30.0)
    logits[0, 5] = 0.0  # the target puts (almost) all its mass on 5 after row 0's (6, 7)
    drafter.observe([[7]], logits[None], [([], 5)])  # row 0: nothing kept, 5 drawn after t0 = 7
    draft = drafter.propose([[1, 2, 3], [1, 2, 6, 7]], [1, 1], chain, torch.Generator().manual_seed(0))
    assert draft.tokens == [[], [5]] and draft.parents == [[], [-1]]
    assert draft.probs[0] is None and float(draft.probs[1][0, 5]) == pytest.approx(1.0)


def test_sampled_siblings_are_distinct_and_carry_their_parents_distribution():
    drafter = StandDrafter(widths=(3, 1), max_ngram=1, top_k=4)
    drafter.start([1], 1)
    drafter._vocab = 8
    for token, p in ((2, 0.4), (3, 0.3), (4, 0.2), (5, 0.1)):
        drafter.store.add([1], [token], [p])
    drafter.store.add([2], [6], [1.0])
    chain = chain_of(SamplingParams(temperature=1.0), 1)
    draft = drafter.propose([[1]], [2], chain, torch.Generator().manual_seed(3))
    roots = [i for i, parent in enumerate(draft.parents[0]) if parent == -1]
    assert len(roots) == 3 and len({draft.tokens[0][i] for i in roots}) == 3
    expected = torch.tensor([0.0, 0.0, 0.4, 0.3, 0.2, 0.1, 0.0, 0.0])
    assert all(torch.allclose(draft.probs[0][i], expected) for i in roots)
    greedy = drafter.propose([[1]], [2], chain_of(SamplingParams(temperature=0), 1), None)
    assert greedy.tokens == [[2, 3, 4, 6]] and greedy.parents == [[-1, -1, -1, 0]] and greedy.probs == [None]


def test_a_confident_context_gets_the_children_covering_its_mass_only():
    drafter = StandDrafter(widths=(3,), coverage=0.9)
    drafter._vocab = 8
    chain = chain_of(SamplingParams(temperature=1.0), 1)
    drafter.store.add([1], [2, 3, 4], [0.92, 0.05, 0.03])
    assert len(drafter.propose([[1]], [1], chain, torch.Generator().manual_seed(0)).tokens[0]) == 1
    drafter.store.add([1], [3, 4], [0.9, 0.1])  # s = (0.46, 0.475, 0.065): two tokens cover 0.9
    assert len(drafter.propose([[1]], [1], chain, torch.Generator().manual_seed(0)).tokens[0]) == 2


def test_gumbel_top_k_orders_follow_draws_without_replacement():
    """P(first = t) = s(t); P(second = u | first = t) = s(u) / (1 − s(t))."""
    drafter = StandDrafter()
    drafter._vocab = 4
    entry = {0: 0.5, 1: 0.3, 2: 0.2}
    generator = torch.Generator().manual_seed(5)
    pairs = [tuple(drafter._children(entry, 2, False, generator)[0]) for _ in range(6000)]
    expected = {(a, b): entry[a] * entry[b] / (1 - entry[a]) for a in entry for b in entry if a != b}
    assert_follows(pairs, expected)


@pytest.mark.parametrize("options, message", [({"widths": ()}, "widths=()"), ({"max_nodes": 0}, "max_nodes=0"),
                                              ({"top_k": 0}, "top_k=0"), ({"coverage": 0.0}, "coverage=0.0"),
                                              ({"min_ngram": 3, "max_ngram": 2},
                                                                          "min_ngram=3")])
def test_stand_options_are_checked(options, message):
    with pytest.raises(ValueError, match=message):
        StandDrafter(**options)


# ------------------------------------------------------------------ the output distribution


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("fields", [{}, {"temperature": 0.7, "top_k": 3}, {"repetition_penalty": 1.6}],
                         ids=["plain", "temperature-top_k", "penalty"])
def test_stand_sequences_follow_the_target_distribution(fields):
    """3000 rows of one request share the store: their drafts come from each other's observations."""
    params = SamplingParams(n=3000, max_tokens=4, seed=17, **fields)
    result = speculative_generate(TreeToyModel(), StandDrafter(widths=(2, 2, 1)), PROMPT, params, TREE)
    assert_follows((tuple(c.token_ids) for c in result.completions), chain_distribution(params, PROMPT, 4))
    assert 0 < result.cost.accepted_tokens < result.cost.draft_tokens


@pytest.mark.usefixtures("one_thread")
def test_best_of_n_choice_follows_the_plain_law():
    """The best of N = 4 by a fixed total order on sequences: P(best ≤ s) = F(s)^N under plain
    sampling's law F; the rows of each request draft for each other, so a dependence between
    them would move this law."""
    n, calls = 4, 1500
    params = SamplingParams(max_tokens=5)
    law = chain_distribution(params, [BOS], 5)
    order = sorted(law)  # score = rank in lexicographic order
    cumulative, total = [], 0.0
    for sequence in order:
        total += law[sequence]
        cumulative.append(total)
    expected = {s: cumulative[i] ** n - (cumulative[i - 1] ** n if i else 0.0) for i, s in enumerate(order)}
    generator = SpeculativeGenerator(TreeToyModel(), StandDrafter(widths=(2, 1)), TREE, chat=False)
    score = lambda prompt, completion: float(bisect_left(order, tuple(completion.token_ids)))  # noqa: E731
    rng = torch.Generator().manual_seed(29)
    chosen, drafted = [], 0
    for _ in range(calls):
        result = best_of_n(generator, [BOS], BestOfNConfig(n, params), score, rng=rng)
        chosen.append(tuple(result.chosen.token_ids))
        drafted += result.cost.accepted_tokens
    assert drafted > 0
    assert_follows(chosen, expected)
    assert math.isclose(sum(expected.values()), 1.0, rel_tol=1e-9)


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("prompt", [[BOS], PROMPT])
def test_stand_greedy_equals_plain_greedy_on_the_toy_model(prompt):
    params = SamplingParams(temperature=0, max_tokens=9, ignore_eos=True)
    plain = generate(ToyModel(), prompt, params).completions[0]
    spec = speculative_generate(TreeToyModel(), StandDrafter(), prompt, params, TREE)
    assert spec.completions[0].token_ids == plain.token_ids
    assert spec.cost.draft_tokens > 0


def test_registered_by_name_with_the_tree_rule():
    drafter = make_drafter("stand", None, tree_widths=(2, 1), tree_nodes=5)
    assert isinstance(drafter, StandDrafter) and (drafter.widths, drafter.max_nodes) == ((2, 1), 5)
    generator = SpeculativeGenerator.by_name(ToyModel(), "stand")
    assert generator.config.verify == "multi-draft"
    with pytest.raises(ValueError, match="exit_layer=3 does not apply to the stand drafter"):
        make_drafter("stand", None, exit_layer=3)


# ------------------------------------------------------------------------------ the real model


@pytest.mark.slow
def test_stand_greedy_equals_plain_greedy_on_smollm2(model_fp32):
    from tests.speculative.test_real_model import PROMPTS, assert_same_greedy

    spec = assert_same_greedy(model_fp32, StandDrafter(), PROMPTS["open"], SpeculativeConfig(
        num_draft_tokens=4, verify="multi-draft"), max_tokens=64)
    assert spec.cost.draft_tokens > 0 and spec.cost.accepted_tokens > 0
