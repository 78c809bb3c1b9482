"""The int4 / int8 matrix kernels (models/kernels/matmul.cpp) against their PyTorch definition.

Definition (kernels/matmul.cpp, step by step): each row of x is quantized per block of 32
features, a = max|x|/L, xq = round(x/a) with L = 32258 (default, activations "int16")
or 127 (int8); y = (xq·a) · Wᵀ + bias with W the dequantized weight, computed in fp32 and rounded once to bf16. The reference below computes the same product
in float64 from the kernel's own quantized activations (checked separately against their
formula), so the only differences allowed are the final bf16 rounding (half a bf16 step,
2⁻⁹·|y|) and fp32 accumulation: |y − y_ref| ≤ 2⁻⁸·|y_ref| + 2⁻¹⁹·Σ_k |xq_k·a|·|W_nk|.
"""

import pytest
import torch

from metagen.models.kernels import matmul_kernels
from metagen.models.kernel_backend import resolve_backend
from metagen.models.linear import Int4Linear, Int8Linear
from metagen.models.packing import pack_int4, pack_int8, torch_int4_pack, unpack_int4, unpack_int8, unpack_torch_int4

kernels = matmul_kernels()
pytestmark = pytest.mark.skipif(kernels is None or kernels.best_isa() == 0, reason="matrix kernels unavailable here")
ISAS = ["avx2"] + (["avx512"] if kernels is not None and kernels.best_isa() >= 2 else [])
ROWS = [1, 2, 5, 16, 33, 64]


def dequantized_activations(x: torch.Tensor, wide: bool) -> torch.Tensor:
    """(M, K) float64: the kernel's codes times their block scales."""
    codes, _, _, scales = kernels.quantize_activations(x, wide)
    k = x.shape[-1]
    return (codes.double() * scales.double().repeat_interleave(32, dim=1))[:, :k]


def assert_matches_definition(y: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias=None, wide=True) -> None:
    xd = dequantized_activations(x.reshape(-1, x.shape[-1]), wide)
    w = weight.double()
    expected = xd @ w.t() + (0 if bias is None else bias.double())
    bound = 2.0**-8 * expected.abs() + 2.0**-19 * (xd.abs() @ w.abs().t()) + 1e-30
    error = (y.reshape(expected.shape).double() - expected).abs()
    assert y.dtype == (torch.float32 if x.dtype == torch.float32 else torch.bfloat16)  # x's dtype
    assert (error <= bound).all(), f"max error / bound {(error / bound).max().item():.3f}"


@pytest.mark.parametrize("wide", [True, False])
def test_activation_quantization_follows_its_formula(wide):
    torch.manual_seed(0)
    levels = 32258.0 if wide else 127.0
    x = torch.randn(3, 70) * torch.tensor([1.0, 1e-3, 50.0])[:, None]
    x[1, 32:64] = 0  # an all-zero block: scale 0, codes 0
    codes, hi, lo, scales = kernels.quantize_activations(x, wide)
    assert codes.shape == hi.shape == lo.shape == (3, 96) and scales.shape == (3, 3)
    padded = torch.nn.functional.pad(x, (0, 26)).view(3, 3, 32)
    amax = padded.abs().amax(-1)
    torch.testing.assert_close(scales, amax / levels, rtol=0, atol=0)
    inverse = torch.where(amax > 0, levels / amax, torch.zeros_like(amax))
    expected = torch.round(padded * inverse[..., None]).clamp(-levels, levels).view(3, 96)
    assert torch.equal(codes.float(), expected)
    assert codes[1, 32:64].eq(0).all() and scales[1, 1] == 0
    assert torch.equal(codes.int(), 254 * hi.int() + lo.int() if wide else hi.int())  # the int8 digits
    assert hi.abs().max() <= 127 and lo.abs().max() <= 127 and (wide or not lo.any())


@pytest.fixture(params=[True, False], ids=["int16", "int8"])
def wide(request):
    """Whether the linear under test takes int16 activation codes (else int8): `coded` sets it."""
    return request.param


def coded(linear, wide: bool):
    """`linear` set to quantize its activations to int16 (`wide`) or int8 codes."""
    linear.set_activations("int16" if wide else "int8")
    return linear


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("n,k", [(16, 32), (48, 96), (960, 576)])
def test_int4_matches_its_definition(isa, rows, n, k, wide):
    torch.manual_seed(rows * 1000 + n)
    linear = coded(Int4Linear.quantize(torch.randn(n, k) * 0.05, torch.randn(n) * 0.1, backend=isa), wide)
    x = (torch.randn(rows, k) * (1 + 10 * torch.rand(rows, 1))).to(torch.bfloat16)
    assert_matches_definition(linear(x), x, linear.dequantize(), linear.bias.float(), wide)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("n,k", [(16, 32), (37, 45), (1, 7), (200, 576)])
def test_int8_matches_its_definition_on_odd_shapes(isa, rows, n, k, wide):
    torch.manual_seed(rows * 1000 + n)
    linear = coded(Int8Linear.quantize(torch.randn(n, k) * 0.05, backend=isa), wide)
    x = torch.randn(rows, k) * 3  # float32 input is taken as is
    assert_matches_definition(linear(x), x, linear.dequantize(), None, wide)


