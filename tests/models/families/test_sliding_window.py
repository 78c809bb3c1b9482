"""Sliding-window attention against transformers past the window (fp32, 1e-4, both execution
paths): a tiny Mistral with sliding_window = 8 (every layer windowed: the cache releases slots
that left every row's window) and a tiny Gemma 3 (local layers windowed, a global one between
them: nothing is released). Each test also checks that the window changes the logits, so it
cannot pass with full attention."""

import pytest
import torch

from metagen.models import load
from tests.models.families.tiny_checkpoints import build_hf_model, save_hf

pytestmark = pytest.mark.slow

WINDOW = 8
PROMPT = [17, 2048, 311, 9001, 42, 777, 15, 30000, 123, 4567, 89, 1000, 5, 6, 7, 8, 99, 123, 321, 44]  # 20 > window
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def mistral(tmp_path_factory):
    hf = build_hf_model("mistral", sliding_window=WINDOW, max_position_embeddings=1024)
    return hf, load(save_hf(hf, tmp_path_factory.mktemp("mistral")), dtype="fp32", use_cache=False)


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    hf = build_hf_model("gemma3")
    return hf, load(save_hf(hf, tmp_path_factory.mktemp("gemma3")), dtype="fp32", use_cache=False)


def reference(hf, ids):
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0].float()  # (T, V)


def without_window(hf, ids):
    """transformers' logits with the window opened to the whole context."""
    saved = hf.config.sliding_window
    hf.config.sliding_window = 4096
    try:
        return reference(hf, ids)
    finally:
        hf.config.sliding_window = saved


def assert_close(actual, expected):
    assert (actual - expected).abs().max().item() < TOLERANCE


def paths(model):
    return [False, True] if model.kernels is not None else [False]


@pytest.mark.parametrize("name", ["mistral", "gemma"])
def test_prompt_past_the_window_matches_transformers(name, request):
    hf, model = request.getfixturevalue(name)
    expected = reference(hf, PROMPT)
    assert (expected - without_window(hf, PROMPT)).abs().max().item() > 1e-2  # the window matters here
    for fused in paths(model):
        model.use_fused = fused
        assert_close(model.forward(model.new_cache(1), [PROMPT], logits="all").logits[0], expected)


@pytest.mark.parametrize("name", ["mistral", "gemma"])
def test_decode_fork_truncate_and_ragged_append_past_the_window(name, request):
    hf, model = request.getfixturevalue(name)
    for fused in paths(model):
        model.use_fused = fused
        cache = model.new_cache(1)
        model.forward(cache, [PROMPT + [5, 6, 7]])
        cache.truncate(0, len(PROMPT))
        cache.fork(0, 1)
        out = model.forward(cache, [[260], [1345, 42, 9]], logits="all")
        rows = [PROMPT + [260], PROMPT + [1345, 42, 9]]
        assert_close(out.logits[0, 0], reference(hf, rows[0])[-1])
        assert_close(out.logits[1], reference(hf, rows[1])[-3:])
        for step in range(8):  # decode further past the window on both rows
            tokens = [[100 + step], [2000 + 7 * step]]
            out = model.forward(cache, tokens)
            for b in range(2):
                rows[b] = rows[b] + tokens[b]
                assert_close(out.logits[b], reference(hf, rows[b])[-1])


@pytest.mark.parametrize("name", ["mistral", "gemma"])
def test_rows_of_very_different_lengths_in_one_general_call(name, request):
    """A long row adding one token next to a short row adding many: the long row's padding
    queries lie past every key of its window; they must not produce NaN (logits="all")."""
    hf, model = request.getfixturevalue(name)
    model.use_fused = False
    cache = model.new_cache(1)
    model.forward(cache, [PROMPT])
    cache.fork(0, 1)
    cache.truncate(1, 3)
    tail = list(range(300, 320))
    out = model.forward(cache, [[7], tail], logits="all")
    assert_close(out.logits[0, 0], reference(hf, PROMPT + [7])[-1])
    assert_close(out.logits[1], reference(hf, PROMPT[:3] + tail)[-20:])


