import pytest
import torch

from metagen.compress.quantize import clip_quantize, fit_grid, quantize_rtn, round_half_up


def test_seed_worked_example():
    # Seed 002, "Standard post-training quantization": clip to [-2, 2], five values.
    original = torch.tensor([[-1.2, -1.1, 0.5], [-100.0, 0.0, 0.2], [1.8, 1.6, 30.0]])
    expected = torch.tensor([[-1.0, -1.0, 1.0], [-2.0, 0.0, 0.0], [2.0, 2.0, 2.0]])
    assert torch.equal(clip_quantize(original, -2.0, 2.0, 5), expected)


def test_round_half_up_differs_from_half_even():
    assert round_half_up(torch.tensor([0.5, 1.5, 2.5, -0.5])).tolist() == [1.0, 2.0, 3.0, 0.0]


def test_clip_quantize_refuses_bad_range():
    with pytest.raises(ValueError, match="levels"):
        clip_quantize(torch.zeros(3), 1.0, 1.0, 5)


@pytest.mark.parametrize("bits", [3, 4])
def test_grid_values_lie_on_the_int4_layout(bits):
    weight = torch.randn(16, 64, generator=torch.Generator().manual_seed(0))
    grid = fit_grid(weight, bits, 32)
    codes = grid.codes(weight)
    assert codes.min() >= 0 and codes.max() <= 2**bits - 1 and torch.equal(codes, codes.round())
    # scale and zero are bf16 numbers, as the int4 kernel stores them
    assert torch.equal(grid.scale, grid.scale.bfloat16().float()) and torch.equal(grid.zero, grid.zero.bfloat16().float())
    assert torch.allclose(grid.dequantize(codes), (codes - 8) * grid.scale.repeat_interleave(32, 1)
                          + grid.zero.repeat_interleave(32, 1))


def test_rtn_error_is_within_half_a_step():
    weight = torch.randn(8, 64, generator=torch.Generator().manual_seed(1))
    quantized, grid = quantize_rtn(weight, 4, 32)
    step = grid.scale.repeat_interleave(32, 1)
    assert ((quantized - weight).abs() <= step / 2 * 1.01 + 1e-6).all()


def test_clipping_lowers_the_error_of_heavy_tails():
    torch.manual_seed(2)
    weight = torch.distributions.StudentT(3.0).sample((32, 128))  # heavy tails, like LLM weights
    for bits, gain in ((3, 0.8), (4, 0.92)):  # measured: 0.75 and 0.89
        rtn = (quantize_rtn(weight, bits, 128)[0] - weight).square().sum()
        clipped = (quantize_rtn(weight, bits, 128, clip=True)[0] - weight).square().sum()
        assert clipped < gain * rtn
        # α = 1 is a candidate, so clipping never does worse in any group
        per_rtn = (quantize_rtn(weight, bits, 128)[0] - weight).square().sum(1)
        per_clip = (quantize_rtn(weight, bits, 128, clip=True)[0] - weight).square().sum(1)
        assert (per_clip <= per_rtn + 1e-5).all()


def test_int8_is_symmetric_per_channel():
    weight = torch.randn(4, 64, generator=torch.Generator().manual_seed(3))
    grid = fit_grid(weight, 8, 64, clip=False)
    codes = grid.codes(weight) - 127
    assert codes.abs().max() == 127 and torch.equal(grid.zero, torch.zeros(4, 1))
    with pytest.raises(ValueError, match="group_size=32 is not supported with bits=8"):
        fit_grid(weight, 8, 32)


def test_bad_bits_and_groups_are_refused():
    with pytest.raises(ValueError, match="bits=5"):
        fit_grid(torch.zeros(2, 32), 5, 32)
    with pytest.raises(ValueError, match="group_size=24"):
        fit_grid(torch.zeros(2, 32), 4, 24)


def test_importing_compress_is_light():
    import subprocess
    import sys

    code = ("import sys, metagen.compress; heavy = [m for m in sys.modules if m.startswith('metagen.models') "
            "or m in ('transformers', 'scipy', 'safetensors')]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
