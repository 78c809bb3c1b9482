"""Weight formats: exact int4 mapping of GGUF Q4 blocks, and each dtype's faithfulness."""

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

from metagen.models.linear import Int4Linear, Int8Linear
from metagen.models.weights import WeightSource


@pytest.mark.parametrize("qtype", [GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q4_1])
def test_q4_blocks_map_exactly_onto_int4_codes(qtype):
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((32, 64)).astype(np.float32)
    raw = quantize(weight, qtype)
    source = WeightSource("w", raw=raw, qtype=qtype)
    codes, scales, zeros = source.int4_codes()
    groups = codes.float().view(32, 2, 32)
    rebuilt = ((groups - 8) * scales[..., None] + zeros[..., None]).view(32, 64)
    torch.testing.assert_close(rebuilt, torch.from_numpy(dequantize(raw, qtype)), atol=1e-5, rtol=0)


def test_int4_kernel_reproduces_q4_1_up_to_bf16_scales():
    rng = np.random.default_rng(1)
    weight = rng.standard_normal((64, 128)).astype(np.float32) * 0.05
    raw = quantize(weight, GGMLQuantizationType.Q4_1)
    source = WeightSource("w", raw=raw, qtype=GGMLQuantizationType.Q4_1)
    linear = Int4Linear.from_codes(*source.int4_codes())
    reference = torch.from_numpy(dequantize(raw, GGMLQuantizationType.Q4_1))
    # scales and zeros are stored in bf16 by the kernel: relative error ≤ 2^-8 of each block's range
    assert (linear.dequantize() - reference).abs().max().item() < 2e-3


def test_int8_quantization_error_is_bounded_by_half_a_step():
    weight = torch.randn(48, 96)
    linear = Int8Linear.quantize(weight)
    step = linear.scales.float()[:, None]
    assert (step >= weight.abs().amax(dim=1, keepdim=True) / 127).all()  # no weight is clipped
    assert ((linear.dequantize() - weight).abs() <= step * (0.5 + 1e-3)).all()


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["bf16", "int8", "int4"])
def test_compact_dtypes_stay_close_to_fp32(model_fp32, dtype):
    from metagen.models import load

    model = load(dtype=dtype)
    ids = model.tokenizer.encode_chat([{"role": "user", "content": "Name three colours of the rainbow."}])
    reference = model_fp32.forward(model_fp32.new_cache(1), [ids], logits="all").logits[0]
    logits = model.forward(model.new_cache(1), [ids], logits="all").logits[0]
    p = torch.log_softmax(reference, -1)
    q = torch.log_softmax(logits, -1)
    kl = (p.exp() * (p - q)).sum(-1)  # KL(fp32 ‖ dtype) per position
    agreement = (reference.argmax(-1) == logits.argmax(-1)).float().mean().item()
    assert kl.mean().item() < 0.02, f"{dtype}: mean KL {kl.mean().item():.4f}"
    assert agreement > 0.9, f"{dtype}: top-1 agreement {agreement:.3f}"


@pytest.mark.parametrize("backend", ["torch", None])
@pytest.mark.parametrize("make", [Int4Linear.quantize, Int8Linear.quantize], ids=["int4", "int8"])
def test_a_strided_input_runs_on_every_backend(make, backend):
    """An MLP's activated gate is a slice of the gate·up output (not contiguous for several
    tokens); torch's int4 / int8 kernels refuse such a matrix, so the linears make it contiguous."""
    torch.manual_seed(11)
    linear = make(torch.randn(32, 64) * 0.1, backend=backend)
    both = torch.randn(2, 3, 128).to(torch.bfloat16)
    strided = both[..., :64]
    assert not strided.is_contiguous()
    assert torch.equal(linear(strided), linear(strided.contiguous()))