@pytest.mark.parametrize("kind", ["int4", "int8"])
def test_rows_do_not_depend_on_the_batch_and_both_isas_agree_bit_for_bit(kind, wide):
    """Row r alone, inside 5, 16 or 64 rows, on AVX2 or AVX-512: the same bits."""
    torch.manual_seed(7)
    weight = torch.randn(96, 160) * 0.05
    x = torch.randn(64, 160).to(torch.bfloat16)
    make = Int4Linear.quantize if kind == "int4" else Int8Linear.quantize
    reference = torch.cat([coded(make(weight, backend="avx2"), wide)(x[r : r + 1]) for r in range(64)])
    for isa in ISAS:
        linear = coded(make(weight, backend=isa), wide)
        for rows in (5, 16, 33, 64):
            assert torch.equal(linear(x[:rows]), reference[:rows]), (isa, rows)
        assert torch.equal(linear(x.view(4, 16, 160)), reference.view(4, 16, 96))  # leading dims kept


def test_what_activation_quantization_costs():
    """Relative error of y against fp32 activations: int16 codes are below bf16 activations'
    (torch's kernels; both round y to bf16), int8 codes ~4x above."""
    torch.manual_seed(3)
    weight = torch.randn(256, 576) * 0.05
    x = torch.randn(16, 576)
    torch_path = Int4Linear.quantize(weight, backend="torch")
    exact = x.double() @ torch_path.dequantize().double().t()
    errors = {}
    for name in ("int16", "int8"):
        linear = Int4Linear.quantize(weight, backend=ISAS[-1])
        linear.set_activations(name)
        errors[name] = ((linear(x).double() - exact).norm() / exact.norm()).item()
    errors["torch"] = ((torch_path(x.bfloat16()).double() - exact).norm() / exact.norm()).item()
    assert errors["int16"] < errors["torch"] < errors["int8"] < 0.02, errors


@pytest.mark.parametrize("n", [16, 48, 64, 80, 1536])
def test_layouts_round_trip(n):
    torch.manual_seed(n)
    k = 96
    codes = torch.randint(0, 16, (n, k), dtype=torch.int32)
    assert torch.equal(unpack_torch_int4(torch_int4_pack(codes), n, k), codes)
    scales_and_zeros = torch.randn(k // 32, n, 2).to(torch.bfloat16)
    assert torch.equal(unpack_int4(pack_int4(codes, scales_and_zeros), n, k), codes)
    q = torch.randint(-127, 128, (n + 3, k + 5), dtype=torch.int8)
    assert torch.equal(unpack_int8(pack_int8(q), n + 3, k + 5), q)


def test_torch_fallback_and_kernels_store_the_same_state():
    torch.manual_seed(5)
    weight = torch.randn(64, 96)
    for make in (Int4Linear.quantize, Int8Linear.quantize):
        fallback, compiled = make(weight, backend="torch"), make(weight, backend=ISAS[-1])
        assert fallback.backend == "torch" and compiled.backend == ISAS[-1]
        for name, tensor in fallback.state().items():
            assert torch.equal(tensor, compiled.state()[name]), name
        assert torch.equal(fallback.dequantize(), compiled.dequantize())
        x = torch.randn(3, 96).to(torch.bfloat16)
        exact = x.double() @ fallback.dequantize().double().t()
        for linear in (fallback, compiled):  # both within 2% of the exact product
            assert ((linear(x).double() - exact).norm() / exact.norm()).item() < 0.02


def test_int8_with_a_minus_128_code_runs_torch():
    qweight = torch.full((16, 32), -128, dtype=torch.int8)
    linear = Int8Linear(qweight, torch.ones(16, dtype=torch.bfloat16), backend=ISAS[-1])
    assert linear.backend == "torch"
    assert linear(torch.ones(1, 32, dtype=torch.bfloat16)).eq(-4096).all()


def test_backend_switch(monkeypatch):
    monkeypatch.setenv("METAGEN_KERNELS", "torch")
    assert Int4Linear.quantize(torch.randn(16, 32)).backend == "torch"
    monkeypatch.setenv("METAGEN_KERNELS", "avx2")
    assert Int8Linear.quantize(torch.randn(16, 32)).backend == "avx2"
    monkeypatch.setenv("METAGEN_KERNELS", "fast")
    with pytest.raises(ValueError, match="METAGEN_KERNELS='fast': choose one of auto, torch, avx2, avx512"):
        resolve_backend()
    monkeypatch.setenv("METAGEN_KERNELS", "auto")
    with pytest.raises(ValueError, match="activations='fp8' is not supported: choose one of int16, int8"):
        Int4Linear.quantize(torch.randn(16, 32)).set_activations("fp8")
    with pytest.raises(ValueError, match="backend='sse': choose one of"):
        Int8Linear.quantize(torch.randn(16, 32), backend="sse")


def test_bad_inputs_are_refused_by_name():
    linear = Int8Linear.quantize(torch.randn(16, 32), backend=ISAS[-1])
    with pytest.raises(RuntimeError, match="in_features = 32, got 31"):
        linear(torch.randn(2, 31))
    with pytest.raises(RuntimeError, match="float32 or bfloat16"):
        linear(torch.randn(2, 32, dtype=torch.float64))


def test_the_instruction_peak_probe_does_the_multiply_adds_it_counts():
    """dot_peak: 12 accumulators × 16 lanes × 4 products of 3·5 per round (roofline.py times it)."""
    expected = 12 * 16 * 4 * 15 * 10 if kernels.best_isa() == 2 else -1
    assert kernels.dot_peak(10) == expected
