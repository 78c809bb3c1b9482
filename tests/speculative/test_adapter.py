"""Exit adapters on the embedded model: identity at initialisation, training lowers held-out KL,
save/load round-trips and refuses other models, forward shapes with ragged rows, and greedy
speculative decoding with the adapted drafter equals plain greedy."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from metagen.speculative import ModelDrafter, early_exit_model
from metagen.speculative.adapter import (
    AdaptedExitModel,
    ExitAdapter,
    coarse_kl,
    model_identity,
    train_exit_adapter,
)

EXIT_LAYER = 12
ROWS = [[1, 504, 3458, 314, 260, 2110], [1, 40, 1090], [1, 9519, 28, 2200, 30]]


@pytest.fixture(scope="module")
def trained(model):
    """A quick adapter (least squares + 10 Adam steps) on a dozen model samples, and its report."""
    texts = ["The sky is blue because sunlight scatters off air molecules, and blue light scatters most.",
             "def add(a, b):\n    return a + b\n\nprint(add(2, 3))",
             "Photosynthesis turns light, water and carbon dioxide into sugar and oxygen in plants.",
             "To make pancakes, mix flour, milk, eggs and a pinch of salt, then fry in a hot pan.",
             "The French Revolution began in 1789 with the storming of the Bastille in Paris.",
             "A prime number has exactly two divisors: one and itself. Two is the only even prime.",
             "Water boils at one hundred degrees Celsius at sea level and at lower temperatures on mountains.",
             "for i in range(10):\n    if i % 2 == 0:\n        print(i, 'is even')",
             "The heart pumps blood through arteries to the organs, and veins carry it back to the heart.",
             "Shakespeare wrote Hamlet, Macbeth and Romeo and Juliet around the turn of the seventeenth century.",
             "A triangle's angles add up to one hundred and eighty degrees in Euclidean geometry.",
             "Bread rises because yeast eats sugar and releases carbon dioxide that the dough traps."]
    return train_exit_adapter(model, EXIT_LAYER, texts, rank=16, steps=10, batch_tokens=64, held_out=0.34)


def test_coarse_kl_exact_on_a_toy_distribution():
    # teacher p = (0.5, 0.3, 0.2) with top-2 kept: bins (0.5, 0.3 | tail 0.2); student q uniform
    p = torch.tensor([[0.5, 0.3, 0.2]])
    top = torch.topk(p.log(), 2)
    tail = torch.tensor([math.log(0.2)])
    expected = 0.5 * math.log(0.5 / (1 / 3)) + 0.3 * math.log(0.3 / (1 / 3)) + 0.2 * math.log(0.2 / (1 / 3))
    got = coarse_kl(torch.zeros(1, 3), top.indices, top.values, tail)
    assert got.item() == pytest.approx(expected, abs=1e-6)
    assert coarse_kl(p.log(), top.indices, top.values, tail).item() == pytest.approx(0.0, abs=1e-6)


def test_untrained_adapter_is_the_early_exit_model(model):
    early = early_exit_model(model, EXIT_LAYER)
    adapted = AdaptedExitModel(model, ExitAdapter(EXIT_LAYER, model_identity(model)))
    # the general path feeds the same fp32 hidden state to the head in both: equal exactly
    early.use_fused = adapted.body.use_fused = False
    expected = early.forward(early.new_cache(3), ROWS, logits="all").logits
    got = adapted.forward(adapted.new_cache(3), ROWS, logits="all").logits
    early.use_fused = adapted.body.use_fused = True
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    # decode steps (fused kernels on the early model) agree up to bf16 rounding of the head input
    cache_early, cache_adapted = early.new_cache(3), adapted.new_cache(3)
    early.forward(cache_early, ROWS, logits="none")
    adapted.forward(cache_adapted, ROWS, logits="none")
    step = torch.tensor([[30], [11], [264]])
    expected = early.forward(cache_early, step).logits
    got = adapted.forward(cache_adapted, step).logits
    torch.testing.assert_close(got, expected, rtol=0, atol=0.1)
    assert torch.equal(got.argmax(-1), expected.argmax(-1))


def test_a_token_tree_gives_each_node_the_logits_of_its_own_path(model, trained):
    """After a shared prompt, the tree [x, y | x, z | y] (parents -1, -1, 0, 0, 1) fed at once:
    each node's adapted logits equal those of its root-to-node path fed as a chain."""
    adapted = AdaptedExitModel(model, trained[0])
    adapted.body.use_fused = False  # one path for both, so the comparison is of the tree mask alone
    prompt, tokens, parents = ROWS[0], [30, 11, 264, 40, 9519], [-1, -1, 0, 0, 1]
    cache = adapted.new_cache(1)
    adapted.forward(cache, [prompt], logits="none")
    tree = adapted.forward(cache, [tokens], logits="all", tree=[parents]).logits[0]  # (5, V)
    for node in range(len(tokens)):
        path, walk = [], node
        while walk != -1:
            path.append(tokens[walk])
            walk = parents[walk]
        chain = adapted.forward(adapted.new_cache(1), [prompt + path[::-1]], logits="last").logits[0]
        # batch-shape rounding only (a node seeing a sibling would move logits by whole units)
        torch.testing.assert_close(tree[node], chain, rtol=0, atol=0.02)
        assert tree[node].argmax() == chain.argmax()
    adapted.body.use_fused = True


