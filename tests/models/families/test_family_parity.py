"""Every family against transformers on the same tiny random weights, fp32, to 1e-4: over a
prompt, and through truncate / fork / ragged multi-token append, on both execution paths (the
fused decode kernels and the general PyTorch path); the same weights written as GGUF load to the
same logits (Llama: Q/K interleaved by the converter; Qwen3: rotate-half rows and q/k norms;
Phi-3: fused attn_qkv and gate+up in ffn_up; Gemma 3: 1 + w norms, llama.cpp's layer pattern;
Qwen3-MoE and Mixtral: the router and experts stacked as ffn_{gate,up,down}_exps).
Windows past the prompt are in test_sliding_window.py."""

import pytest
import torch

from metagen.models import load
from tests.models.families.tiny_checkpoints import FAMILIES, GGUF_ARCHITECTURES, build_hf_model, save_hf, write_gguf

pytestmark = pytest.mark.slow

PROMPT = [17, 2048, 311, 9001, 42, 777, 15, 30000, 123, 4567, 89, 1000]
TOLERANCE = 1e-4


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def pair(request, tmp_path_factory):
    hf = build_hf_model(request.param)
    directory = save_hf(hf, tmp_path_factory.mktemp(request.param))
    return request.param, hf, directory


def reference_logits(hf, ids):
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0].float()  # (T, V)


def assert_close(actual, expected):
    assert (actual - expected).abs().max().item() < TOLERANCE


def paths(model):
    return [False, True] if model.kernels is not None else [False]


def test_prompt_logits_match_transformers(pair):
    family, hf, directory = pair
    model = load(directory, dtype="fp32", use_cache=False)
    assert model.family == family
    expected = reference_logits(hf, PROMPT)
    for fused in paths(model):
        model.use_fused = fused
        assert_close(model.forward(model.new_cache(1), [PROMPT], logits="all").logits[0], expected)


def test_truncate_fork_and_ragged_append_match_transformers(pair):
    family, hf, directory = pair
    model = load(directory, dtype="fp32", use_cache=False)
    for fused in paths(model):
        model.use_fused = fused
        cache = model.new_cache(1)
        model.forward(cache, [PROMPT + [5, 6, 7]])
        cache.truncate(0, len(PROMPT))  # roll back three tokens
        cache.fork(0, 1)  # two rows sharing the prompt
        out = model.forward(cache, [[260], [1345, 42, 9]], logits="all")  # ragged append
        assert out.num_new == [1, 3]
        assert_close(out.logits[0, 0], reference_logits(hf, PROMPT + [260])[-1])
        assert_close(out.logits[1], reference_logits(hf, PROMPT + [1345, 42, 9])[-3:])
        out = model.forward(cache, [[11], [12]])  # one decode step per row
        assert_close(out.logits[0], reference_logits(hf, PROMPT + [260, 11])[-1])
        assert_close(out.logits[1], reference_logits(hf, PROMPT + [1345, 42, 9, 12])[-1])


@pytest.mark.parametrize("family", ["llama", "qwen3", "phi3", "qwen3_moe", "mixtral", "mixtral-per-expert", "qwen2_moe"])
def test_the_same_weights_as_gguf_load_to_the_same_logits(family, tmp_path):
    """(mixtral-per-expert: one GGUF tensor per expert, as llama.cpp's first Mixtral files.)"""
    family, _, layout = family.partition("-")
    hf = build_hf_model(family, tie_word_embeddings=family == "qwen3")
    path = write_gguf(hf, tmp_path / f"{family}.gguf", GGUF_ARCHITECTURES.get(family, family),
                      stacked_experts=layout != "per-expert")
    model = load(path, dtype="fp32", use_cache=False)
    assert model.family == family and model.config.qk_norm == (family in ("qwen3", "qwen3_moe"))
    assert model.config.num_experts == (8 if family.endswith("_moe") or family == "mixtral" else 0)
    expected = reference_logits(hf, PROMPT)
    for fused in paths(model):
        model.use_fused = fused
        cache = model.new_cache(1)
        assert_close(model.forward(cache, [PROMPT[:-2]], logits="all").logits[0], expected[:-2])
        assert_close(model.forward(cache, [PROMPT[-2:]], logits="all").logits[0], expected[-2:])


