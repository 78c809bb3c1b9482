"""DySpec's dynamic trees: on a table draft the heap expands nodes in the order computed by hand,
with a draft forward only when the node it pops has no distribution yet; through the loop under
the multi-draft rule whole sequences follow plain sampling and greedy equals plain greedy."""

from __future__ import annotations

import pytest
import torch

from metagen.decoding import generate
from metagen.models.base import ForwardOutput
from metagen.sampling import SamplerChain, SamplingParams
from metagen.speculative import SpeculativeConfig, speculative_generate
from metagen.speculative.dyspec import DySpecDrafter

from tests.decoding.helpers import assert_follows
from tests.decoding.toy_model import BOS, EOS, VOCAB, A, B, C, ToyModel
from tests.speculative.test_loop import PROMPT, chain_distribution
from tests.speculative.test_tree import DraftTreeToyModel, TreeToyModel

pytestmark = pytest.mark.usefixtures("one_thread")

MULTI = SpeculativeConfig(num_draft_tokens=3, verify="multi-draft")

# first-order draft: the next-token distribution after token t (columns EOS, a, b, c, BOS)
TABLE = {
    BOS: (0.04, 0.60, 0.25, 0.10, 0.01),
    A: (0.05, 0.10, 0.20, 0.60, 0.05),
    B: (0.05, 0.70, 0.10, 0.10, 0.05),
    C: (0.02, 0.03, 0.03, 0.90, 0.02),
    EOS: (0.20, 0.20, 0.20, 0.20, 0.20),
}


class TableTreeModel(TreeToyModel):
    """Logits log TABLE[last token of the node's path]: distributions one can multiply by hand."""

    name = "table"

    def forward(self, cache, tokens, *, logits="last", hidden=False, tree=None) -> ForwardOutput:
        per_row = []
        for cached, new in zip(cache.rows, tokens):  # node i's path ends in its own token
            per_row.append(torch.stack([torch.tensor(TABLE[new[i]]).log() for i in range(len(new))]))
            cached.extend(new)
        self.calls.append([len(new) for new in tokens])
        if logits == "none":
            return ForwardOutput(None, None, [len(new) for new in tokens])
        if logits == "last":
            return ForwardOutput(torch.stack([rows[-1] for rows in per_row]), None, [len(n) for n in tokens])
        padded = torch.zeros(len(per_row), max(len(rows) for rows in per_row), VOCAB)
        for b, rows in enumerate(per_row):
            padded[b, : len(rows)] = rows
        return ForwardOutput(padded, None, [len(new) for new in tokens])


def test_greedy_expansion_follows_the_hand_computed_heap_order():
    """γ = 3, 5 nodes after BOS; keys are v(n)·(mass left at n), v the product along the path.

    pop root (1)      -> a  (v .6);  root .4            heap: a .6, root .4
    pop a (.6)        -> a has no distribution: draft forward 1; then c (v .36);  a .24
    pop root (.4)     -> b  (v .25); root .15            heap: c .36, b .25, a .24, root .15
    pop c (.36)       -> draft forward 2 (c, b); c after "a c" (v .324, at depth 3: not pushed)
    pop b (.25)       -> a  (v .175): 5 nodes
    """
    drafter = DySpecDrafter(TableTreeModel(), max_nodes=5)
    drafter.start([BOS, BOS], 1)
    chain = SamplerChain.from_params(SamplingParams(temperature=0), 1, VOCAB)
    draft = drafter.propose([[BOS, BOS]], [3], chain, None)
    assert draft.tokens == [[A, C, B, C, A]]
    assert draft.parents == [[-1, 0, -1, 1, 2]]
    assert draft.calls == 3 and draft.probs == [None]  # catch-up + two tree forwards; greedy: point masses


def test_sampled_expansion_keeps_children_in_draw_order_with_their_parents_distribution():
    drafter = DySpecDrafter(TableTreeModel(), max_nodes=6)
    drafter.start([BOS, BOS], 1)
    chain = SamplerChain.from_params(SamplingParams(temperature=1.0), 1, VOCAB)
    for seed in range(20):
        draft = drafter.propose([[BOS, BOS]], [2], chain, torch.Generator().manual_seed(seed))
        tokens, parents, probs = draft.tokens[0], draft.parents[0], draft.probs[0]
        assert len(tokens) == 6 and not draft.iid_siblings
        depths = [draft.depth(0, i) for i in range(6)]
        assert max(depths) <= 2
        for node in [-1, *range(6)]:
            kids = draft.children(0, node)
            assert len({tokens[c] for c in kids}) == len(kids)  # without replacement
            expected = torch.tensor(TABLE[BOS if node < 0 else tokens[node]])
            for c in kids:
                assert torch.allclose(probs[c], expected, atol=1e-6)


def test_the_tree_grows_deep_where_the_draft_is_sure():
    """After c the table draft is 90% sure of c: with the prompt ending in c the tree is a deep
    chain of c; after BOS it hesitates (.6 / .25), so the root gets more children."""
    drafter = DySpecDrafter(TableTreeModel(), max_nodes=4)
    drafter.start([BOS, C], 2)
    chain = SamplerChain.from_params(SamplingParams(temperature=0), 2, VOCAB)
    draft = drafter.propose([[BOS, C], [BOS, BOS]], [4, 4], chain, None)
    assert draft.tokens[0] == [C, C, C, C] and draft.parents[0] == [-1, 0, 1, 2]
    assert len(draft.children(1, -1)) >= 2


@pytest.mark.parametrize("max_nodes", [4, 10])
def test_dyspec_sequences_follow_the_target_distribution(max_nodes):
    params = SamplingParams(n=3000, max_tokens=4, seed=19)
    result = speculative_generate(TreeToyModel(), DySpecDrafter(DraftTreeToyModel(), max_nodes=max_nodes), PROMPT,
                                  params, MULTI)
    assert_follows((tuple(c.token_ids) for c in result.completions), chain_distribution(params, PROMPT, 4))
    assert 0 < result.cost.accepted_tokens < result.cost.draft_tokens


def test_dyspec_with_stateful_processors_follows_the_target_distribution():
    params = SamplingParams(n=3000, max_tokens=4, seed=21, temperature=0.7, no_repeat_ngram_size=2,
                            presence_penalty=0.5)
    result = speculative_generate(TreeToyModel(), DySpecDrafter(DraftTreeToyModel()), PROMPT, params, MULTI)
    assert_follows((tuple(c.token_ids) for c in result.completions), chain_distribution(params, PROMPT, 4))


@pytest.mark.parametrize("prompt", [[BOS], PROMPT, [BOS, C, A, C]])
def test_dyspec_greedy_equals_plain_greedy(prompt):
    params = SamplingParams(temperature=0, max_tokens=7, stop_token_ids=[EOS])
    plain = generate(ToyModel(), prompt, params).completions[0]
    spec = speculative_generate(TreeToyModel(), DySpecDrafter(DraftTreeToyModel()), prompt, params,
                                MULTI).completions[0]
    assert spec.token_ids == plain.token_ids and spec.finish_reason == plain.finish_reason
    assert spec.logprobs == pytest.approx(plain.logprobs, abs=1e-5)


def test_max_nodes_is_checked():
    with pytest.raises(ValueError, match="max_nodes=0 must be an int >= 1"):
        DySpecDrafter(TableTreeModel(), max_nodes=0)
