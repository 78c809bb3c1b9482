"""The grouped 4-, 5-, 6- and 8-bit kernel (kernels/matmul.cpp, linear.GroupedLinear), its plain
and two-level ("factored", linear.Factored) scales, and GGUF's blocks that map onto it exactly
(gguf_blocks.group_codes).

The definition and the error bound are the int4 / int8 kernels' (test_matmul_kernels.py): the
product of the kernel's own quantized activations with the dequantized weight, in float64.
"""

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

from metagen.models.gguf_blocks import GROUPED_TYPES, group_codes
from metagen.models.linear import GroupedLinear
from metagen.models.packing import Factored, pack_grouped, unpack_grouped
from tests.models.test_gguf_types import k_quant_blocks
from tests.models.test_matmul_kernels import ISAS, ROWS, assert_matches_definition, coded, kernels, wide  # noqa: F401 (fixture)

T = GGMLQuantizationType
pytestmark = pytest.mark.skipif(kernels is None or kernels.best_isa() == 0, reason="matrix kernels unavailable here")
# bits, group, zeros, fp16 values, factored: the GGUF formats (Q5_0, Q5_1, Q6_K, Q8_0, Q5_K, Q4_K)
# and the rest
FORMATS = [(5, 32, False, True, False), (5, 32, True, True, False), (6, 16, False, True, True),
           (8, 32, False, True, False), (5, 32, True, True, True), (4, 32, True, True, True),
           (6, 16, False, False, False), (6, 32, True, True, False), (8, 16, False, False, False),
           (5, 16, True, False, False), (4, 16, False, False, False), (6, 16, True, False, True)]


def format_id(form):
    bits, group, zero, half, factored = form
    return f"int{bits}g{group}{'z' if zero else ''}{'h' if half else ''}{'k' if factored else ''}"


def random_grouped(n, k, bits, group, zero, half, factored, seed=0, backend=None, bias=True):
    generator = torch.Generator().manual_seed(seed)
    codes = torch.randint(1 if bits == 8 else 0, 2**bits, (n, k), generator=generator)
    scales = _values(n, k, group, half, factored, generator, 0.01)
    zeros = _values(n, k, group, half, factored, generator, 0.02) if zero else None
    bias = torch.randn(n, generator=generator) * 0.1 if bias else None
    return GroupedLinear(codes, scales, zeros, bits, group, 0 if zero else 2 ** (bits - 1), bias, backend)


