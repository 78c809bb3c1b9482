"""Tiny random checkpoints of every supported family, built with transformers from a config
(2 layers, hidden 64, 4 heads over 2 KV heads, the embedded model's tokenizer) and saved as
safetensors; `write_gguf` writes the same weights as a GGUF file the way llama.cpp's converter
names and orders them. Nothing is downloaded."""

import numpy as np
import pytest
import torch

VOCAB = 49152  # the embedded tokenizer's
COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5, tie_word_embeddings=False)
FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(rope_theta=10000.0)),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(sliding_window=None)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(tie_word_embeddings=True)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=32)),  # head_dim != hidden / heads, as in Qwen3
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(sliding_window=None, pad_token_id=0)),
    # Local layers with a window of 4 (< the test prompts), a global one between them; head_dim and
    # query_pre_attn_scalar differ from hidden / heads; global RoPE linearly scaled, local unscaled.
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(
        num_hidden_layers=3, head_dim=32, query_pre_attn_scalar=24, sliding_window=4, tie_word_embeddings=True,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}})),
    # Mixtures of experts: 8 experts, top-2 (Qwen3-MoE renormalised by norm_topk_prob).
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                  dict(head_dim=32, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True)),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM",
                dict(num_local_experts=8, num_experts_per_tok=2, intermediate_size=32, sliding_window=None)),
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM",  # plus a shared expert, top-k not renormalised
                  dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=64,
                       norm_topk_prob=False, decoder_sparse_step=1, mlp_only_layers=[])),
}
# llama.cpp's GGUF architecture of each family (Mixtral is a "llama" file with experts).
GGUF_ARCHITECTURES = {"qwen3_moe": "qwen3moe", "mixtral": "llama", "qwen2_moe": "qwen2moe"}


def build_hf_model(family: str, **overrides):
    """A random fp32 transformers model of `family`. Weights ~ N(0, 0.1²) (norms 1 + N(0, 0.1²),
    biases included) rather than the tiny init, so every weight moves the logits."""
    transformers = pytest.importorskip("transformers")
    config_name, model_name, extra = FAMILIES[family]
    config = getattr(transformers, config_name)(**{**COMMON, **extra, **overrides})
    torch.manual_seed(0)
    model = getattr(transformers, model_name)(config).float().eval()
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            noise = torch.randn(parameter.shape, generator=generator) * 0.1
            parameter.copy_(1 + noise if "norm" in name else noise)
    return model


def save_hf(model, directory):
    """The model as an HF directory (config.json + model.safetensors) with the embedded tokenizer."""
    from gguf import GGUFReader

    from metagen.models import embedded_model_path
    from metagen.models.tokenizer import Tokenizer

    model.save_pretrained(str(directory))
    Tokenizer.from_gguf(GGUFReader(str(embedded_model_path()))).save(directory)
    return directory


