"""A decode step's intermediates in reused buffers: every kernel writes into a caller's `out`
exactly what it returns fresh, refuses a buffer of the wrong shape or dtype by name, and the
model's layer loop allocates nothing once a step of that size has run."""

import threading

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from metagen.models.kernels import fused_kernels, matmul_kernels
from metagen.models.kernel_backend import resolve_backend
from metagen.models.linear import ConcatLinear, DenseLinear, GroupedLinear, Int4Linear, Int8Linear

fused = fused_kernels()
matmul = matmul_kernels()
needs_fused = pytest.mark.skipif(fused is None, reason="fused kernels could not be built here")
needs_matmul = pytest.mark.skipif(matmul is None or matmul.best_isa() == 0, reason="matrix kernels unavailable here")
BACKENDS = ["torch"] + ([] if matmul is None or matmul.best_isa() == 0 else
                        ["avx2"] + (["avx512"] if matmul.best_isa() >= 2 else []))


def _linears(backend: str) -> dict[str, object]:
    torch.manual_seed(0)
    codes = torch.randint(0, 64, (48, 256))
    return {
        "int4": Int4Linear.quantize(torch.randn(48, 64), torch.randn(48), backend=backend),
        "int8": Int8Linear.quantize(torch.randn(40, 64), torch.randn(40), backend=backend),  # torch: K % 32 == 0
        "int6g16": GroupedLinear(codes, torch.rand(48, 16) * 0.01, None, 6, 16, 32, torch.randn(48), backend),
    }


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["int4", "int8", "int6g16"])
@pytest.mark.parametrize("rows", [1, 5])
def test_a_linear_writes_into_out_what_it_returns_fresh_also_into_a_column_slice(backend, kind, rows):
    linear = _linears(backend)[kind]
    x = torch.randn(rows, linear.in_features)
    if not linear.takes_float:
        x = x.to(torch.bfloat16)
    expected = linear(x)
    out = torch.empty(rows, linear.out_features, dtype=expected.dtype)
    assert linear(x, out) is out
    assert torch.equal(out, expected)
    wide = torch.full((rows, linear.out_features + 24), 7.0, dtype=expected.dtype)
    linear(x, wide[:, 8 : 8 + linear.out_features])  # rows 32 elements apart
    assert torch.equal(wide[:, 8 : 8 + linear.out_features], expected)
    assert (wide[:, :8] == 7).all() and (wide[:, 8 + linear.out_features :] == 7).all()


def test_a_concatenation_writes_each_part_into_its_columns():
    torch.manual_seed(1)
    parts = [Int4Linear.quantize(torch.randn(32, 64)), DenseLinear(torch.randn(16, 64), torch.randn(16)),
             Int4Linear.quantize(torch.randn(48, 64))]
    linear = ConcatLinear(parts)
    x = torch.randn(3, 64)
    if not linear.takes_float:
        x = x.to(torch.bfloat16)
        linear = ConcatLinear([parts[0], DenseLinear(parts[1].weight.bfloat16(), parts[1].bias.bfloat16()), parts[2]])
    expected = linear(x)
    out = torch.empty(3, 96, dtype=expected.dtype)
    assert linear(x, out) is out
    assert torch.equal(out, expected)


@needs_matmul
def test_a_wrong_out_buffer_is_refused_by_name():
    linear = Int4Linear.quantize(torch.randn(32, 64), backend=BACKENDS[-1])
    x = torch.randn(2, 64)
    with pytest.raises(RuntimeError, match=r"out: must be \(rows, out_features\) = \(2, 32\)"):
        linear(x, torch.empty(3, 32))
    with pytest.raises(RuntimeError, match="out: must be Float"):
        linear(x, torch.empty(2, 32, dtype=torch.bfloat16))
    with pytest.raises(RuntimeError, match="unit stride along out_features"):
        linear(x, torch.empty(32, 2).t())