def _values(n, k, group, half, factored, generator, size):
    """Per-group values, plain or factored (an int8 per group under a float per 256 features)."""
    if not factored:
        values = torch.randn(n, k // group, generator=generator) * size
        return values.half().float() if half else values
    top = torch.randn(n, k // 256, generator=generator) * size / 64
    return Factored(top.half().float() if half else top, torch.randint(-128, 128, (n, k // group), generator=generator))


def gguf_raw(qtype, rows=48, cols=512, seed=0):
    if qtype in (T.Q4_K, T.Q5_K, T.Q6_K):
        return k_quant_blocks(qtype, rows, cols, seed)
    weight = np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32) * 0.1
    return quantize(weight, qtype)


@pytest.mark.parametrize("type_name", GROUPED_TYPES)
def test_gguf_blocks_become_codes_that_dequantize_exactly(type_name):
    qtype = T[type_name]
    raw = gguf_raw(qtype)
    codes = group_codes(raw, type_name)
    assert np.array_equal(codes.dequantize(), dequantize(raw, qtype).astype(np.float32))  # bit for bit
    assert codes.codes.dtype == np.uint8 and codes.codes.max() < 2**codes.bits
    assert (codes.factors is not None) == type_name.endswith("_K")
    for name, (top, sub) in (codes.factors or {}).items():  # the K-quants' two levels give the values exactly
        assert sub.dtype == np.int8 and top.shape[1] * 256 == raw.shape[1] // {"Q4_K": 144, "Q5_K": 176, "Q6_K": 210}[type_name] * 256
        assert np.array_equal(np.repeat(top, 256 // codes.group, axis=1) * sub.astype(np.float32), getattr(codes, name))


def test_a_q8_0_block_holding_minus_128_is_left_to_the_int8_path():
    raw = gguf_raw(T.Q8_0).reshape(48, -1, 34).copy()
    raw[3, 2, 7] = 0x80  # q = −128
    assert group_codes(raw.reshape(48, -1), "Q8_0") is None


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("form", FORMATS, ids=format_id)
def test_grouped_matches_its_definition(isa, rows, form, wide):
    n, k = 40, 512 if form[4] else 160  # N not a multiple of 16: the last tile is padded
    linear = coded(random_grouped(n, k, *form, seed=rows, backend=isa), wide)
    assert linear.half == form[3] and linear.factored == form[4]
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows)) * 2
    assert_matches_definition(linear(x), x, linear.dequantize(), linear.bias, wide)


@pytest.mark.parametrize("form", FORMATS[:6], ids=format_id)
def test_rows_do_not_depend_on_the_batch_and_both_isas_agree_bit_for_bit(form, wide):
    k = 512 if form[4] else 96
    x = torch.randn(64, k, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    reference = coded(random_grouped(48, k, *form, backend="avx2"), wide)
    expected = torch.cat([reference(x[r : r + 1]) for r in range(64)])
    for isa in ISAS:
        linear = coded(random_grouped(48, k, *form, backend=isa), wide)
        for rows in (5, 16, 33, 64):
            assert torch.equal(linear(x[:rows]), expected[:rows]), (isa, rows)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("form", [f for f in FORMATS if f[4]], ids=format_id)
def test_factored_values_compute_exactly_what_their_products_do(isa, form):
    """s = fl(top·sub) is what the kernel folds: the same weight with its values multiplied out
    (plain fp32) gives the same result bit for bit."""
    factored = random_grouped(40, 768, *form, seed=7, backend=isa)
    scales, zeros = factored.values()
    plain = GroupedLinear(factored.codes(), scales, zeros, factored.bits, factored.group, factored.offset,
                          factored.bias, backend=isa)
    assert not plain.factored and plain.packed.numel() > factored.packed.numel()
    x = torch.randn(9, 768, generator=torch.Generator().manual_seed(8))
    assert torch.equal(factored(x), plain(x))


@pytest.mark.parametrize("form", FORMATS, ids=format_id)
def test_layout_round_trips(form):
    bits, group, zero, half, factored = form
    k = 512 if factored else 96
    linear = random_grouped(40, k, *form, seed=3, backend=ISAS[-1])  # the kernels' layout
    codes = linear.codes()
    assert torch.equal(unpack_grouped(pack_grouped(codes, linear.scales, linear.zeros, bits, group), 40, k, bits, group,
                                      half, zero, factored), codes)
    saved = linear.state()
    again = GroupedLinear(saved["codes"], GroupedLinear.restore_values(saved, "scales"),
                          GroupedLinear.restore_values(saved, "zeros"), bits, group, linear.offset, saved["bias"])
    assert again.factored == factored and torch.equal(again.dequantize(), linear.dequantize())
    code_bytes = {4: 0.5, 5: 0.625, 6: 0.75, 8: 1.0}[bits] * 48 * k  # 40 rows padded to 48
    if factored:  # an int8 per group, a float per 256 features
        values = (48 * k // group + 48 * k // 256 * (2 if half else 4)) * (2 if zero else 1)
    else:
        values = (48 * k // group) * (2 if half else 4) * (2 if zero else 1)
    assert linear.packed.numel() == code_bytes + values


def test_torch_backend_runs_the_dequantized_weight():
    linear = random_grouped(32, 64, 6, 16, False, False, False, backend="torch")
    x = torch.randn(3, 64)
    expected = x.bfloat16().float() @ linear.dequantize().bfloat16().float().t() + linear.bias.bfloat16().float()
    torch.testing.assert_close(linear(x).float(), expected, rtol=2e-2, atol=2e-2)


def test_bad_grouped_formats_are_refused_by_name():
    codes = torch.zeros(16, 64, dtype=torch.uint8) + 1
    scales = torch.ones(16, 2)
    with pytest.raises(ValueError, match="bits must be 4, 5, 6 or 8"):
        GroupedLinear(codes, scales, None, 3, 32, 4)
    with pytest.raises(ValueError, match="group 16 or 32"):
        GroupedLinear(codes, scales, None, 5, 64, 16)
    with pytest.raises(ValueError, match="8-bit codes must be symmetric"):
        GroupedLinear(codes, scales, scales, 8, 32, 0)
    with pytest.raises(ValueError, match=r"scales / zeros of shape \(16, 4\)"):
        GroupedLinear(codes, scales, None, 6, 16, 32)
    with pytest.raises(ValueError, match="Factored values need in_features divisible by 256"):
        GroupedLinear(codes, Factored(torch.ones(16, 1), torch.ones(16, 2)), None, 6, 32, 32)
    with pytest.raises(ValueError, match="both be Factored or both plain"):
        GroupedLinear(torch.ones(16, 256), Factored(torch.ones(16, 1), torch.ones(16, 8)), torch.ones(16, 8), 4, 32, 0)
    with pytest.raises(ValueError, match=r"integers in \[-128, 127\]"):
        Factored(torch.ones(16, 1), torch.full((16, 8), 200.0))
    with pytest.raises(RuntimeError, match="bits must be 4, 5, 6 or 8"):
        kernels.grouped_matmul(torch.randn(1, 64), torch.zeros(1, dtype=torch.uint8), 16, 64, None, 1, True, 7, 32,
                               False, False, False, 0)
    with pytest.raises(RuntimeError, match="factored values need in_features divisible by 256"):
        kernels.grouped_matmul(torch.randn(1, 64), torch.zeros(1, dtype=torch.uint8), 16, 64, None, 1, True, 4, 32,
                               True, True, True, 0)
