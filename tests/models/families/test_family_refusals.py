"""Checkpoint features the native backend does not implement are refused by name when the
checkpoint is read, never silently ignored; a sliding window smaller than the context limits the
context to the window, where attention is exact."""

import json

import pytest
import torch

from metagen.models import load
from tests.models.families.tiny_checkpoints import build_hf_model, save_hf

BASE = {"model_type": "llama", "vocab_size": 64, "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
        "num_attention_heads": 2, "num_key_value_heads": 1}


def directory_with(tmp_path, **fields):
    (tmp_path / "config.json").write_text(json.dumps({**BASE, **fields}))
    return tmp_path


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"model_type": "gpt_neox"}, "architecture 'gpt_neox' is not supported by the native backend"),
        ({"model_type": "qwen3_moe", "num_experts": 8, "shared_expert_intermediate_size": 64},
         "shared_expert_intermediate_size=64 (dense layers or shared experts"),
        ({"model_type": "qwen2", "num_experts": 8}, "num_experts=8 (a mixture of experts)"),
        ({"model_type": "qwen3_moe", "num_experts": 8, "decoder_sparse_step": 2}, "decoder_sparse_step=2 (dense layers"),
        ({"model_type": "qwen3_moe", "num_experts": 8, "mlp_only_layers": [0]}, "mlp_only_layers=[0] (dense layers"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_scaling type 'yarn' is not supported"),
        ({"model_type": "phi3", "rope_scaling": {"type": "longrope", "short_factor": [1.0], "long_factor": [2.0]}},
         "rope_scaling type 'longrope' is not supported"),
        ({"rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}},
         "rope_scaling type 'dynamic' is not supported"),
        ({"model_type": "phi3", "partial_rotary_factor": 0.75}, "partial_rotary_factor=0.75"),
        ({"hidden_act": "gelu"}, "hidden_act='gelu' is not supported"),
        ({"mlp_bias": True}, "mlp_bias=true is not supported"),
    ],
)
def test_unsupported_hf_features_are_refused_by_name(fields, message, tmp_path, temp_cache):
    directory = directory_with(tmp_path, **fields)
    with pytest.raises(NotImplementedError) as error:
        load(directory)
    assert str(error.value).startswith(str(directory / "config.json")) and message in str(error.value)
    assert "TransformersModel" in str(error.value) or "not supported by the native backend" in str(error.value)


def test_a_gguf_of_an_unsupported_architecture_is_refused_by_name(tmp_path, temp_cache):
    from gguf import GGUFWriter

    path = tmp_path / "gemma.gguf"
    writer = GGUFWriter(str(path), "gemma3")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(NotImplementedError, match=r"architecture 'gemma3' \(Gemma 3 .*load it with "
                                                  r"metagen.models.TransformersModel"):
        load(path)


@pytest.mark.parametrize("use_sliding_window, expected", [(False, None), (True, 8), (None, 8)])
def test_a_sliding_window_counts_unless_the_checkpoint_disables_it(use_sliding_window, expected, tmp_path):
    """Qwen2/3 configs carry a sliding_window with use_sliding_window=false (not applied)."""
    from safetensors.torch import save_file

    from metagen.models.weights import read_hf_directory

    fields = {"model_type": "qwen2", "sliding_window": 8, "max_position_embeddings": 64}
    if use_sliding_window is not None:
        fields["use_sliding_window"] = use_sliding_window
    directory = directory_with(tmp_path, **fields)
    save_file({}, str(directory / "model.safetensors"))
    config, _ = read_hf_directory(directory)
    assert config.sliding_window == expected and config.context_limit == (64 if expected is None else 8)


def test_mistral_sliding_window_limits_the_context_to_the_window(tmp_path):
    """Inside the window sliding-window attention is full attention (exact); past it the native
    backend would differ from transformers, so a longer row is refused naming sliding_window."""
    window = 8
    hf = build_hf_model("mistral", sliding_window=window)
    model = load(save_hf(hf, tmp_path), dtype="fp32", use_cache=False)
    assert model.max_context == window and model.config.sliding_window == window
    ids = [17, 2048, 311, 9001, 42, 777, 15, 30000]
    with torch.no_grad():
        expected = hf(torch.tensor([ids])).logits[0]
    cache = model.new_cache(1)
    assert (model.forward(cache, [ids], logits="all").logits[0] - expected).abs().max().item() < 1e-4
    with pytest.raises(ValueError, match=f"more than the model's context of {window} \\(sliding_window={window}"):
        model.forward(cache, [[5]])
    longer = ids + [5, 6, 7, 8]  # why it is refused: transformers' window changes these logits
    with torch.no_grad():
        windowed = hf(torch.tensor([longer])).logits[0, -1]
        hf.config.sliding_window = None
        full = hf(torch.tensor([longer])).logits[0, -1]
    assert (windowed - full).abs().max().item() > 1e-2


@pytest.mark.parametrize(
    "architecture, fields, message",
    [
        ("qwen3", {"expert_count": 8}, "qwen3.expert_count=8 (a mixture of experts) is not supported for architecture"),
        ("qwen3moe", {"expert_count": 8, "expert_shared_count": 1}, "qwen3moe.expert_shared_count=1 is not supported"),
        ("qwen3moe", {"expert_count": 8, "expert_gating_func": 2}, "qwen3moe.expert_gating_func=2 is not supported"),
        ("qwen3moe", {}, "a dense layer is not supported for architecture 'qwen3moe'"),
    ],
)
def test_a_gguf_mixture_of_experts_the_backend_lacks_is_refused_by_name(architecture, fields, message, tmp_path,
                                                                        temp_cache):
    from gguf import GGUFWriter

    path = tmp_path / "moe.gguf"
    writer = GGUFWriter(str(path), architecture)
    for key, value in fields.items():
        writer.add_uint32(f"{architecture}.{key}", value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(NotImplementedError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load(path)
