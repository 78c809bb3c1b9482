"""Every GGML type the gguf package can dequantize loads; the others are refused by name."""

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize, quantize

from metagen.models.loading import _linear
from metagen.models.weights import WeightSource

T = GGMLQuantizationType


def relative_error(actual, expected):
    return ((actual - expected).norm() / expected.norm()).item()


def k_quant_blocks(qtype, rows, cols, seed=0):
    """Random but valid super-blocks: random codes and scales, fp16 super-scales set to sane
    values (random bytes there could decode to inf/NaN)."""
    block, size = GGML_QUANT_SIZES[qtype]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=(rows, cols // block, size), dtype=np.uint8)
    scale = np.frombuffer(np.float16(0.01).tobytes(), dtype=np.uint8)
    if qtype in (T.Q3_K, T.Q6_K):
        raw[..., -2:] = scale  # d closes the block
    elif qtype == T.Q2_K:
        raw[..., -4:] = np.tile(scale, 2)  # d, dmin close the block
    else:
        raw[..., 0:4] = np.tile(scale, 2)  # d, dmin open the block (Q4_K, Q5_K)
    return raw.reshape(rows, -1)


@pytest.mark.parametrize("qtype", [T.F16, T.BF16, T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1])
@pytest.mark.parametrize("dtype", ["fp32", "int8", "int4"])
def test_quantizable_types_load_in_every_dtype(qtype, dtype):
    rng = np.random.default_rng(1)
    weight = rng.standard_normal((64, 256)).astype(np.float32) * 0.1
    raw = quantize(weight, qtype)
    source = WeightSource("w", raw=raw, qtype=qtype)
    expected = torch.from_numpy(dequantize(raw, qtype).astype(np.float32))
    torch.testing.assert_close(source.dense(), expected)
    linear = _linear({"w": source}, ["w"], dtype)
    x = torch.randn(3, 256)
    activation = torch.float32 if dtype == "fp32" else torch.bfloat16
    y = linear(x.to(activation)).float()
    reference = x @ expected.t()
    # int4 re-quantization (min/max per 32 weights) costs ~10% relative error on Gaussian
    # weights unless the blocks map exactly (Q4_0 / Q4_1); bf16 activations ~0.5%.
    exact = dtype != "int4" or qtype in (T.Q4_0, T.Q4_1)
    assert relative_error(y, reference) < (0.02 if exact else 0.15)


@pytest.mark.parametrize("qtype", [T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K])
def test_k_quants_dequantize_and_requantize(qtype):
    raw = k_quant_blocks(qtype, 32, 512)
    source = WeightSource("w", raw=raw, qtype=qtype)
    expected = torch.from_numpy(dequantize(raw, qtype).astype(np.float32))
    # Q4_K's sub-blocks are the kernel's group-32 affine form; the other K-quants are re-quantized
    assert (source.int4_codes() is not None) == (qtype == T.Q4_K)
    torch.testing.assert_close(source.dense(), expected)
    linear = _linear({"w": source}, ["w"], "int4")
    assert linear.kind == "int4"
    x = torch.randn(2, 512)
    reference = x @ expected.t()
    y = linear(x.bfloat16()).float()
    assert relative_error(y, reference) < (0.02 if qtype == T.Q4_K else 0.15)


@pytest.mark.parametrize("qtype", [T.Q8_1, T.F64])
def test_types_gguf_cannot_dequantize_are_refused_by_name(qtype):
    block, size = GGML_QUANT_SIZES[qtype]
    source = WeightSource("blk.0.attn_q.weight", raw=np.zeros((2, 2 * size), dtype=np.uint8), qtype=qtype)
    with pytest.raises(NotImplementedError, match=qtype.name):
        source.dense()
