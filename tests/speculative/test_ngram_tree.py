"""The n-gram drafter's token trees: on a hand-built row the tree is the hand-computed one
(prompt-lookup continuations latest first, longest suffix first, then the n-gram table, distinct
tokens as siblings, breadth first within the widths, the node budget and γ); through the loop
the multi-draft rule keeps plain sampling's law (chi-square over whole sequences on the toy
model) and greedy equals plain greedy."""

from __future__ import annotations

import pytest

from metagen.decoding import generate
from metagen.decoding.draft_loop import check_draft
from metagen.sampling import SamplingParams
from metagen.speculative import NgramDrafter, SpeculativeConfig, speculative_generate
from metagen.speculative.ngram_tree import NgramTreeDrafter

from tests.decoding.helpers import assert_follows
from tests.decoding.toy_model import BOS, C, A, B
from tests.speculative.test_loop import chain_distribution
from tests.speculative.test_tree import TreeToyModel

pytestmark = pytest.mark.usefixtures("one_thread")

TREE = SpeculativeConfig(num_draft_tokens=3, verify="multi-draft")
# index:   0  1  2  3  4  5  6  7  8  9 10 11 12
CONTEXT = [5, 1, 2, 5, 1, 3, 9, 1, 4, 2, 6, 5, 1]
PAST_OUTPUT = [1, 7, 8]  # the table learns (1,) -> 7, (7,) -> 8, (1, 7) -> 8


def hand_built(widths=(4, 2), max_nodes=16) -> NgramTreeDrafter:
    drafter = NgramTreeDrafter(widths, max_nodes, max_ngram=2, min_ngram=1)
    drafter.finish([PAST_OUTPUT])
    drafter.start(CONTEXT, 2)
    return drafter


def test_the_tree_is_the_hand_computed_one():
    """Root (suffix 5 1): after "5 1" came 3 (pos 5) then 2 (pos 2); after "1" came 4 (pos 8),
    then 3 and 2 again; the table adds 7. Children: after "1 3" only 9; after "1 2" came 5, and
    after "2" 6 (pos 10, latest) and 5; after "1 4" only 2; after "1 7" the table's 8."""
    draft = hand_built().propose([CONTEXT, CONTEXT], [2, 1], None, None)
    assert draft.tokens[0] == [3, 2, 4, 7, 9, 5, 6, 2, 8]
    assert draft.parents[0] == [-1, -1, -1, -1, 0, 1, 1, 2, 3]
    assert (draft.tokens[1], draft.parents[1]) == ([3, 2, 4, 7], [-1, -1, -1, -1])  # γ = 1: the roots only
    assert draft.probs == [None, None]  # point masses
    check_draft(draft, [2, 1], 16, "ngram", trees=True)


def test_the_node_budget_is_filled_breadth_first_and_widths_bound_the_depth():
    draft = hand_built(max_nodes=6).propose([CONTEXT], [5], None, None)
    assert (draft.tokens[0], draft.parents[0]) == ([3, 2, 4, 7, 9, 5], [-1, -1, -1, -1, 0, 1])
    draft = hand_built(widths=(1, 1, 1)).propose([CONTEXT], [3], None, None)
    assert draft.is_chain and draft.tokens[0] == [3, 9, 1]  # "3 9" is followed by "1" (pos 7)


def test_the_first_child_is_the_chain_lookup_s_next_token():
    chain = NgramDrafter(max_ngram=2, min_ngram=1)
    chain.finish([PAST_OUTPUT])
    chain.start(CONTEXT, 1)
    first = chain.propose([CONTEXT], [1], None, None).tokens[0]
    assert first == hand_built().propose([CONTEXT], [1], None, None).tokens[0][:1]


def test_rows_keep_their_own_index():
    drafter = hand_built()
    drafter.select([1])
    longer = CONTEXT + [3, 9]  # now "9" was followed by "1" only
    assert drafter.propose([longer], [1], None, None).tokens[0][:1] == [1]


@pytest.mark.parametrize("options, message", [({"widths": ()}, "widths=()"), ({"max_nodes": 0}, "max_nodes=0"),
                                              ({"scan": 0}, "scan=0")])
def test_options_are_checked(options, message):
    with pytest.raises(ValueError, match=message):
        NgramTreeDrafter(**options)


PROMPT = [BOS, A, C, A, B, A, C]  # "a" was followed by "c" and "b": the roots branch


def test_sampled_sequences_follow_the_target_distribution():
    params = SamplingParams(n=3000, max_tokens=4, seed=5)
    drafter = NgramTreeDrafter((2, 2, 1), max_ngram=2)
    result = speculative_generate(TreeToyModel(), drafter, PROMPT, params, TREE)
    assert_follows((tuple(c.token_ids) for c in result.completions), chain_distribution(params, PROMPT, 4))
    assert 0 < result.cost.accepted_tokens < result.cost.draft_tokens
    assert result.cost.draft_tokens > 3 * (result.cost.target_steps - params.n)  # more nodes than a chain's


@pytest.mark.parametrize("fields", [{}, {"repetition_penalty": 1.3}, {"stop": ["ca"]}],
                         ids=["plain", "penalty", "stop"])
def test_greedy_equals_plain_greedy(fields):
    params = SamplingParams(temperature=0, max_tokens=8, **fields)
    plain = generate(TreeToyModel(), PROMPT, params).completions[0]
    spec = speculative_generate(TreeToyModel(), NgramTreeDrafter((2, 2, 1)), PROMPT, params, TREE).completions[0]
    assert spec.token_ids == plain.token_ids
    assert (spec.text, spec.finish_reason) == (plain.text, plain.finish_reason)
