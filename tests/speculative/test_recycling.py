"""Token recycling: the successor matrix after hand-made logits, the BFS tree from a hand-made
matrix, the loop handing every verified position's logits to the drafter, and the drafts
verified by the multi-draft rule (the target's law when sampling, plain greedy at temperature 0)."""

from __future__ import annotations

import pytest
import torch

from metagen.decoding import generate
from metagen.decoding.drafts import Draft, Drafter
from metagen.sampling import SamplingParams
from metagen.speculative import SpeculativeConfig, speculative_generate
from metagen.speculative.recycling import RecyclingDrafter, bfs_tree

from tests.decoding.helpers import assert_follows
from tests.decoding.toy_model import BOS, VOCAB, A, C
from tests.speculative.test_loop import PROMPT, chain_distribution
from tests.speculative.test_tree import TreeToyModel

pytestmark = pytest.mark.usefixtures("one_thread")

TREE = SpeculativeConfig(num_draft_tokens=3, verify="multi-draft")


def test_observe_stores_the_top_k_after_each_fed_token():
    """V = 6, k = 2. Row 0 feeds tokens 1, 4; row 1 feeds 4 (its logits win: the later entry)
    and padding after its one token is never read."""
    drafter = RecyclingDrafter(6, widths=(2, 1))
    logits = torch.tensor([[[0.0, 5, 1, 4, 2, 3], [9, 0, 1, 2, 3, 4]],
                           [[1.0, 2, 3, 4, 6, 5], [7, 7, 7, 7, 7, 7]]])  # (B=2, 2, V=6)
    drafter.observe([[1, 4], [4]], logits)
    expected = torch.full((6, 2), -1, dtype=torch.int32)
    expected[1] = torch.tensor([1, 3])  # top-2 of row 0, position 0: 5 at 1, 4 at 3
    expected[4] = torch.tensor([4, 5])  # row 1 position 0 (fed after row 0's 4): 6 at 4, 5 at 5
    assert torch.equal(drafter.successors, expected)
    assert drafter.successors.dtype == torch.int32 and drafter.successors.shape == (6, 2)


def test_bfs_tree_from_a_hand_made_matrix():
    """Root 0: children A[0, :2] = 1, 2; depth 2 (width 1): 1 -> 3, 2 -> 4; depth 3: 3 -> 0,
    4 -> unknown (-1, skipped)."""
    successors = torch.tensor([[1, 2, 3], [3, 0, 4], [4, 1, 0], [0, 2, 1], [-1, -1, -1]], dtype=torch.int32)
    assert bfs_tree(successors, 0, (2, 1, 1), 10) == ([1, 2, 3, 4, 0], [-1, -1, 0, 1, 2])
    assert bfs_tree(successors, 0, (2, 1, 1), 3) == ([1, 2, 3], [-1, -1, 0])  # the budget, breadth first
    assert bfs_tree(successors, 0, (3, 2), 10) == ([1, 2, 3, 3, 0, 4, 1, 0, 2], [-1, -1, -1, 0, 0, 1, 1, 2, 2])
    assert bfs_tree(successors, 4, (2, 1), 10) == ([], [])  # never observed: no draft


def test_propose_cuts_the_depth_to_the_rows_length():
    drafter = RecyclingDrafter(5, widths=(1, 1, 1))
    drafter.successors[:] = torch.tensor([[1], [2], [3], [4], [0]], dtype=torch.int32)
    draft = drafter.propose([[4, 0], [3]], [2, 0], None, None)
    assert draft.tokens == [[1, 2], []] and draft.parents == [[-1, 0], []] and draft.probs == [None, None]


class Recorder(Drafter):
    """Proposes nothing; records what the loop hands to `observe`."""

    name = "recorder"

    def __init__(self) -> None:
        self.seen: list[tuple[list[list[int]], torch.Tensor]] = []
        self.committed: list = []

    def propose(self, contexts, lengths, chain, generator) -> Draft:
        return Draft.chain([[] for _ in contexts])

    def observe(self, fed, logits, committed=None) -> None:
        self.seen.append(([list(row) for row in fed], logits.clone()))
        self.committed.append(committed)


def test_the_loop_hands_every_forward_to_observe():
    """After the prefill the prompt's last token, then per step t0 (+ draft nodes) with the
    target's raw logits after it."""
    recorder = Recorder()
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    result = speculative_generate(TreeToyModel(), recorder, PROMPT, params, TREE)
    tokens = result.completions[0].token_ids
    assert [fed for fed, _ in recorder.seen] == [[[PROMPT[-1]]], [[tokens[0]]], [[tokens[1]]]]
    assert recorder.committed == [None, [([], tokens[1])], [([], tokens[2])]]  # no draft kept, one drawn
    for (fed, logits), before in zip(recorder.seen, [PROMPT, PROMPT + tokens[:1], PROMPT + tokens[:2]]):
        assert logits.shape == (1, 1, VOCAB)
        assert int(logits[0, 0].argmax()) == tokens[len(before) - len(PROMPT)]


def test_invalid_options_are_refused():
    for options, message in [({"widths": ()}, "widths=()"), ({"max_nodes": 0}, "max_nodes=0"),
                             ({"widths": (3,), "candidates": 2}, "candidates=2 must be an int >= 3")]:
        with pytest.raises(ValueError, match=message):
            RecyclingDrafter(VOCAB, **options)
    with pytest.raises(ValueError, match="candidates=9 exceeds vocab_size=5"):
        RecyclingDrafter(VOCAB, widths=(2,), candidates=9)


@pytest.mark.parametrize("prompt", [[BOS], PROMPT, [BOS, C, A, C, A, C]])
def test_recycling_greedy_equals_plain_greedy_on_the_toy(prompt):
    params = SamplingParams(temperature=0, max_tokens=7)
    plain = generate(TreeToyModel(), prompt, params).completions[0]
    drafter = RecyclingDrafter(VOCAB, widths=(2, 1, 1))
    spec = speculative_generate(TreeToyModel(), drafter, prompt, params, TREE)
    assert spec.completions[0].token_ids == plain.token_ids
    assert (drafter.successors >= 0).any()  # it learned from the verify forwards


def test_recycled_trees_keep_the_target_distribution():
    """Point-mass trees at temperature 1: each child accepted with probability r(x)."""
    params = SamplingParams(n=3000, max_tokens=4, seed=8)
    drafter = RecyclingDrafter(VOCAB, widths=(2, 2, 1), max_nodes=8)
    result = speculative_generate(TreeToyModel(), drafter, PROMPT, params, TREE)
    assert_follows((tuple(c.token_ids) for c in result.completions), chain_distribution(params, PROMPT, 4))
    assert 0 < result.cost.accepted_tokens < result.cost.draft_tokens


@pytest.mark.slow
def test_recycling_greedy_equals_plain_greedy_on_smollm2(model_fp32):
    """The registered drafter on a repetitive prompt: plain greedy's tokens, and a second
    request (the matrix kept: hot start) accepts recycled tokens."""
    from metagen.speculative import make_drafter

    prompt = "one two three four five, one two three four five, one two three four five, one two"
    params = SamplingParams(temperature=0, max_tokens=24)
    drafter = make_drafter("recycling", model_fp32)
    plain = generate(model_fp32, prompt, params).completions[0].token_ids
    config = SpeculativeConfig(num_draft_tokens=4, verify="multi-draft")
    for _ in range(2):
        spec = speculative_generate(model_fp32, drafter, prompt, params, config)
        assert spec.completions[0].token_ids == plain
    assert spec.cost.accepted_tokens > 0 and spec.cost.block_efficiency > 1.0
