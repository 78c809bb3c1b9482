"""HF safetensors directories: tiny random Llama / Qwen2 checkpoints written by transformers
load natively and give transformers' logits (q/k/v bias, untied head, RoPE scaling, NEOX
permutation into metagen's interleaved layout)."""

import pytest
import torch

transformers = pytest.importorskip("transformers")

from metagen.models import embedded_model_path, load  # noqa: E402


@pytest.fixture(scope="module")
def tokenizer_files(tmp_path_factory):
    """tokenizer.json + tokenizer_config.json of the embedded model, shared by the tiny models."""
    from transformers import AutoTokenizer

    path = embedded_model_path()
    directory = tmp_path_factory.mktemp("tokenizer")
    AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name).save_pretrained(directory)
    return directory


def write_tiny_model(directory, tokenizer_files, config):
    import shutil

    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():  # random norms so a wrong norm weight shows up in the logits
        for name, parameter in model.named_parameters():
            if "norm" in name:
                parameter.uniform_(0.5, 1.5)
    model.save_pretrained(directory, safe_serialization=True)
    for item in tokenizer_files.iterdir():
        shutil.copy(item, directory / item.name)
    return model


CASES = {
    "qwen2-bias-untied": lambda: transformers.Qwen2Config(
        vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        tie_word_embeddings=False, rope_theta=1000000.0,
    ),
    "llama-rope-llama3": lambda: transformers.LlamaConfig(
        vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=4096,
        tie_word_embeddings=True, rope_theta=500000.0,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_tiny_checkpoint_matches_transformers(case, tmp_path, tokenizer_files):
    reference = write_tiny_model(tmp_path, tokenizer_files, CASES[case]())
    model = load(tmp_path, dtype="fp32", use_cache=False)
    ids = list(range(5, 300, 3))  # 99 positions: past the llama3 scaling's original context
    with torch.no_grad():
        expected = reference(torch.tensor([ids])).logits[0]
    logits = model.forward(model.new_cache(1), [ids], logits="all").logits[0]
    torch.testing.assert_close(logits, expected, atol=1e-4, rtol=1e-4)
    assert model.tokenizer.encode("hello world", add_special_tokens=False) == [28120, 905]
