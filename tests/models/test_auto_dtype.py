"""The default dtype "auto" never runs a tensor below the precision its checkpoint stores:
int4 where GGUF blocks map exactly onto the int4 kernel (Q4_0, Q4_1, Q4_K), the grouped 5/6/8-bit
kernel for Q5_0, Q5_1, Q5_K, Q6_K and Q8_0 (their own codes), int8 per row for the other
quantized types, bf16 for float tensors."""

import json

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

from metagen.models.loading import _linear
from metagen.models.weights import WeightSource
from tests.models.test_gguf_types import k_quant_blocks, relative_error

T = GGMLQuantizationType


def source_of(qtype, rows=64, cols=512, seed=0):
    if qtype in (T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K):
        return WeightSource("w", raw=k_quant_blocks(qtype, rows, cols, seed), qtype=qtype)
    weight = np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32) * 0.1
    if qtype in (T.F32, T.F16, T.BF16):
        return WeightSource("w", dense_tensor=torch.from_numpy(weight))
    return WeightSource("w", raw=quantize(weight, qtype), qtype=qtype)


def dequantized(source):
    if source.raw is None:
        return source.dense_tensor.float()
    return torch.from_numpy(dequantize(source.raw, source.qtype).astype(np.float32))


@pytest.mark.parametrize(
    ("qtype", "kind"),
    [(T.Q4_0, "int4"), (T.Q4_1, "int4"), (T.Q4_K, "int4g32k"), (T.Q5_0, "int5g32"), (T.Q5_1, "int5g32"),
     (T.Q8_0, "int8g32"), (T.Q2_K, "int8"), (T.Q3_K, "int8"), (T.Q5_K, "int5g32k"), (T.Q6_K, "int6g16k"),
     (T.F32, "dense")],
)
def test_auto_keeps_each_stored_format_and_stays_close_to_the_file(qtype, kind):
    source = source_of(qtype)
    linear = _linear({"w": source}, ["w"], "auto")
    assert linear.kind == kind
    assert linear.stored == ("dense" if qtype == T.F32 else qtype.name)
    x = torch.randn(4, 512)
    reference = x @ dequantized(source).t()
    # bf16 activations (and bf16 scales) cost ~0.5%; a re-quantization to int4 would cost ~10%
    assert relative_error(linear(x.bfloat16()).float(), reference) < 0.02


def test_auto_runs_each_part_of_a_fused_linear_in_its_own_format():
    sources = {"q": source_of(T.Q4_1, seed=1), "k": source_of(T.Q4_0, seed=2), "v": source_of(T.Q8_0, seed=3),
               "g": source_of(T.Q4_K, seed=4)}
    assert _linear(sources, ["q", "k"], "auto").kind == "int4"
    fused = _linear(sources, ["q", "k", "v", "g"], "auto")
    assert fused.kind == "concat" and fused.stored == "Q4_0+Q4_1+Q4_K+Q8_0"
    assert [part.kind for part in fused.parts] == ["int4", "int8g32", "int4g32k"]  # q and k as one int4 linear
    x = torch.randn(3, 512)
    reference = x @ torch.cat([dequantized(sources[n]) for n in "qkvg"]).t()
    assert fused(x.bfloat16()).shape == (3, 256)
    assert relative_error(fused(x.bfloat16()).float(), reference) < 0.01


def test_k_quants_run_exactly_their_own_blocks():
    """Q4_K / Q5_K / Q6_K keep their two-level scales: the weight the kernel holds is the file's,
    bit for bit (no value rounded to bf16 or fp16 on the way)."""
    for qtype in (T.Q4_K, T.Q5_K, T.Q6_K):
        linear = _linear({"w": source_of(qtype)}, ["w"], "auto")
        assert linear.factored and torch.equal(linear.dequantize(), dequantized(source_of(qtype)))


def test_explicit_int4_requantizes_what_auto_keeps():
    source = source_of(T.Q6_K)
    assert _linear({"w": source}, ["w"], "int4").kind == "int4"
    assert _linear({"w": source}, ["w"], "auto").kind == "int6g16k"


@pytest.mark.slow
def test_default_load_of_the_embedded_q4_1_file(model, capsys):
    from metagen.cli import main
    from metagen.models.loading import weight_formats

    assert model.dtype == "auto"
    formats = weight_formats(model)
    layers = model.config.num_hidden_layers
    for name in ("qkv", "o", "gate_up", "down"):
        assert formats[name] == {"int4 from Q4_1": layers}  # the file's own 4-bit blocks
    assert formats["lm_head"] == {"int8g32 from Q8_0": 1}  # tied to the Q8_0 embedding, its own blocks
    assert main(["info", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["weights"] == formats


@pytest.mark.slow
def test_quantized_self_draft_must_read_fewer_bytes_than_an_auto_target(model):
    from metagen.models import load
    from metagen.speculative import quantized_model
    from metagen.speculative.self_draft import weight_bytes

    with pytest.raises(ValueError, match="int8 draft is not cheaper than the auto target"):
        quantized_model(model, "int8")  # the embedded file already runs in int4 under auto
    target = load(dtype="bf16")
    draft = quantized_model(target, "int4")
    # the same int4 layers; the draft's head is int8 per row, auto's the file's Q8_0 blocks (+6%)
    assert weight_bytes(draft) < weight_bytes(model) < weight_bytes(target)
    head = model.lm_head
    if head.backend == "torch":  # METAGEN_KERNELS=torch runs a grouped head as a dense bf16 matrix
        assert head.nbytes == head.out_features * head.in_features * 2
    else:
        assert weight_bytes(model) - weight_bytes(draft) < 0.07 * head.nbytes