def _llama_permute(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter for Llama: rotate-half rows (h, j, i) -> interleaved rows (h, i, j)."""
    rows = weight.shape[0]
    return weight.reshape(heads, 2, rows // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def write_gguf(model, path, architecture: str, expert_types: dict | None = None, stacked_experts: bool = True):
    """`model`'s weights as an F32 GGUF with llama.cpp's names and metadata, plus the embedded
    model's tokenizer fields. Llama (and Mixtral) Q/K rows are permuted to interleaved pairs as
    llama.cpp does; Gemma 3 norm weights get their 1 added (llama.cpp stores 1 + w), its global
    RoPE base and scaling and its sliding window are written, no layer pattern (llama.cpp fixes
    every 6th layer global); experts are written stacked, (E, rows, in) as `ffn_{gate,up,down}_exps`,
    with the router as `ffn_gate_inp` and the expert metadata of llama.cpp's converter;
    `expert_types` quantizes them, e.g. {"ffn_gate_exps": GGMLQuantizationType.Q4_0};
    `stacked_experts=False` writes one tensor per expert (`ffn_gate.{e}`, llama.cpp's first Mixtral
    layout)."""
    from gguf.quants import quantize
    from gguf import GGUFReader, GGUFWriter

    from metagen.models import embedded_model_path

    config = model.config
    writer = GGUFWriter(str(path), architecture)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    experts = getattr(config, "num_experts", None) or getattr(config, "num_local_experts", None)
    if experts:
        writer.add_expert_count(experts)
        writer.add_expert_used_count(config.num_experts_per_tok)
        if hasattr(config, "moe_intermediate_size"):
            writer.add_expert_feed_forward_length(config.moe_intermediate_size)
        if hasattr(config, "shared_expert_intermediate_size"):
            writer.add_expert_shared_feed_forward_length(config.shared_expert_intermediate_size)
    rope = getattr(config, "rope_parameters", None) or {"rope_theta": config.rope_theta}
    rope = rope.get("full_attention", rope)
    writer.add_rope_freq_base(rope["rope_theta"])
    if rope.get("rope_type") == "linear":
        from gguf import RopeScalingType

        writer.add_rope_scaling_type(RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(rope["factor"])
    if architecture == "gemma3":
        writer.add_sliding_window(config.sliding_window)
    embedded = GGUFReader(str(embedded_model_path()))
    for key, field in embedded.fields.items():
        if key.startswith("tokenizer."):
            writer.add_key_value(key, field.contents(), field.types[0], field.types[-1] if len(field.types) > 1 else None)
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    layer_names = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
                   "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
                   "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm", "mlp.gate_proj": "ffn_gate",
                   "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
                   "self_attn.qkv_proj": "attn_qkv", "mlp.gate_up_proj": "ffn_up",  # Phi-3's fused tensors
                   "mlp.gate": "ffn_gate_inp",  # the router of a mixture of experts
                   "mlp.shared_expert.gate_proj": "ffn_gate_shexp", "mlp.shared_expert.up_proj": "ffn_up_shexp",
                   "mlp.shared_expert.down_proj": "ffn_down_shexp", "mlp.shared_expert_gate": "ffn_gate_inp_shexp"}
    if architecture == "gemma3":
        layer_names.update({"post_attention_layernorm": "post_attention_norm", "pre_feedforward_layernorm": "ffn_norm",
                            "post_feedforward_layernorm": "post_ffw_norm"})
    for name, tensor in model.state_dict().items():
        array = tensor.detach().float().numpy().copy()
        if architecture == "gemma3" and name.endswith("norm.weight"):
            array = array + 1  # llama.cpp's converter stores Gemma's (1 + w)
        if name in names:
            if name == "lm_head.weight" and config.tie_word_embeddings:
                continue
            writer.add_tensor(names[name], array)
            continue
        _, _, index, rest = name.split(".", 3)
        stacked = {}
        if rest == "mlp.experts.gate_up_proj":  # (E, 2·I, H) in memory: gate rows, then up rows
            stacked = dict(zip(("ffn_gate_exps", "ffn_up_exps"), np.split(array, 2, axis=1)))
        if rest == "mlp.experts.down_proj":  # (E, H, I)
            stacked = {"ffn_down_exps": array}
        for gguf_name, experts in stacked.items():
            qtype = (expert_types or {}).get(gguf_name)
            experts = np.ascontiguousarray(experts)
            if not stacked_experts:
                for e, expert in enumerate(experts):
                    writer.add_tensor(f"blk.{index}.{gguf_name.removesuffix('_exps')}.{e}.weight", expert)
            elif qtype is None:
                writer.add_tensor(f"blk.{index}.{gguf_name}.weight", experts)
            else:
                writer.add_tensor(f"blk.{index}.{gguf_name}.weight", quantize(experts, qtype), raw_dtype=qtype)
        if stacked:
            continue
        module, kind = rest.rsplit(".", 1)
        if module == "mlp.shared_expert_gate":  # llama.cpp stores this (1, H) weight as a vector
            array = array.reshape(-1)
        if architecture == "llama" and module in ("self_attn.q_proj", "self_attn.k_proj"):
            heads = config.num_attention_heads if module.endswith("q_proj") else config.num_key_value_heads
            array = _llama_permute(array, heads)
        writer.add_tensor(f"blk.{index}.{layer_names[module]}.{kind}", array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
