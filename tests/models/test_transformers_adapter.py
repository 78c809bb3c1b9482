"""The transformers adapter runs all rows in one batched forward: rows of different lengths, decode
steps, fork, truncate, multi-token appends, snapshot / restore and compaction give the native
backend's logits (fp32, within 2e-4 on logits of magnitude ~30; measured max 8e-5), sliding-window
models give transformers' own full-sequence logits, and the token-level algorithms (sampling
n=4, beam search, speculative decoding) give the native backend's tokens."""

from __future__ import annotations

import pytest
import torch

from metagen.decoding import BeamSearchConfig, beam_search, generate
from metagen.sampling import SamplingParams
from metagen.speculative import NgramDrafter, SpeculativeConfig, speculative_generate
from tests.models.families.tiny_checkpoints import build_hf_model

TOLERANCE = 2e-4
TEXT = ("The history of mathematics spans thousands of years, from counting marks on bones to modern proofs "
        "checked by computers. Early civilizations in Mesopotamia and Egypt used arithmetic for trade.")


@pytest.fixture(scope="module")
def adapter():
    transformers = pytest.importorskip("transformers")
    from metagen.models import TransformersModel, embedded_model_path

    transformers.logging.set_verbosity_error()
    path = embedded_model_path()
    return TransformersModel.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)


def assert_same_outputs(native, adapter, hidden=False):
    """Logits (and hidden states) of the real new positions agree; padding is not compared."""
    assert native.num_new == adapter.num_new
    if native.logits.dim() == 2:
        torch.testing.assert_close(adapter.logits, native.logits, atol=TOLERANCE, rtol=0)
        return
    for row, count in enumerate(native.num_new):
        torch.testing.assert_close(adapter.logits[row, :count], native.logits[row, :count], atol=TOLERANCE, rtol=0)
        assert not adapter.logits[row, count:].any()  # the adapter's padding positions are zeros
        if hidden:
            torch.testing.assert_close(adapter.hidden[row, :count], native.hidden[row, :count], atol=TOLERANCE, rtol=0)


def script(model, ids, steps):
    """One ragged prefill, decode steps, truncate, fork, ragged multi-token appends, select with
    repeats, snapshot / restore; yields (cache, output) after each forward."""
    cache = model.new_cache(3)
    yield cache, model.forward(cache, [ids[:5], ids[:17], ids[:11]], logits="all", hidden=True)
    for step in range(steps):
        yield cache, model.forward(cache, [[ids[20 + step]], [ids[30 + step]], [ids[25 + step]]])
    cache.truncate(1, 12)
    assert cache.fork(0, 2) == [3, 4]
    yield cache, model.forward(cache, [[11, 12], [260], [1345, 42, 7], [5], [6, 7, 8, 9]], logits="all", hidden=True)
    kept = cache.snapshot(2)
    cache.select([4, 2, 2])
    yield cache, model.forward(cache, [[3], [4], [5, 6]], logits="all")
    cache.restore([kept, cache.snapshot(0), kept])
    cache.release(kept)
    yield cache, model.forward(cache, [[3, 4], [4], [9]], logits="all")


@pytest.mark.slow
def test_ragged_batch_and_every_cache_operation_match_native(model_fp32, adapter):
    ids = model_fp32.tokenizer.encode(TEXT + " " + TEXT)
    steps = 3
    for (native_cache, native), (adapter_cache, batched) in zip(script(model_fp32, ids, steps), script(adapter, ids, steps)):
        assert adapter_cache.lengths == native_cache.lengths
        assert_same_outputs(native, batched, hidden=batched.hidden is not None)
    assert adapter_cache.lengths == [19, 14, 18]


@pytest.mark.slow
def test_holes_from_truncation_are_compacted_and_change_no_logits(model_fp32, adapter):
    """Speculative-style cycles (append 5, keep 1) leave holes until compaction moves each row's
    tokens to the front; the logits stay the native backend's throughout."""
    ids = model_fp32.tokenizer.encode(TEXT + " " + TEXT)
    caches = [model.new_cache(2) for model in (model_fp32, adapter)]
    for model, cache in zip((model_fp32, adapter), caches):
        model.forward(cache, [ids[:8], ids[:3]])
    widths = []
    for cycle in range(6):
        proposed = [ids[10 + cycle: 15 + cycle], ids[20 + cycle: 22 + cycle]]
        outputs = []
        for model, cache in zip((model_fp32, adapter), caches):
            outputs.append(model.forward(cache, proposed, logits="all"))
            for row, length in enumerate(cache.lengths):
                cache.truncate(row, length - len(proposed[row]) + 1)
        assert_same_outputs(*outputs)
        widths.append(caches[1].width)
    assert caches[1].lengths == [14, 9]
    assert max(widths) > 14 + 16 and widths[-1] < max(widths)  # holes grew, then were compacted


