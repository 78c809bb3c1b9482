"""The native backend against transformers' LlamaForCausalLM on the same GGUF weights."""

import pytest
import torch

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def hf_model():
    pytest.importorskip("transformers")
    from metagen.models import TransformersModel, embedded_model_path

    path = embedded_model_path()
    return TransformersModel.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)


def prompt_ids(model, length=64):
    text = (
        "The history of mathematics spans thousands of years, from counting marks on bones to "
        "modern proofs checked by computers. Early civilizations in Mesopotamia and Egypt used "
        "arithmetic for trade, astronomy and building; Greek geometers introduced deductive proof. "
        "Indian scholars gave the world positional notation and zero, which travelled west through "
        "Baghdad, where al-Khwarizmi wrote the treatise that named algebra."
    )
    ids = model.tokenizer.encode(text, add_special_tokens=False)
    assert len(ids) >= length
    return ids[:length]


def test_fp32_logits_match_transformers_within_1e_3(model_fp32, hf_model):
    ids = prompt_ids(model_fp32)
    native = model_fp32.forward(model_fp32.new_cache(1), [ids], logits="all").logits[0]
    with torch.no_grad():
        reference = hf_model.hf_model(torch.tensor([ids])).logits[0].float()
    assert (native - reference).abs().max().item() < 1e-3


def test_transformers_adapter_cache_ops_match_native(model_fp32, hf_model):
    ids = prompt_ids(model_fp32, 24)
    results = []
    for model in (model_fp32, hf_model):
        cache = model.new_cache(1)
        model.forward(cache, [ids + [11, 12]])
        cache.truncate(0, len(ids))  # roll back two tokens
        cache.fork(0, 1)  # two rows sharing the prompt
        out = model.forward(cache, [[260], [1345, 42]], logits="all", hidden=True)
        results.append(out)
    native, adapter = results
    assert native.num_new == adapter.num_new == [1, 2]
    torch.testing.assert_close(native.logits[0, :1], adapter.logits[0, :1], atol=1e-3, rtol=0)
    torch.testing.assert_close(native.logits[1], adapter.logits[1], atol=1e-3, rtol=0)
    torch.testing.assert_close(native.hidden[1], adapter.hidden[1], atol=1e-3, rtol=0)