def test_training_lowers_held_out_kl(trained):
    adapter, report = trained
    assert report.held_out_tokens > 0 and report.train_tokens > report.held_out_tokens
    assert report.kl_after < 0.8 * report.kl_before, report
    assert report.agreement_after >= report.agreement_before, report
    assert report.parameters == adapter.num_parameters == 2 * 576 * 16


def test_forward_shapes_with_ragged_rows(model, trained):
    adapted = AdaptedExitModel(model, trained[0])
    vocab, hidden = model.vocab_size, model.config.hidden_size
    cache = adapted.new_cache(3)
    all_out = adapted.forward(cache, ROWS, logits="all", hidden=True)
    assert all_out.logits.shape == (3, 6, vocab) and all_out.hidden.shape == (3, 6, hidden)
    assert all_out.num_new == [6, 3, 5]
    last = adapted.forward(adapted.new_cache(3), ROWS, logits="last")
    assert last.logits.shape == (3, vocab) and last.hidden is None
    for b, row in enumerate(ROWS):  # "last" is row b's position len(row) − 1 of "all" (bf16 head: batch-shape rounding)
        torch.testing.assert_close(last.logits[b], all_out.logits[b, len(row) - 1], rtol=0, atol=0.1)
        assert last.logits[b].argmax() == all_out.logits[b, len(row) - 1].argmax()
    step = adapted.forward(cache, torch.tensor([[5], [6], [7]]), logits="all")
    assert step.logits.shape == (3, 1, vocab)
    assert adapted.forward(cache, [[8], [9], [10]], logits="none").logits is None
    assert cache.lengths == [8, 5, 7]
    assert adapted.flops_per_token(10) == early_exit_model(model, EXIT_LAYER).flops_per_token(10) + 2 * 2 * 576 * 16


def test_save_load_round_trip(model, trained, tmp_path):
    adapter = trained[0]
    path = tmp_path / "adapter.safetensors"
    adapter.save(path)
    loaded = ExitAdapter.load(path, model)
    assert loaded.num_layers == EXIT_LAYER and loaded.rank == adapter.rank
    original, restored = AdaptedExitModel(model, adapter), AdaptedExitModel(model, loaded)
    first = original.forward(original.new_cache(3), ROWS, logits="all")
    again = restored.forward(restored.new_cache(3), ROWS, logits="all")
    assert torch.equal(first.logits, again.logits)
    early = early_exit_model(model, EXIT_LAYER)
    raw = early.forward(early.new_cache(3), ROWS, logits="all").logits
    assert not torch.equal(first.logits, raw)  # the trained adapter is not the identity


@pytest.mark.parametrize("field, value", [("dtype", "fp32"), ("source", "other.gguf"), ("vocab_size", 32000)])
def test_load_refuses_another_model(model, trained, tmp_path, field, value):
    path = tmp_path / "adapter.safetensors"
    trained[0].save(path)
    other = copy.copy(model)
    if field == "dtype":
        other.dtype = value
    elif field == "source":
        other.source = value
    else:
        from dataclasses import replace

        other.config = replace(model.config, vocab_size=value)
    with pytest.raises(ValueError, match=field):
        ExitAdapter.load(path, other)
    with pytest.raises(ValueError, match=field):
        AdaptedExitModel(other, trained[0])


def test_greedy_speculative_with_adapted_drafter_equals_plain_greedy(model, trained):
    from tests.speculative.test_real_model import assert_same_greedy

    # One arithmetic path for both (the int4 fused decode kernels round differently from the
    # multi-token forward that verifies drafts), and a divergence allowed only at a bf16 tie of
    # plain decoding's top two logits: this prompt has one at position 3, which the int4
    # kernels of some CPUs break one way in a 1-token forward and the other in a 4-token one.
    fused, model.use_fused = model.use_fused, False
    try:
        result = assert_same_greedy(model, ModelDrafter(AdaptedExitModel(model, trained[0])),
                                    "Give me three tips for learning a new language.", None, max_tokens=24,
                                    bf16_ties=True)
    finally:
        model.use_fused = fused
    assert result.cost.draft_tokens > 0