def _rows_alone(hf_model, sequences):
    """transformers' own logits for each sequence alone, no cache: (T, V) each."""
    with torch.no_grad():
        return [hf_model(torch.tensor([sequence])).logits[0] for sequence in sequences]


@pytest.mark.parametrize("family, overrides", [
    ("mistral", dict(sliding_window=4)),  # every layer slides
    ("qwen2", dict(use_sliding_window=True, sliding_window=4, max_window_layers=1)),  # full and sliding layers
])
def test_sliding_window_models_give_the_full_sequence_logits_past_the_window(family, overrides):
    from metagen.models import TransformersModel

    hf_model = build_hf_model(family, **overrides)
    model = TransformersModel(hf_model, tokenizer=None)
    assert model._window == 4
    generator = torch.Generator().manual_seed(0)
    sequences = [torch.randint(0, 1000, (length,), generator=generator).tolist() for length in (9, 3, 6)]
    cache = model.new_cache(3)
    prefill = model.forward(cache, [s[:-2] for s in sequences], logits="all")
    cache.truncate(1, 0)  # row 1 starts over: holes before its new tokens
    step = model.forward(cache, [s[-2:] if row != 1 else s for row, s in enumerate(sequences)], logits="all")
    for row, (sequence, reference) in enumerate(zip(sequences, _rows_alone(hf_model, sequences))):
        if row != 1:
            torch.testing.assert_close(prefill.logits[row, : len(sequence) - 2], reference[:-2], atol=1e-4, rtol=0)
            torch.testing.assert_close(step.logits[row, :2], reference[-2:], atol=1e-4, rtol=0)
        else:
            torch.testing.assert_close(step.logits[row, : len(sequence)], reference, atol=1e-4, rtol=0)


def test_restore_mixes_empty_and_full_snapshots_and_rows_stay_independent():
    from metagen.models import TransformersModel

    hf_model = build_hf_model("llama")
    model = TransformersModel(hf_model, tokenizer=None)
    cache = model.new_cache(1)
    empty = cache.snapshot(0)  # made before any forward: no layers yet
    model.forward(cache, [[5, 6, 7]])
    with pytest.raises(ValueError, match="made by another cache"):
        model.new_cache(1).restore([empty])
    cache.restore([empty, cache.snapshot(0), cache.snapshot(0)])
    cache.truncate(2, 1)
    out = model.forward(cache, [[5, 6, 7, 8], [8], [6, 7, 8]], logits="all")
    reference = _rows_alone(hf_model, [[5, 6, 7, 8]])[0]  # (4, V)
    torch.testing.assert_close(out.logits[0], reference, atol=1e-4, rtol=0)
    torch.testing.assert_close(out.logits[1, 0], reference[-1], atol=1e-4, rtol=0)
    torch.testing.assert_close(out.logits[2, :3], reference[1:], atol=1e-4, rtol=0)
    other = model.new_cache(1)
    other.restore([other.snapshot(0)])  # an empty row restores to an empty row
    assert other.lengths == [0] and model.forward(other, [[5]]).logits.shape == (1, hf_model.config.vocab_size)


def test_attention_kinds_without_a_position_mask_are_refused_by_name():
    from metagen.models.transformers_adapter import _attention_layout

    class Config:
        layer_types = ["full_attention", "chunked_attention"]
        sliding_window = None

    with pytest.raises(ValueError, match=r"layer_types \['chunked_attention'\] are not supported"):
        _attention_layout(Config())


@pytest.mark.slow
def test_sampling_four_rows_gives_the_native_tokens(model_fp32, adapter):
    # top_k keeps the draws away from the tail, where a 1e-6 change of the CDF (fp32 rounding of
    # a different kernel) can move a draw between two tokens of probability ~1e-6
    params = SamplingParams(n=4, temperature=0.8, top_k=20, max_tokens=16, seed=3)
    prompt = [{"role": "user", "content": "Name a colour."}]
    native = generate(model_fp32, prompt, params)
    batched = generate(adapter, prompt, params)
    assert [c.token_ids for c in batched.completions] == [c.token_ids for c in native.completions]
    assert len({tuple(c.token_ids) for c in native.completions}) > 1  # the rows differ: a real batch