@needs_fused
def test_fused_kernels_write_into_out_what_they_return_fresh():
    torch.manual_seed(2)
    heads, kv_heads, dim, n = 6, 2, 64, 3
    residual = torch.randn(n, 128)
    delta, weight = torch.randn(n, 128), torch.rand(128) + 0.5
    again = residual.clone()
    expected = fused.add_rms_norm(residual, delta, weight, 1e-5, False)
    out = torch.empty(n, 128)
    assert fused.add_rms_norm(again, delta, weight, 1e-5, False, out) is out
    assert torch.equal(out, expected) and torch.equal(again, residual)

    qkv = torch.randn(n, (heads + 2 * kv_heads) * dim)
    angles = torch.rand(50, dim // 2)
    cos, sin = angles.cos().contiguous(), angles.sin().contiguous()
    positions, slots = torch.tensor([3, 10, 40]), torch.tensor([0, 1, 2])
    pool = torch.randn(64, 2, kv_heads, dim)
    q = fused.rope_store(qkv, cos, sin, positions, slots, pool, heads, kv_heads)
    out = torch.empty(n, heads, dim)
    assert fused.rope_store(qkv, cos, sin, positions, slots, pool, heads, kv_heads, None, out) is out
    assert torch.equal(out, q)

    table = torch.stack([torch.randperm(64)[:40] for _ in range(n)])
    lengths, starts = torch.tensor([40, 17, 5]), torch.tensor([0, 3, 1])
    for bf16 in (False, True):
        expected = fused.paged_decode_attention(q, pool, table, lengths, 0.125, bf16)
        out = torch.empty(n, heads * dim, dtype=expected.dtype)
        assert fused.paged_decode_attention(q, pool, table, lengths, 0.125, bf16, None, None, out) is out
        assert torch.equal(out, expected)
    part_out, part_lse = fused.paged_attention_part(q, pool, table, lengths, starts, 0.125, None)
    buffers = torch.empty(n, heads, dim), torch.empty(n, heads)
    got = fused.paged_attention_part(q, pool, table, lengths, starts, 0.125, None, *buffers)
    assert got[0] is buffers[0] and got[1] is buffers[1]
    assert torch.equal(got[0], part_out) and torch.equal(got[1], part_lse)
    prefix = (table[0, :12], torch.tensor([0, 12]), torch.tensor([0, 2]), torch.tensor([0, 2]))
    expected = fused.shared_prefix_attention(q, pool, *prefix, 0.125, None)
    stale = torch.full((n, heads, dim), 3.0), torch.full((n, heads), 3.0)  # query 1 is in no group: reset
    got = fused.shared_prefix_attention(q, pool, *prefix, 0.125, None, *stale)
    assert got[0] is stale[0] and torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
    for bf16 in (False, True):
        combined = fused.combine_attention_parts(*expected, part_out, part_lse, bf16)
        out = torch.empty(n, heads * dim, dtype=combined.dtype)
        assert fused.combine_attention_parts(*expected, part_out, part_lse, bf16, out) is out
        assert torch.equal(out, combined)
    with pytest.raises(RuntimeError, match=r"out: must be a contiguous Float tensor of shape \[3, 384\]"):
        fused.paged_decode_attention(q, pool, table, lengths, 0.125, False, None, None, torch.empty(3, 383))
    with pytest.raises(RuntimeError, match=r"lse: must be a contiguous Float tensor of shape \[3, 6\]"):
        fused.paged_attention_part(q, pool, table, lengths, starts, 0.125, None, buffers[0], torch.empty(6, 3).t())


def _allocations_per_step(model, rows: int, tokens: int) -> int:
    """Tensors allocated by one steady-state decode step of `rows` rows × `tokens` new tokens."""
    cache = model.new_cache(1, capacity=256)
    model.forward(cache, [list(range(10, 50))])
    cache.select([0] * rows)
    new = torch.full((rows, tokens), 42, dtype=torch.long)
    for _ in range(2):  # the first step of this size makes its buffers
        model.forward(cache, new, logits="all" if tokens > 1 else "last")
    with profile(activities=[ProfilerActivity.CPU]) as trace:
        model.forward(cache, new, logits="all" if tokens > 1 else "last")
    return sum(event.count for event in trace.key_averages() if event.key in ("aten::empty", "aten::empty_strided"))


@needs_fused
@pytest.mark.parametrize("rows, tokens", [(1, 1), (4, 1), (1, 5)])
def test_the_decode_layer_loop_allocates_nothing(model, rows, tokens):
    """A step's allocations do not grow with the number of layers: the 30-layer model allocates
    what its first 10 layers do (the step's fixed handful: ids, cache bookkeeping, the residual
    stream, the logits)."""
    if resolve_backend() == "torch":
        pytest.skip("METAGEN_KERNELS=torch: torch's int4 / int8 kernels have no out= form, their results are "
                    "copied into the buffers")
    deep = _allocations_per_step(model, rows, tokens)
    shallow = _allocations_per_step(model.truncated(10), rows, tokens)
    assert deep == shallow, (deep, shallow)
    assert deep < 40


@needs_fused
def test_two_threads_decoding_on_one_model_do_not_share_buffers(model):
    """Each thread has its own buffers: two threads stepping the same model at once get what one
    thread alone gets."""
    prompts = [[list(range(20, 60))], [list(range(300, 330))]]

    def run(prompt, results, index):
        cache = model.new_cache(1, capacity=128)
        logits = [model.forward(cache, prompt).logits]
        for _ in range(12):
            logits.append(model.forward(cache, [[int(logits[-1].argmax())]]).logits)
        results[index] = torch.stack(logits)

    alone = [None, None]
    for index, prompt in enumerate(prompts):
        run(prompt, alone, index)
    together = [None, None]
    threads = [threading.Thread(target=run, args=(prompt, together, index)) for index, prompt in enumerate(prompts)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for a, b in zip(alone, together):
        assert torch.equal(a, b)


@needs_fused
def test_a_decode_step_resolves_its_buffers_once_not_per_layer(model, monkeypatch):
    """Regression: every layer looked each buffer up by name (`StepBuffers.get`: a dict lookup and
    a shape and dtype comparison per linear per layer). A step of the 30-layer model now asks as
    often as one of its first 10 layers."""
    from metagen.models.step_buffers import StepBuffers

    calls = []
    original = StepBuffers.get
    monkeypatch.setattr(StepBuffers, "get", lambda self, *args: calls.append(args[0]) or original(self, *args))

    def lookups(decoder) -> int:
        cache = decoder.new_cache(1, capacity=64)
        decoder.forward(cache, [list(range(10, 20))])
        calls.clear()
        decoder.forward(cache, [[42]])
        return len(calls)

    assert lookups(model) == lookups(model.truncated(10)) > 0
