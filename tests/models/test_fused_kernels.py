"""The fused decode kernels against their pure-PyTorch definitions, and the model's fused
decode path against its general path."""

import pytest
import torch
import torch.nn.functional as F

from metagen.models.kernels import fused_kernels
from metagen.models.layer import apply_rope

kernels = fused_kernels()
pytestmark = pytest.mark.skipif(kernels is None, reason="fused kernels could not be built here")


@pytest.mark.parametrize("bf16", [False, True])
@pytest.mark.parametrize("with_delta", [False, True])
def test_add_rms_norm(bf16, with_delta):
    torch.manual_seed(0)
    x = torch.randn(5, 576)
    delta = torch.randn(5, 576).to(torch.bfloat16 if bf16 else torch.float32)
    weight = torch.rand(576) + 0.5
    expected_x = x + delta.float() if with_delta else x.clone()
    expected = F.rms_norm(expected_x, (576,), weight, 1e-5)
    out = kernels.add_rms_norm(x, delta if with_delta else None, weight, 1e-5, bf16)
    torch.testing.assert_close(x, expected_x)  # residual updated in place
    assert out.dtype == (torch.bfloat16 if bf16 else torch.float32)
    torch.testing.assert_close(out.float(), expected, atol=1e-2 if bf16 else 1e-5, rtol=1e-2 if bf16 else 1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_store(dtype):
    torch.manual_seed(1)
    heads, kv_heads, dim, n = 9, 3, 64, 4
    qkv = torch.randn(n, (heads + 2 * kv_heads) * dim).to(dtype)
    angles = torch.rand(100, dim // 2) * 6
    rotation = torch.polar(torch.ones_like(angles), angles)
    positions = torch.tensor([0, 7, 42, 99])
    slots = torch.tensor([5, 1, 9, 2])
    pool = torch.zeros(12, 2, kv_heads, dim)
    q = kernels.rope_store(qkv, rotation.real.contiguous(), rotation.imag.contiguous(), positions, slots, pool, heads, kv_heads)
    qk = apply_rope(qkv.float()[:, None, : (heads + kv_heads) * dim].unflatten(-1, (heads + kv_heads, dim)),
                    rotation[positions][:, None, None])[:, 0]
    torch.testing.assert_close(q, qk[:, :heads], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(pool[slots, 0], qk[:, heads:], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(pool[slots, 1], qkv.float()[:, (heads + kv_heads) * dim :].view(n, kv_heads, dim))
    untouched = torch.ones(12, dtype=torch.bool)
    untouched[slots] = False
    assert not pool[untouched].any()


@pytest.mark.parametrize("bf16", [False, True])
def test_paged_decode_attention_matches_sdpa_on_ragged_rows(bf16):
    torch.manual_seed(2)
    heads, kv_heads, dim = 9, 3, 64
    pool = torch.randn(200, 2, kv_heads, dim)
    lengths = torch.tensor([1, 37, 120])
    table = torch.stack([torch.randperm(200)[:120] for _ in range(3)])
    q = torch.randn(3, heads, dim)
    out = kernels.paged_decode_attention(q, pool, table, lengths, dim**-0.5, bf16)
    for b, length in enumerate(lengths.tolist()):
        kv = pool[table[b, :length]]  # (T, 2, KVH, D)
        expected = F.scaled_dot_product_attention(
            q[b : b + 1, :, None], kv[None, :, 0].transpose(1, 2), kv[None, :, 1].transpose(1, 2), enable_gqa=True
        ).reshape(-1)
        torch.testing.assert_close(out[b].float(), expected, atol=1e-2 if bf16 else 1e-5, rtol=1e-2 if bf16 else 1e-5)


def test_paged_decode_attention_with_starts_reads_only_the_window():
    """Row b attends to table[b, starts[b]:lengths[b]] (a sliding window); a scale other than
    head_dim^(-1/2) is honoured (Gemma 3's query_pre_attn_scalar)."""
    torch.manual_seed(3)
    heads, kv_heads, dim = 4, 2, 32
    pool = torch.randn(150, 2, kv_heads, dim)
    lengths = torch.tensor([5, 60, 100])
    starts = torch.tensor([0, 57, 40])
    table = torch.stack([torch.randperm(150)[:100] for _ in range(3)])
    q = torch.randn(3, heads, dim)
    out = kernels.paged_decode_attention(q, pool, table, lengths, 0.3, False, starts)
    full = kernels.paged_decode_attention(q, pool, table, lengths, 0.3, False)
    for b in range(3):
        kv = pool[table[b, starts[b] : lengths[b]]]
        expected = F.scaled_dot_product_attention(
            q[b : b + 1, :, None], kv[None, :, 0].transpose(1, 2), kv[None, :, 1].transpose(1, 2), enable_gqa=True,
            scale=0.3).reshape(-1)
        torch.testing.assert_close(out[b], expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out[0], full[0])  # start 0 is the whole row
    assert (out[1:] - full[1:]).abs().max() > 1e-2  # the window changes the other rows


@pytest.mark.slow
@pytest.mark.parametrize("rows, max_keys", [(3, None), (8, None), (8, 0)])  # in place; in place; SDPA
@pytest.mark.parametrize("dtype", ["fp32", "int4"])
def test_model_fused_decode_equals_general_path(dtype, rows, max_keys, model_fp32, monkeypatch):
    import metagen.models.decoder as llama
    from metagen.models import load

    if max_keys is not None:
        monkeypatch.setattr(llama, "FUSED_ATTENTION_MAX_KEYS", max_keys)
    model = model_fp32 if dtype == "fp32" else load(dtype=dtype)
    base = [1, 504, 3458, 282, 4649, 314, 7306, 30, 378, 22] * 40
    length = 10 if rows <= 4 else 300  # 8 rows × ~300 keys
    prompts = [base[: length - 3 * (row % 3)] for row in range(rows)]  # rows of different lengths
    results = {}
    for fused in (True, False):
        model.use_fused = fused
        try:
            cache = model.new_cache(rows)
            model.forward(cache, prompts)
            steps = [model.forward(cache, [[11 + row] for row in range(rows)], hidden=True)]
            steps.append(model.forward(cache, [[3 + row] for row in range(rows)], hidden=True))
        finally:
            model.use_fused = True
        results[fused] = steps
    for fused_out, plain_out in zip(results[True], results[False]):
        if dtype == "fp32":
            torch.testing.assert_close(fused_out.logits, plain_out.logits, atol=2e-4, rtol=0)
            torch.testing.assert_close(fused_out.hidden, plain_out.hidden, atol=2e-4, rtol=0)
        else:
            # bf16 matmul inputs: the general path rounds SiLU(gate) and its product with up to
            # bf16 separately, the fused kernel once, so logits differ by bf16 rounding (~0.3).
            p = torch.log_softmax(plain_out.logits, -1)
            q = torch.log_softmax(fused_out.logits, -1)
            kl = (p.exp() * (p - q)).sum(-1)
            assert kl.max().item() < 1e-2, kl
            assert torch.equal(fused_out.logits.argmax(-1), plain_out.logits.argmax(-1))


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["all", "last"])
def test_fused_multi_token_appends_equal_general_path(mode, model_fp32):
    """Ragged appends of a few tokens per row (speculative verification) through the fused
    kernels equal the general path: logits at every new position, padding left at zero."""
    model = model_fp32
    base = [1, 504, 3458, 282, 4649, 314, 7306, 30, 378, 22] * 8
    prompts = [base[:80], base[:37], base[:61]]
    appends = [[11, 12, 13, 14, 15], [16], [17, 18, 19]]
    results = {}
    for fused in (True, False):
        model.use_fused = fused
        try:
            cache = model.new_cache(3)
            model.forward(cache, prompts, logits="none")
            results[fused] = model.forward(cache, appends, logits=mode, hidden=True)
            assert cache.lengths == [85, 38, 64]
        finally:
            model.use_fused = True
    fused_out, plain_out = results[True], results[False]
    if mode == "all":
        valid = torch.tensor([[t < len(a) for t in range(5)] for a in appends])
        torch.testing.assert_close(fused_out.logits[valid], plain_out.logits[valid], atol=2e-4, rtol=0)
        torch.testing.assert_close(fused_out.hidden[valid], plain_out.hidden[valid], atol=2e-4, rtol=0)
        assert not fused_out.logits[~valid].any()
    else:
        torch.testing.assert_close(fused_out.logits, plain_out.logits, atol=2e-4, rtol=0)
        torch.testing.assert_close(fused_out.hidden, plain_out.hidden, atol=2e-4, rtol=0)
    assert fused_out.num_new == [5, 1, 3]


def _compact(pool, kv_dtype):
    """A float32 pool (S, 2, KVH, D) in a compact format: (pool, scales or None, the float32
    values it stands for)."""
    from metagen.models.cache import dequantize_int8, quantize_int8

    if kv_dtype == "bf16":
        compact = pool.to(torch.bfloat16)
        return compact, None, compact.float()
    codes, scales = quantize_int8(pool)
    return codes, scales, dequantize_int8(codes, scales)


@pytest.mark.parametrize("kv_dtype", ["bf16", "int8"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_store_rounds_keys_and_values_into_a_compact_pool(kv_dtype, dtype):
    """The stored elements are exactly the float32 kernel's keys and values rounded to the pool's
    format: bf16 to nearest even, int8 by `quantize_int8` (same codes and scales); q is unchanged."""
    torch.manual_seed(4)
    heads, kv_heads, dim, n = 9, 3, 64, 5
    qkv = (torch.randn(n, (heads + 2 * kv_heads) * dim) * 3).to(dtype)
    qkv[2, (heads + kv_heads) * dim : (heads + kv_heads + 1) * dim] = 0  # an all-zero value head: scale 0
    angles = torch.rand(100, dim // 2) * 6
    cos, sin = torch.cos(angles), torch.sin(angles)
    positions, slots = torch.tensor([0, 7, 42, 99, 3]), torch.tensor([5, 1, 9, 2, 11])
    reference = torch.zeros(12, 2, kv_heads, dim)
    q_reference = kernels.rope_store(qkv, cos, sin, positions, slots, reference, heads, kv_heads)
    expected_pool, expected_scales, _ = _compact(reference, kv_dtype)
    pool = torch.zeros_like(expected_pool)
    scales = None if expected_scales is None else torch.full_like(expected_scales, -1.0)
    q = kernels.rope_store(qkv, cos, sin, positions, slots, pool, heads, kv_heads, scales)
    assert torch.equal(q, q_reference)
    assert torch.equal(pool[slots], expected_pool[slots])
    untouched = torch.ones(12, dtype=torch.bool)
    untouched[slots] = False
    assert not pool[untouched].any()
    if scales is not None:
        assert torch.equal(scales[slots], expected_scales[slots])
        assert scales[9, 1, 0] == 0 and not pool[9, 1, 0].any()  # token 2 is stored in slot 9
        assert (scales[untouched] == -1).all()
        error = (reference[slots] - pool[slots].float() * scales[slots, ..., None]).abs()
        assert (error <= scales[slots, ..., None] / 2 + 1e-6).all()  # round to nearest: half a step at most


@pytest.mark.parametrize("kv_dtype", ["bf16", "int8"])
@pytest.mark.parametrize("starts, dim", [(False, 64), (True, 64), (False, 20)])  # 20: the widening's scalar tail
def test_paged_decode_attention_over_a_compact_pool_is_attention_over_its_dequantized_values(kv_dtype, starts, dim):
    torch.manual_seed(5)
    heads, kv_heads = 9, 3
    pool, scales, values = _compact(torch.randn(200, 2, kv_heads, dim) * 2, kv_dtype)
    lengths = torch.tensor([1, 37, 120, 90])
    first = torch.tensor([0, 5, 100, 0]) if starts else None
    table = torch.stack([torch.randperm(200)[:120] for _ in range(4)])
    q = torch.randn(4, heads, dim)
    out = kernels.paged_decode_attention(q, pool, table, lengths, 0.125, False, first, scales)
    for b, length in enumerate(lengths.tolist()):
        kv = values[table[b, (0 if first is None else first[b]) : length]]  # (T, 2, KVH, D) float32
        expected = F.scaled_dot_product_attention(
            q[b : b + 1, :, None], kv[None, :, 0].transpose(1, 2), kv[None, :, 1].transpose(1, 2), enable_gqa=True,
            scale=0.125).reshape(-1)
        torch.testing.assert_close(out[b], expected, atol=1e-5, rtol=1e-5)
    plain = kernels.paged_decode_attention(q, pool.float() if scales is None else pool.float() * scales[..., None],
                                           table, lengths, 0.125, False, first)
    torch.testing.assert_close(out, plain, atol=1e-5, rtol=1e-5)  # same as the float32 kernel on the values


def test_compact_pools_are_checked():
    q, table, lengths = torch.randn(1, 2, 8), torch.zeros(1, 1, dtype=torch.long), torch.tensor([1])
    codes, scales = torch.zeros(4, 2, 1, 8, dtype=torch.int8), torch.ones(4, 2, 1)
    with pytest.raises(RuntimeError, match="an int8 pool needs its scales"):
        kernels.paged_decode_attention(q, codes, table, lengths, 1.0, False)
    with pytest.raises(RuntimeError, match="an int8 pool needs its scales"):
        kernels.paged_decode_attention(q, codes, table, lengths, 1.0, False, None, torch.ones(3, 2, 1))
    with pytest.raises(RuntimeError, match="scales are for int8 pools only"):
        kernels.paged_decode_attention(q, codes.float(), table, lengths, 1.0, False, None, scales)
    with pytest.raises(RuntimeError, match="pool: float32, bfloat16 or int8"):
        kernels.paged_decode_attention(q, codes.half(), table, lengths, 1.0, False)
