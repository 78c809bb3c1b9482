"""Checkpoint features the native backend does not implement are refused by name when the
checkpoint is read, never silently ignored; Qwen's unused sliding_window is not applied."""

import json

import pytest

from metagen.models import load

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
        ({"model_type": "gemma3_text", "hidden_activation": "relu"}, "hidden_activation='relu' is not supported"),
        ({"mlp_bias": True}, "mlp_bias=true is not supported"),
        ({"model_type": "gemma3_text", "final_logit_softcapping": 30.0}, "final_logit_softcapping=30.0 (logit soft"),
        ({"model_type": "gemma3_text", "attn_logit_softcapping": 50.0}, "attn_logit_softcapping=50.0 (logit soft"),
        ({"model_type": "gemma3_text", "use_bidirectional_attention": True}, "use_bidirectional_attention=true"),
        ({"model_type": "gemma3", "text_config": {}}, "model_type 'gemma3' (Gemma3ForConditionalGeneration"),
        ({"model_type": "gemma2"}, "architecture 'gemma2' (Gemma 2 (logit soft-capping"),
        ({"model_type": "gemma3_text", "rope_parameters": {"sliding_attention": {"rope_type": "yarn", "factor": 2.0}}},
         "rope_parameters.sliding_attention type 'yarn' is not supported"),
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
    writer = GGUFWriter(str(path), "gemma2")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(NotImplementedError, match=r"architecture 'gemma2' \(Gemma 2 .*load it with "
                                                  r"metagen.models.TransformersModel"):
        load(path)


def test_a_gemma3_gguf_with_logit_softcapping_is_refused_by_name(tmp_path, temp_cache):
    from gguf import GGUFWriter

    path = tmp_path / "capped.gguf"
    writer = GGUFWriter(str(path), "gemma3")
    writer.add_final_logit_softcapping(30.0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(NotImplementedError, match=r"gemma3.final_logit_softcapping=30.0 \(logit soft-capping\)"):
        load(path)


@pytest.mark.parametrize("use_sliding_window, expected", [(False, None), (True, 8), (None, 8)])
def test_a_sliding_window_counts_unless_the_checkpoint_disables_it(use_sliding_window, expected, tmp_path):
    """Qwen2/3 configs carry a sliding_window with use_sliding_window=false (not applied)."""
    from safetensors.torch import save_file

    from metagen.models.hf_reader import read_hf_directory

    fields = {"model_type": "qwen2", "sliding_window": 8, "max_position_embeddings": 64}
    if use_sliding_window is not None:
        fields["use_sliding_window"] = use_sliding_window
    directory = directory_with(tmp_path, **fields)
    save_file({}, str(directory / "model.safetensors"))
    config, _ = read_hf_directory(directory)
    assert config.sliding_window == expected and config.cache_window == expected


def test_qwen2_max_window_layers_keeps_the_first_layers_global(tmp_path):
    """Qwen2 with use_sliding_window: layers from max_window_layers on are windowed (transformers'
    layer_types when config.json has none); the cache then cannot release slots."""
    from safetensors.torch import save_file

    from metagen.models.hf_reader import read_hf_directory

    directory = directory_with(tmp_path, model_type="qwen2", num_hidden_layers=3, sliding_window=8,
                               use_sliding_window=True, max_window_layers=1)
    save_file({}, str(directory / "model.safetensors"))
    config, _ = read_hf_directory(directory)
    assert [config.layer_window(i) for i in range(3)] == [None, 8, 8] and config.cache_window is None



@pytest.mark.parametrize("fields, expected", [({}, True), ({"qkv_bias": False}, False),
                                              ({"qkv_bias": False, "attention_bias": True}, True)])
def test_a_family_reads_config_keys_it_names_otherwise(fields, expected, tmp_path):
    """Qwen2-MoE's `qkv_bias` stands for `attention_bias` when that is absent
    (`Family.hf_config_aliases`); the family's default holds when neither is set."""
    from safetensors.torch import save_file

    from metagen.models.hf_reader import read_hf_directory

    directory = directory_with(tmp_path, model_type="qwen2_moe", num_experts=4, num_experts_per_tok=2,
                               moe_intermediate_size=8, shared_expert_intermediate_size=16, **fields)
    save_file({}, str(directory / "model.safetensors"))
    config, _ = read_hf_directory(directory)
    assert config.attention_bias is expected


def test_max_window_layers_is_read_only_for_a_family_that_declares_it(tmp_path):
    """A Llama config carrying max_window_layers keeps every layer windowed: only families with
    `hf_leading_global_layers` (the Qwen ones) keep their first layers global."""
    from safetensors.torch import save_file

    from metagen.models.hf_reader import read_hf_directory

    directory = directory_with(tmp_path, num_hidden_layers=3, sliding_window=8, max_window_layers=1)
    save_file({}, str(directory / "model.safetensors"))
    config, _ = read_hf_directory(directory)
    assert config.layer_types is None and config.cache_window == 8

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