def test_a_gemma3_gguf_as_llama_cpp_writes_it_loads_to_the_same_logits(tmp_path):
    """llama.cpp's Gemma 3 GGUF: norm weights stored as 1 + w (not shifted again on load), no
    layer pattern (every 6th layer global), local RoPE base 10000, global base and linear scaling
    from the metadata, the window from attention.sliding_window."""
    hf = build_hf_model("gemma3", num_hidden_layers=6, layer_types=None, query_pre_attn_scalar=32)
    assert hf.config.layer_types[4:] == ["sliding_attention", "full_attention"]
    model = load(write_gguf(hf, tmp_path / "gemma3.gguf", "gemma3"), dtype="fp32", use_cache=False)
    assert model.family == "gemma3" and model.config.layer_types == tuple(hf.config.layer_types)
    expected = reference_logits(hf, PROMPT)
    for fused in paths(model):
        model.use_fused = fused
        cache = model.new_cache(1)
        assert_close(model.forward(cache, [PROMPT[:-2]], logits="all").logits[0], expected[:-2])
        assert_close(model.forward(cache, [PROMPT[-2:]], logits="all").logits[0], expected[-2:])


def test_legacy_gemma3_config_fields_give_the_same_layers(tmp_path):
    """Older Gemma 3 config.json files: sliding_window_pattern, rope_theta, rope_local_base_freq,
    rope_scaling instead of layer_types and per-kind rope_parameters."""
    import json

    from safetensors.torch import save_file

    from metagen.models.hf_reader import read_hf_directory

    fields = {"model_type": "gemma3_text", "vocab_size": 64, "hidden_size": 16, "intermediate_size": 32,
              "num_hidden_layers": 4, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8,
              "sliding_window": 4, "sliding_window_pattern": 2, "rope_theta": 1e6, "rope_local_base_freq": 5e3,
              "rope_scaling": {"rope_type": "linear", "factor": 8.0}, "query_pre_attn_scalar": 8}
    (tmp_path / "config.json").write_text(json.dumps(fields))
    save_file({}, str(tmp_path / "model.safetensors"))
    config, _ = read_hf_directory(tmp_path)
    assert config.layer_types == ("sliding_attention", "full_attention") * 2
    assert [config.layer_window(i) for i in range(4)] == [4, None, 4, None]
    assert (config.rope_theta, config.rope_local_theta, config.rope_scaling["factor"]) == (1e6, 5e3, 8.0)
    assert config.hidden_activation == "gelu_pytorch_tanh" and config.embed_scale == 4.0 and config.post_norms


def test_bf16_and_int8_stay_near_fp32(pair):
    """The other formats run the same layer; a coarse check that they load and agree in top-1."""
    family, hf, directory = pair
    expected = reference_logits(hf, PROMPT)
    for dtype in ("bf16", "int8"):
        model = load(directory, dtype=dtype, use_cache=False)
        logits = model.forward(model.new_cache(1), [PROMPT], logits="all").logits[0]
        agree = (logits.argmax(-1) == expected.argmax(-1)).float().mean().item()
        assert agree >= 0.75, (family, dtype, agree)


@pytest.mark.parametrize("family", ["qwen3", "phi3", "gemma3", "qwen3_moe"])
def test_the_conversion_cache_keeps_every_family_weight(family, tmp_path, temp_cache, monkeypatch):
    """q/k norms (optional LayerWeights fields), fused-name linears, the router and every expert
    survive the cache: the second load is a cache hit and gives the first load's logits exactly."""
    directory = save_hf(build_hf_model(family), tmp_path / family)
    first = load(directory, dtype="int8")
    import metagen.models.loading as loading

    monkeypatch.setattr(loading, "_convert", lambda *args: pytest.fail("the second load converted again"))
    second = load(directory, dtype="int8")
    if family == "qwen3_moe":
        assert second.layers[0].gate_up is None and len(second.layers[1].expert_down) == 8
        assert torch.equal(second.layers[1].router.weight, first.layers[1].router.weight)
    if family == "qwen3":
        assert second.layers[0].q_norm is not None and torch.equal(second.layers[0].k_norm, first.layers[0].k_norm)
    if family == "gemma3":
        assert torch.equal(second.layers[0].mlp_post_norm, first.layers[0].mlp_post_norm)
        assert second.config.layer_types == first.config.layer_types and second.config.embed_scale == 8.0
    logits = [m.forward(m.new_cache(1), [PROMPT], logits="all").logits for m in (first, second)]
    assert torch.equal(logits[0], logits[1])
