"""`Draft` as a tree per row: construction checks naming the field, the chain case and its
round trip, and the helpers (children, depth, paths) on a hand-drawn tree."""

from __future__ import annotations

import pytest
import torch

from metagen.decoding.draft_loop import check_draft
from metagen.decoding.drafts import Draft

#   row 0, after the committed tokens (-1):
#       0 (a) ─┬─ 1 (b) ── 3 (d)
#              └─ 2 (c)
#       4 (e)
TREE_PARENTS = [-1, 0, 0, 1, -1]
TREE_TOKENS = [10, 11, 12, 13, 14]


def tree() -> Draft:
    return Draft([TREE_TOKENS], [TREE_PARENTS], [None])


def test_a_chain_is_the_one_child_case_and_round_trips():
    draft = Draft.chain([[5, 6, 7], [], [9]])
    assert draft.parents == [[-1, 0, 1], [], [-1]]
    assert draft.probs == [None, None, None] and draft.is_chain
    assert [[draft.tokens[b][i] for i in path] for b in range(3) for path in draft.paths(b)] == [[5, 6, 7], [9]]
    assert draft.paths(1) == []
    assert [draft.depth(0, i) for i in range(3)] == [1, 2, 3]
    assert draft.children(0, -1) == [0] and draft.children(0, 1) == [2] and draft.children(0, 2) == []
    same = Draft(draft.tokens, draft.parents, draft.probs)
    assert same == draft and same.is_chain
    draft.require_chain("token verification")  # no error


def test_chain_keeps_the_draft_distributions_and_costs():
    probs = torch.softmax(torch.randn(2, 8, generator=torch.Generator().manual_seed(0)), -1)
    draft = Draft.chain([[1, 2]], [probs], calls=2, flops=3.5)
    assert draft.probs[0] is probs and draft.calls == 2 and draft.flops == 3.5


def test_tree_helpers():
    draft = tree()
    assert not draft.is_chain
    assert draft.children(0, -1) == [0, 4]
    assert draft.children(0, 0) == [1, 2]
    assert draft.children(0, 1) == [3]
    assert [draft.depth(0, i) for i in range(5)] == [1, 2, 2, 3, 1]
    assert draft.paths(0) == [[0, 2], [0, 1, 3], [4]]  # leaves 2, 3, 4 in node order
    assert [[TREE_TOKENS[i] for i in path] for path in draft.paths(0)] == [[10, 12], [10, 11, 13], [14]]


def test_a_tree_row_is_refused_where_chains_are_needed():
    draft = Draft([[1], TREE_TOKENS], [[-1], TREE_PARENTS], [None, None])
    with pytest.raises(ValueError, match=r"token verification verifies chain drafts only.*row 1"):
        draft.require_chain("token verification")
    with pytest.raises(RuntimeError, match="tree draft, which this verification cannot verify"):
        check_draft(draft, [1, 5], vocab=100, name="toy")
    check_draft(draft, [1, 3], vocab=100, name="toy", trees=True)  # the deepest path has 3 tokens
    with pytest.raises(RuntimeError, match="3 tokens on a path of row 1, at most 2 allowed"):
        check_draft(draft, [1, 2], vocab=100, name="toy", trees=True)


@pytest.mark.parametrize(
    "tokens, parents, probs, message",
    [
        ([[1, 2]], [[-1, 0], [-1]], [None], r"parents has 2 rows, tokens 1"),
        ([[1, 2]], [[-1, 0]], [None, None], r"probs has 2 rows, tokens 1"),
        ([[1, 2]], [[-1]], [None], r"parents\[0\] has 1 entries, tokens\[0\] 2"),
        ([[1, 2]], [[-1, 1]], [None], r"parents\[0\]\[1\]=1 must point backwards: an int in \[-1, 1\)"),
        ([[1, 2]], [[0, 0]], [None], r"parents\[0\]\[0\]=0 must point backwards: an int in \[-1, 0\)"),
        ([[1, 2]], [[-1, -2]], [None], r"parents\[0\]\[1\]=-2 must point backwards"),
        ([[1, 2]], [[-1, 0.0]], [None], r"parents\[0\]\[1\]=0.0 must point backwards"),
        ([[1, 2]], [[-1, True]], [None], r"parents\[0\]\[1\]=True must point backwards"),
        ([[1, 2]], [[-1, 0]], [torch.ones(3, 4) / 4], r"probs\[0\] must be None or a tensor of shape \(m, V\) = "
                                                      r"\(2, V\), got \(3, 4\)"),
        ([[1, 2]], [[-1, 0]], [torch.ones(4) / 4], r"probs\[0\] must be None .* got \(4,\)"),
        ([[1, 2]], [[-1, 0]], [[0.5, 0.5]], r"probs\[0\] must be None .* got list"),
    ],
)
def test_construction_checks_name_the_field(tokens, parents, probs, message):
    with pytest.raises(ValueError, match=message):
        Draft(tokens, parents, probs)

