"""The model floor's interface for consumers: hidden states without the LM head, a truncated-
depth view sharing weights, `linears()`, and `KVCache.copy_prefix` (exact copies, checked
arguments)."""

import numpy as np
import pytest
import torch

from metagen.models import KVCache, load


@pytest.fixture(scope="module")
def tiny(tiny_checkpoint):
    return load(tiny_checkpoint, dtype="fp32", use_cache=False)


@pytest.mark.parametrize("fused", [False, True])
def test_hidden_states_are_forwards_hidden_without_the_head(tiny, fused, monkeypatch):
    if fused and tiny.kernels is None:
        pytest.skip("fused kernels unavailable")
    monkeypatch.setattr(tiny, "use_fused", fused)
    rows = [[5, 6, 7], [8]]
    cache = tiny.new_cache(2)
    expected = tiny.forward(cache, rows, logits="all", hidden=True)
    cache = tiny.new_cache(2)
    calls = []
    monkeypatch.setattr(tiny, "lm_head", lambda h, head=tiny.lm_head: calls.append(1) or head(h))
    out = tiny.hidden_states(cache, rows, positions="all")
    assert calls == [] and out.logits is None and out.num_new == [3, 1]
    torch.testing.assert_close(out.hidden[0], expected.hidden[0], rtol=0, atol=1e-6)
    torch.testing.assert_close(out.hidden[1, :1], expected.hidden[1, :1], rtol=0, atol=1e-6)
    last = tiny.hidden_states(tiny.new_cache(2), rows, positions="last").hidden  # (B, H)
    torch.testing.assert_close(last, torch.stack([expected.hidden[0, 2], expected.hidden[1, 0]]), rtol=0, atol=1e-6)
    torch.testing.assert_close(tiny.logits_from_hidden(last[1]), expected.logits[1, 0], rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="positions='first'"):
        tiny.hidden_states(tiny.new_cache(1), [[1]], positions="first")


def test_truncated_shares_weights_and_equals_running_fewer_layers(tiny):
    shallow = tiny.truncated(1)
    assert shallow.layers == tiny.layers[:1] and shallow.layers[0] is tiny.layers[0]
    assert shallow.lm_head is tiny.lm_head and shallow.config.num_hidden_layers == 1
    assert [name for name, _ in shallow.linears()] == ["qkv", "o", "gate_up", "down", "lm_head"]
    with pytest.raises(ValueError, match=r"num_layers=2 is out of range: must be an int in \[1, 1\]"):
        tiny.truncated(2)
    from dataclasses import replace

    from metagen.models.decoder import DecoderModel

    by_hand = DecoderModel(replace(tiny.config, num_hidden_layers=1), tiny.layers[:1], tiny.embed, tiny.norm,
                           tiny.lm_head, tiny.tokenizer, "fp32")
    by_hand.use_fused = shallow.use_fused = False
    expected = by_hand.forward(by_hand.new_cache(1), [[3, 4, 5]], logits="all").logits
    assert torch.equal(shallow.forward(shallow.new_cache(1), [[3, 4, 5]], logits="all").logits, expected)
    full = tiny.forward(tiny.new_cache(1), [[3, 4, 5]], logits="all").logits
    assert not torch.allclose(full, expected)  # the second layer matters: the view really is shallower


def small_cache(layers=2, heads=2, dim=4, length=5, seed=0):
    cache = KVCache(layers, heads, dim, torch.float32, 64, capacity=16)
    cache.reset(1)
    slots, _, _ = cache.allocate(np.array([length]))
    generator = torch.Generator().manual_seed(seed)
    for layer in range(layers):
        cache.write(layer, slots, torch.randn(length, 2, heads, dim, generator=generator))
    return cache


def test_copy_prefix_copies_exactly_the_first_tokens_of_the_first_layers():
    source = small_cache(layers=3)
    target = KVCache(2, 2, 4, torch.float32, 64, capacity=16)
    target.reset(2)
    target.copy_prefix(source, 0, 3, row=1)
    assert target.lengths == [0, 3]
    table = torch.from_numpy(target.slots(1))[None]
    source_table = torch.from_numpy(source.slots(0)[:3])[None]
    for layer in range(2):
        assert torch.equal(target.read(layer, table), source.read(layer, source_table))


@pytest.mark.parametrize(
    "make_source, kwargs, error, message",
    [
        (lambda: small_cache(layers=1), {}, ValueError, "source cache has 1 layers, fewer than this cache's 2"),
        (lambda: small_cache(heads=1), {}, ValueError, "source cache has num_kv_heads=1, this cache 2"),
        (lambda: small_cache(), {"length": 6}, ValueError, "length"),
        (lambda: small_cache(), {"source_row": 1}, ValueError, "source_row"),
        (lambda: "cache", {}, TypeError, "source must be a KVCache, got str"),
    ],
)
def test_copy_prefix_checks_its_arguments(make_source, kwargs, error, message):
    target = KVCache(2, 2, 4, torch.float32, 64, capacity=16)
    target.reset(1)
    arguments = {"source_row": 0, "length": 2, **kwargs}
    with pytest.raises(error, match=message):
        target.copy_prefix(make_source(), arguments["source_row"], arguments["length"])
    assert target.lengths == [0]


def test_copy_prefix_fills_only_an_empty_row():
    target = small_cache()
    with pytest.raises(ValueError, match="row 0 holds 5 tokens; copy_prefix fills an empty row"):
        target.copy_prefix(small_cache(), 0, 2)