@pytest.mark.slow
def test_beam_search_gives_the_native_hypotheses(model_fp32, adapter):
    config = BeamSearchConfig(width=4, n_best=4, max_tokens=12)
    prompt = [{"role": "user", "content": "What is the capital of France?"}]
    native = beam_search(model_fp32, prompt, config)
    batched = beam_search(adapter, prompt, config)
    assert [h.token_ids for h in batched.completions] == [h.token_ids for h in native.completions]


@pytest.mark.slow
@pytest.mark.parametrize("verify", ["token", "block"])
def test_speculative_greedy_equals_plain_greedy(adapter, verify):
    passage = ("The lighthouse stood on a rock two miles from the harbour. Every night the keeper climbed "
               "one hundred and twelve steps to light the lamp.")
    prompt = [{"role": "user", "content": f"Repeat this passage word for word:\n\n{passage}"}]
    params = SamplingParams(temperature=0, max_tokens=32)
    plain = generate(adapter, prompt, params)
    spec = speculative_generate(adapter, NgramDrafter(), prompt, params, SpeculativeConfig(num_draft_tokens=5, verify=verify))
    assert spec.completions[0].token_ids == plain.completions[0].token_ids
    assert spec.cost.acceptance_rate > 0.5  # drafts were accepted: truncation and multi-token appends ran


@pytest.mark.slow
def test_tree_speculative_greedy_equals_plain_greedy(adapter):
    """Token trees through the adapter: the target scores a tree in one forward (ancestor-only
    attention) and keeps one path (`keep_path`); the adapter drafts its own trees too."""
    from metagen.speculative import TreeDrafter

    params = SamplingParams(temperature=0, max_tokens=16)
    prompt = "The capital of France is"
    plain = generate(adapter, prompt, params)
    spec = speculative_generate(adapter, TreeDrafter(adapter, widths=(2, 2)), prompt, params,
                                SpeculativeConfig(num_draft_tokens=2, verify="multi-draft"))
    assert spec.completions[0].token_ids == plain.completions[0].token_ids
    assert spec.cost.block_efficiency == pytest.approx(3.0, abs=0.5)  # the same model: the top path is kept


def _gpt2():
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(vocab_size=1000, n_positions=64, n_embd=64, n_layer=2, n_head=4)
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config).eval()


@pytest.mark.parametrize("build, expected", [
    (lambda: build_hf_model("llama"), 2 * 2 * 2 * 16 * 4),  # layers · (K, V) · KV heads · head_dim · fp32
    (lambda: build_hf_model("qwen3"), 2 * 2 * 2 * 32 * 4),  # head_dim named apart from hidden / heads
    (lambda: build_hf_model("qwen2"), 2 * 2 * 2 * 16 * 4),  # no head_dim in the config: hidden / heads
    (_gpt2, 2 * 2 * 4 * 16 * 4),  # no num_key_value_heads either: every head keeps its keys and values
], ids=["llama", "qwen3", "qwen2", "gpt2"])
def test_kv_bytes_per_token_counts_a_float32_cache_of_the_configs_shape(build, expected):
    from metagen.models import TransformersModel

    assert TransformersModel(build(), tokenizer=None).kv_bytes_per_token == expected


def test_token_trees_give_the_native_backends_logits_and_keep_a_path(adapter, model_fp32):
    """A tree row (root, 2 children, 4 grandchildren), a row without a tree, in one forward:
    the adapter's 4-D mask and position ids give the native tree forward's logits; keeping a
    path, the next step agrees too."""
    ids = model_fp32.tokenizer.encode(TEXT)[:20]
    tokens, parents = [11, 812, 45, 99, 100, 101, 102], [-1, 0, 0, 1, 1, 2, 2]
    outputs = {}
    for name, model in (("native", model_fp32), ("adapter", adapter)):
        cache = model.new_cache(2)
        model.forward(cache, [ids, ids[:13]])
        tree_out = model.forward(cache, [tokens, [5, 6]], logits="all", tree=[parents, None])
        cache.keep_path(0, len(ids), [0, 2, 5])
        outputs[name] = (tree_out, model.forward(cache, [[42], [43]], logits="all"))
        assert cache.lengths == [len(ids) + 4, 13 + 3]
    for native, adapted in zip(outputs["native"], outputs["adapter"]):
        assert_same_outputs(native, adapted)