def test_mistral_cache_releases_slots_outside_the_window_and_keeps_truncation_exact(mistral):
    hf, model = mistral
    for fused in paths(model):
        model.use_fused = fused
        cache = model.new_cache(1)
        assert cache.window == WINDOW
        cache.keep = 4  # hold 4 positions behind the window for truncation (default 64)
        ids = list(PROMPT)
        model.forward(cache, [ids])
        for step in range(20):
            ids.append(500 + step)
            out = model.forward(cache, [[ids[-1]]])
        assert_close(out.logits[0], reference(hf, ids)[-1])
        released = cache.released(0)
        assert released >= len(ids) - 1 - WINDOW + 1 - 2 * cache.keep > 0
        assert cache.num_cached_slots == len(ids) - released
        with pytest.raises(ValueError, match="left the sliding window of 8 and were released"):
            cache.slots(0)
        snapshot = cache.snapshot(0)  # a released row survives snapshot / restore
        cache.restore([snapshot, snapshot])
        cache.release(snapshot)
        cache.truncate(1, len(ids) - 3)  # within the kept margin
        out = model.forward(cache, [[9], [11]])
        assert_close(out.logits[0], reference(hf, ids + [9])[-1])
        assert_close(out.logits[1], reference(hf, ids[:-3] + [11])[-1])
        with pytest.raises(ValueError, match=r"length=3 is out of range for row 0: .*sliding window of 8"):
            cache.truncate(0, 3)


def test_a_long_mistral_generation_keeps_the_pool_bounded(mistral):
    """Two rows decode 300 tokens each past a 20-token prompt: at most W + 2·keep − 1 slots per
    row stay in use and the pool never grows past its first doubling (620 slots without release)."""
    hf, model = mistral
    model.use_fused = model.kernels is not None
    cache = model.new_cache(1, capacity=256)
    out = model.forward(cache, [PROMPT])
    cache.fork(0, 1)
    rows = [list(PROMPT), list(PROMPT)]
    bound = 2 * (WINDOW + 2 * cache.keep - 1)
    logits = torch.cat([out.logits, out.logits])
    for step in range(300):
        tokens = [[int(logits[0].argmax())], [int(logits[1].topk(2).indices[1])]]  # greedy; second choice
        for b in range(2):
            rows[b].append(tokens[b][0])
        logits = model.forward(cache, tokens).logits
        assert cache.num_cached_slots <= bound
    assert cache.pools[0].shape[0] <= 512
    assert_close(logits[0], reference(hf, rows[0])[-1])
    assert_close(logits[1], reference(hf, rows[1])[-1])


def test_gemma_cache_keeps_every_slot_because_of_its_global_layers(gemma):
    hf, model = gemma
    cache = model.new_cache(1)
    assert cache.window is None and model.config.cache_window is None
    model.forward(cache, [PROMPT])
    for token in range(40):
        model.forward(cache, [[token + 1]])
    assert cache.released(0) == 0 and cache.num_cached_slots == len(PROMPT) + 40


@pytest.mark.parametrize("name", ["mistral", "gemma"])
def test_token_tree_past_the_window_matches_transformers(name, request):
    """A tree whose deep nodes reach past the window: a root with a branch of 4 and a branch of
    9 fed after it, so the second branch's columns (fed order) lie past their positions (cached
    length + depth) and its deepest node's window drops its oldest ancestors by position where
    their columns would keep them."""
    hf, model = request.getfixturevalue(name)
    tokens = [50 + 7 * i for i in range(14)]
    parents = [-1, 0, 1, 2, 3, 0, 5, 6, 7, 8, 9, 10, 11, 12]
    for fused in paths(model):
        model.use_fused = fused
        cache = model.new_cache(1)
        model.forward(cache, [PROMPT])
        out = model.forward(cache, [tokens], logits="all", tree=[parents]).logits[0]
        for node in (4, 5, 9, 13):
            chain, at = [], node
            while at >= 0:
                chain.append(tokens[at])
                at = parents[at]
            assert_close(out[node], reference(hf, PROMPT + chain[::-1])[-1])
    model.use_fused = model.kernels is not None
