"""Token trees in one forward (`forward(..., tree=)`, `models/token_tree.py`) and
`keep_path`: on the embedded model, on the fused and the general path, each node's logits are
those of feeding its root-to-node chain alone, keeping a path gives the cache of feeding it as a
chain, a chain given as a tree is today's forward bit for bit, and bad trees are refused by name."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from metagen.models.token_tree import TreeLayout, ancestors, check_trees

pytestmark = pytest.mark.slow

PROMPT = [1, 504, 3458, 282, 4649, 314, 7306, 30, 378, 5248, 282, 2997, 314, 10456, 28, 2045]
TOKENS = [11, 812, 45, 99, 100, 101, 102]  # root, its 2 children, each with 2 children
PARENTS = [-1, 0, 0, 1, 1, 2, 2]
ATOL = 2e-4  # float rounding of different reduction orders; measured max ~7e-5


def path(parents, node):
    """Fed-token indices of the root-to-`node` chain, root first."""
    chain = []
    while node >= 0:
        chain.append(node)
        node = parents[node]
    return chain[::-1]


@pytest.fixture(params=["fused", "general"])
def native(request, model_fp32):
    """The embedded model (fp32) on one path: the fused kernels or the general (SDPA) path."""
    if request.param == "fused" and model_fp32.kernels is None:
        pytest.skip("the fused kernels did not build here")
    saved = model_fp32.use_fused
    model_fp32.use_fused = request.param == "fused"
    yield model_fp32
    model_fp32.use_fused = saved


# ------------------------------------------------------------------------ the math, by hand
def test_ancestors_and_depths_of_a_binary_tree():
    mask = ancestors(np.array(PARENTS))
    assert mask[6].nonzero()[0].tolist() == [0, 2, 6]
    assert mask[3].nonzero()[0].tolist() == [0, 1, 3]
    assert (mask.sum(1) - 1).tolist() == [0, 1, 1, 2, 2, 2, 2]


def test_layout_positions_masks_and_query_tables():
    positions = torch.tensor([[5, 6, 7], [2, 3, 4]])  # row 0: 5 cached; row 1: 2 cached, 2 fed + padding
    trees = check_trees([[-1, -1, 0], [-1, 0]], np.array([3, 2]))
    assert trees[1] is None  # a chain takes the ordinary path
    layout = TreeLayout(trees, positions)
    assert layout.positions.tolist() == [[5, 5, 6], [2, 3, 4]]
    mask = layout.column_mask(8)[:, 0]
    assert mask[0, 2].tolist() == [True] * 5 + [True, False, True]  # token 2 sees the cache, token 0, itself
    assert mask[0, 1].tolist() == [True] * 5 + [False, True, False]
    assert mask[1, 1].tolist() == [True] * 4 + [False] * 4  # the chain row stays causal by column
    assert layout.key_positions(8)[0].tolist() == [0, 1, 2, 3, 4, 5, 5, 6]
    table = torch.arange(100, 108)[None].repeat(2, 1)  # row b's entry for column c: 100 + c
    query_table = table[torch.tensor([0, 0, 0, 1, 1])].clone()
    layout.query_tables(table, query_table, np.array([3, 2]))
    assert query_table[1, :6].tolist() == [100, 101, 102, 103, 104, 106]  # token 1 (a root) at column 5
    assert query_table[2, :7].tolist() == [100, 101, 102, 103, 104, 105, 107]  # token 2 under token 0


# ------------------------------------------------------------------------ the embedded model
def fed_alone(model, prefix, tokens):
    """Logits (V,) after feeding `tokens` as a chain on a fresh fork of a cache holding `prefix`."""
    cache, _ = model.prefill(prefix)
    cache.select([0, 0])  # a fork sharing the prefix, as tree verification's alternative would
    return model.forward(cache, [tokens, tokens]).logits[1]


def test_every_node_gives_its_chains_logits(native):
    cache, _ = native.prefill(PROMPT)
    out = native.forward(cache, [TOKENS], logits="all", tree=[PARENTS]).logits[0]  # (7, V)
    for node in range(len(TOKENS)):
        chain = [TOKENS[i] for i in path(PARENTS, node)]
        torch.testing.assert_close(out[node], fed_alone(native, PROMPT, chain), atol=ATOL, rtol=0)
    assert cache.lengths == [len(PROMPT) + len(TOKENS)]


@pytest.mark.parametrize("node", [3, 6, 2, 0])
def test_keeping_a_path_gives_the_cache_of_feeding_it(native, node):
    cache, _ = native.prefill(PROMPT)
    cache.select([0, 0])  # row 1 shares the prompt's slots: keep_path must leave them alone
    native.forward(cache, [TOKENS, [7]], tree=[PARENTS, None])
    kept = path(PARENTS, node)
    cache.keep_path(0, len(PROMPT), kept)
    chain = [TOKENS[i] for i in kept]
    assert cache.lengths == [len(PROMPT) + len(chain), len(PROMPT) + 1]
    out = native.forward(cache, [[42, 43], [44]], logits="all")
    reference = native.new_cache(1)
    expected = native.forward(reference, [PROMPT + chain + [42, 43]], logits="all").logits[0, -2:]
    torch.testing.assert_close(out.logits[0, :2], expected, atol=ATOL, rtol=0)
    torch.testing.assert_close(out.logits[1, 0], fed_alone(native, PROMPT, [7, 44]), atol=ATOL, rtol=0)
    assert cache.num_cached_slots == len(PROMPT) + len(chain) + 2 + 2  # the dropped nodes were released


def test_a_chain_given_as_a_tree_is_the_ordinary_forward(native):
    chain = [11, 812, 45, 99]
    outputs = []
    for tree in (None, [[-1, 0, 1, 2]]):
        cache, _ = native.prefill(PROMPT)
        outputs.append(native.forward(cache, [chain], logits="all", tree=tree).logits)
    assert torch.equal(outputs[0], outputs[1])


def test_rows_with_different_trees_and_a_row_without(native):
    other, other_parents = [300, 301, 302, 303], [-1, -1, 1, 0]  # two roots
    cache, _ = native.prefill(PROMPT, batch_size=3)
    cache.truncate(2, 9)  # rows of different lengths
    out = native.forward(cache, [TOKENS, other, [5, 6]], logits="all", tree=[PARENTS, other_parents, None]).logits
    prefixes = [PROMPT, PROMPT, PROMPT[:9]]
    for row, (tokens, parents) in enumerate([(TOKENS, PARENTS), (other, other_parents), ([5, 6], [-1, 0])]):
        for node in range(len(tokens)):
            chain = [tokens[i] for i in path(parents, node)]
            torch.testing.assert_close(out[row, node], fed_alone(native, prefixes[row], chain), atol=ATOL, rtol=0)


def test_a_tree_wider_than_the_fused_limit_runs_on_the_general_path(model_fp32):
    parents = [-1] + [0] * 17  # a root with 17 children: 18 fed tokens
    tokens = [11] + list(range(200, 217))
    cache, _ = model_fp32.prefill(PROMPT)
    out = model_fp32.forward(cache, [tokens], logits="all", tree=[parents]).logits[0]
    for node in (0, 1, 17):
        chain = [tokens[i] for i in path(parents, node)]
        torch.testing.assert_close(out[node], fed_alone(model_fp32, PROMPT, chain), atol=ATOL, rtol=0)


@pytest.mark.parametrize(("tree", "message"), [
    ([[-1, 1, 0]], r"tree\[0\]\[1\]=1 is out of range: a parent index must be in \[-1, 0\]"),
    ([[-1, 0, 3]], r"tree\[0\]\[2\]=3 is out of range"),
    ([[-1, -2, 0]], r"tree\[0\]\[1\]=-2 is out of range"),
    ([[-1, 0]], r"tree\[0\] has 2 parents but row 0 feeds 3 tokens"),
    ([[-1, 0, 0], None], r"tree has 2 entries but tokens has 1 rows"),
])
def test_bad_trees_are_refused_by_name_before_the_cache_changes(native, tree, message):
    cache, _ = native.prefill(PROMPT)
    with pytest.raises(ValueError, match=message):
        native.forward(cache, [[11, 12, 13]], tree=tree)
    assert cache.lengths == [len(PROMPT)]


def test_bad_tree_types_are_refused_by_name(model_fp32):
    cache, _ = model_fp32.prefill(PROMPT)
    with pytest.raises(TypeError, match=r"tree\[0\]\[1\] must be an int"):
        model_fp32.forward(cache, [[11, 12]], tree=[[-1, 0.5]])
    with pytest.raises(TypeError, match="tree must be a list"):
        model_fp32.forward(cache, [[11, 12]], tree="01")


def test_bad_kept_paths_are_refused_by_name(model_fp32):
    cache, _ = model_fp32.prefill(PROMPT)
    model_fp32.forward(cache, [TOKENS], tree=[PARENTS])
    with pytest.raises(ValueError, match=r"kept\[1\]=0 is out of range: the indices must increase"):
        cache.keep_path(0, len(PROMPT), [2, 0])
    with pytest.raises(ValueError, match=r"kept\[1\]=7 is out of range: must be in \[0, 6\]"):
        cache.keep_path(0, len(PROMPT), [0, 7])
    with pytest.raises(ValueError, match=r"start=24 is out of range"):
        cache.keep_path(0, 24, [0])
    assert cache.lengths == [len(PROMPT) + len(TOKENS)]


def test_other_models_refuse_trees_by_name():
    from metagen.models.kgram import KGramModel

    kgram = KGramModel.train(["ab", "ba"], k=2, c=1.0, level="char", max_context=16)
    with pytest.raises(NotImplementedError, match="does not run token trees"):
        kgram.forward(kgram.new_cache(1), [[1, 2]], tree=[[-1, -1]])


def test_trees_of_rows_sharing_a_long_prefix(native):
    """Rows forked from an 80-token prompt attend to it once for both (the shared-prefix split
    of the fused path, `shared_prefix.py`) and to their own tree through each query's table."""
    assert native.use_shared_prefix
    prompt = (PROMPT * 5)[:80]
    other, other_parents = [300, 301, 302], [-1, -1, 0]
    cache, _ = native.prefill(prompt, batch_size=2)
    out = native.forward(cache, [TOKENS, other], logits="all", tree=[PARENTS, other_parents]).logits
    for row, (tokens, parents) in enumerate([(TOKENS, PARENTS), (other, other_parents)]):
        for node in range(len(tokens)):
            chain = [tokens[i] for i in path(parents, node)]
            torch.testing.assert_close(out[row, node], fed_alone(native, prompt, chain), atol=ATOL, rtol=0)
