"""Medusa draft heads on toys: the best-first Cartesian tree on hand-computed scores, the tree's
shape within its widths and budget, the output law unchanged under the multi-draft rule
(chi-square), greedy equal to plain greedy, and training recovering the map of a model whose
state k tokens ahead is a linear function of today's."""

from __future__ import annotations

import math

import pytest
import torch

from metagen.decoding import generate
from metagen.models.base import ForwardOutput
from metagen.sampling import SamplingParams
from metagen.speculative import SpeculativeConfig, speculative_generate
from metagen.speculative.medusa import MedusaDrafter, MedusaHeads, medusa_tree
from metagen.speculative.medusa_training import train_medusa_heads

from tests.decoding.helpers import assert_follows
from tests.decoding.toy_model import BOS, VOCAB, A, B, C
from tests.speculative.test_loop import PROMPT, chain_distribution
from tests.speculative.test_tree import TreeToyModel

pytestmark = pytest.mark.usefixtures("one_thread")

TREE = SpeculativeConfig(num_draft_tokens=3, verify="multi-draft")
READOUT = torch.randn(VOCAB, VOCAB, generator=torch.Generator().manual_seed(5))  # (V, H): logits = R h


class HiddenTreeToyModel(TreeToyModel):
    """The tree toy with hidden states: the one-hot (V,) of each fed token; `logits_from_hidden`
    reads a state out with READOUT (what Medusa heads use as the LM head)."""

    name = "toy-hidden-tree"

    def forward(self, cache, tokens, *, logits="last", hidden=False, tree=None) -> ForwardOutput:
        rows = tokens.tolist() if isinstance(tokens, torch.Tensor) else [list(row) for row in tokens]
        out = super().forward(cache, rows, logits=logits, tree=tree)
        if not hidden:
            return out
        assert logits == "all"
        width = max(len(row) for row in rows)
        fed = torch.tensor([row + [row[-1]] * (width - len(row)) for row in rows])  # (B, T)
        return ForwardOutput(out.logits, torch.nn.functional.one_hot(fed, VOCAB).float(), out.num_new)

    def logits_from_hidden(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden @ READOUT.T


def random_heads(num_heads: int = 3, scale: float = 1.0, seed: int = 0) -> MedusaHeads:
    heads = MedusaHeads(num_heads, {"hidden_size": VOCAB})
    heads.maps = torch.randn(num_heads, VOCAB, VOCAB, generator=torch.Generator().manual_seed(seed)) * scale
    return heads


def test_the_tree_grows_best_first_over_the_cartesian_product():
    # head 1: 10 (0.6), 11 (0.25); head 2: 20 (0.5), 21 (0.4). Paths by probability:
    # 10 .6, 10-20 .3, 11 .25, 10-21 .24, 11-20 .125, 11-21 .1
    values = [[math.log(0.6), math.log(0.25)], [math.log(0.5), math.log(0.4)]]
    ids = [[10, 11], [20, 21]]
    assert medusa_tree(values, ids, 4) == ([10, 20, 11, 21], [-1, 0, -1, 0])
    assert medusa_tree(values, ids, 6) == ([10, 20, 11, 21, 20, 21], [-1, 0, -1, 0, 2, 2])
    assert medusa_tree(values, ids, 1) == ([10], [-1])
    assert medusa_tree(values[:1], ids[:1], 16) == ([10, 11], [-1, -1])


def test_proposals_keep_the_widths_the_budget_and_the_row_s_length():
    drafter = MedusaDrafter(HiddenTreeToyModel(), random_heads(), widths=(3, 2, 2), max_nodes=9)
    drafter.start([BOS], 3)
    assert drafter.propose([[BOS]] * 3, [3, 3, 3], None, None).tokens == [[], [], []]  # no state yet
    states = torch.nn.functional.one_hot(torch.tensor([[A, B], [C, A], [B, B]]), VOCAB).float()  # (B, T, H)
    drafter.observe_hidden(states, [([], A), ([0], B), ([], C)])
    torch.testing.assert_close(drafter.states[1], states[1, 1])  # the kept path's last position
    draft = drafter.propose([[BOS, A]] * 3, [3, 1, 0], None, None)
    assert len(draft.tokens[0]) == 9 and draft.tokens[2] == []
    assert all(draft.depth(0, i) <= 3 for i in range(9)) and all(p == -1 for p in draft.parents[1])
    assert len(draft.tokens[1]) == 3  # γ = 1: head 1's three candidates only
    for node in [-1, *range(9)]:
        depth = 0 if node == -1 else draft.depth(0, node)
        assert len(draft.children(0, node)) <= (3, 2, 2, 0)[depth]
    drafter.select([1])
    assert len(drafter.states) == 1 and torch.equal(drafter.states[0], states[1, 1])


@pytest.mark.parametrize("widths, max_nodes, message", [
    ((0, 2), 8, "widths=.*ints >= 1"), ((2,), 0, "max_nodes=0"), ((2, 2, 2, 2), 8, "the Medusa heads have 3"),
])
def test_the_tree_shape_is_checked(widths, max_nodes, message):
    with pytest.raises(ValueError, match=message):
        MedusaDrafter(HiddenTreeToyModel(), random_heads(), widths=widths, max_nodes=max_nodes)


@pytest.mark.parametrize("widths", [(2, 2, 1), (4,), (1, 1, 1)])
def test_sampled_sequences_follow_the_target_distribution(widths):
    params = SamplingParams(n=3000, max_tokens=4, seed=11)
    drafter = MedusaDrafter(HiddenTreeToyModel(), random_heads(), widths=widths, max_nodes=8)
    result = speculative_generate(HiddenTreeToyModel(), drafter, PROMPT, params, TREE)
    assert_follows((tuple(c.token_ids) for c in result.completions), chain_distribution(params, PROMPT, 4))
    assert 0 < result.cost.accepted_tokens < result.cost.draft_tokens


@pytest.mark.parametrize("fields", [{}, {"repetition_penalty": 1.3}, {"stop": ["ca"]}],
                         ids=["plain", "penalty", "stop"])
@pytest.mark.parametrize("prompt", [[BOS], PROMPT, [BOS, C, A, C, A, C]])
def test_greedy_equals_plain_greedy(fields, prompt):
    params = SamplingParams(temperature=0, max_tokens=7, **fields)
    plain = generate(HiddenTreeToyModel(), prompt, params).completions[0]
    drafter = MedusaDrafter(HiddenTreeToyModel(), random_heads(seed=1), widths=(3, 2), max_nodes=8)
    spec = speculative_generate(HiddenTreeToyModel(), drafter, prompt, params, TREE).completions[0]
    assert spec.token_ids == plain.token_ids and spec.text == plain.text


class CycleModel:
    """A deterministic model cycling a -> b -> c -> a: the state at each position is the one-hot
    of its token, and its LM head reads out the successor (logits 10 · S h)."""

    vocab_size, max_context = VOCAB, 64
    successor = torch.zeros(VOCAB, VOCAB)
    successor[B, A] = successor[C, B] = successor[A, C] = 1.0

    def new_cache(self, batch_size: int = 1):
        return None

    def forward(self, cache, tokens, *, logits="all", hidden=False) -> ForwardOutput:
        states = torch.nn.functional.one_hot(torch.tensor(tokens), VOCAB).float()  # (1, T, H)
        return ForwardOutput(self.logits_from_hidden(states), states, [len(tokens[0])])

    def logits_from_hidden(self, hidden: torch.Tensor) -> torch.Tensor:
        return 10.0 * hidden @ self.successor.T


def test_training_recovers_the_state_k_tokens_ahead():
    cycle = [A, B, C]
    sequences = [[cycle[(start + t) % 3] for t in range(20)] for start in (0, 1, 2, 0, 1, 2)]
    heads, report = train_medusa_heads(CycleModel(), sequences, num_heads=2, held_out=0.34,
                                       identity={"hidden_size": VOCAB})
    assert report.agreement_before == (0.0, 0.0)  # the LM head read early guesses the next token
    assert report.agreement_after == (1.0, 1.0)
    y = heads(torch.nn.functional.one_hot(torch.tensor([A]), VOCAB).float())  # (1, K, H): from "a"
    assert CycleModel().logits_from_hidden(y)[0].argmax(-1).tolist() == [C, A]  # tokens 2 and 3 after "a"


def test_training_checks_its_arguments():
    with pytest.raises(ValueError, match="held_out=1.0"):
        train_medusa_heads(CycleModel(), [[A, B, C, A]] * 3, held_out=1.0, identity={"hidden_size": VOCAB})
    with pytest.raises(ValueError, match="at least 2 sequences"):
        train_medusa_heads(CycleModel(), [[A, B, C, A, B]], identity={"hidden_size": VOCAB})
