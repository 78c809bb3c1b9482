"""FLOPs comparable across the models of a sweep: every local model counts

    2·N + 4·layers·heads·head_dim·context   per processed token,

N = the parameters a token multiplies through (all but the input embedding table, the LM head
once, tied or not), checked here against counts made by hand from the architectures, and the
same for the native backend and the transformers adapter on one checkpoint."""

from __future__ import annotations

import pytest
import torch

from metagen.decoding.cost import forward_flops
from metagen.models.config import ModelConfig


def _by_hand(vocab, hidden, intermediate, layers, heads, kv_heads, head_dim, context) -> float:
    """The formula written out for a dense SwiGLU decoder with RMSNorms and an LM head."""
    q, kv = heads * head_dim, kv_heads * head_dim
    per_layer = hidden * q + 2 * hidden * kv + q * hidden + 3 * hidden * intermediate + 2 * hidden
    non_embedding = layers * per_layer + hidden + vocab * hidden  # + final norm + LM head
    return 2.0 * non_embedding + 4.0 * layers * q * context


def test_embedded_smollm2_counts_the_formula_exactly():
    """SmolLM2-135M (tied head): its GGUF's architecture, read without loading the weights."""
    from metagen.models import embedded_model_path
    from metagen.models.gguf_reader import read_gguf

    config, _, _ = read_gguf(embedded_model_path())
    assert (config.vocab_size, config.hidden_size, config.num_hidden_layers, config.tie_word_embeddings) == \
        (49152, 576, 30, True)
    expected = _by_hand(49152, 576, 1536, 30, 9, 3, 64, context=7)
    assert config.flops_per_token(7) == expected
    assert config.non_embedding_parameters == config.num_parameters == 134_515_008  # the tied head multiplies
    assert forward_flops(config, 0, 3) == sum(config.flops_per_token(c) for c in (1, 2, 3))


@pytest.mark.parametrize("tied", [True, False])
def test_a_tiny_config_counts_the_formula_exactly_tied_or_not(tied):
    """Tying the head changes the parameters stored, not the FLOPs of a token."""
    config = ModelConfig("llama", vocab_size=100, hidden_size=8, intermediate_size=16, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=4, max_position_embeddings=64,
                         tie_word_embeddings=tied)
    assert config.flops_per_token(5) == _by_hand(100, 8, 16, 2, 2, 1, 4, context=5)
    assert config.num_parameters == config.non_embedding_parameters + (0 if tied else 100 * 8)


@pytest.mark.parametrize("tied", [True, False])
def test_the_transformers_adapter_counts_as_the_native_backend(tmp_path, tied):
    """One tiny random checkpoint through both backends: equal FLOPs per token at every context
    (the adapter counted 2·(all parameters, the embedding table included) and no attention)."""
    pytest.importorskip("transformers")
    from metagen.models import TransformersModel, load
    from tests.models.families.tiny_checkpoints import build_hf_model, save_hf

    directory = save_hf(build_hf_model("llama", tie_word_embeddings=tied), tmp_path / "tiny")
    native = load(directory, "fp32", use_cache=False)
    adapter = TransformersModel.from_pretrained(str(directory), dtype=torch.float32)
    for context in (1, 9, 200):
        assert adapter.flops_per_token(context) == native.flops_per_token(context) == \
            _by_hand(49152, 64, 128, 2, 4, 2, 16, context)
