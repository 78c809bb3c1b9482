"""Compact KV caches (`kv_dtype` "bf16" and "int8"): what is stored, the cache operations on
each format, the bytes per token, and the embedded model decoding with them."""

import numpy as np
import pytest
import torch

from metagen.models.cache import KV_DTYPES, KVCache, check_kv_dtype, dequantize_int8, quantize_int8, token_bytes

FORMATS = list(KV_DTYPES)


def rounded(values: torch.Tensor, kv_dtype: str) -> torch.Tensor:
    """What a cache of `kv_dtype` gives back for float32 `values (..., D)`."""
    if kv_dtype == "bf16":
        return values.to(torch.bfloat16).float()
    if kv_dtype == "int8":
        return dequantize_int8(*quantize_int8(values))
    return values


def make_cache(kv_dtype, layers=2, heads=3, dim=8, capacity=4, batch=1):
    cache = KVCache(layers, heads, dim, KV_DTYPES[kv_dtype], 100, capacity=capacity)
    cache.reset(batch)
    return cache


def append(cache, counts, generator):
    """Append `counts[b]` random tokens to each row; returns {slot: (layers, 2, KVH, D) written}."""
    slots, _, _ = cache.allocate(np.array(counts))
    written = torch.randn(cache.num_layers, len(slots), 2, cache.num_kv_heads, cache.head_dim, generator=generator) * 3
    for layer in range(cache.num_layers):
        cache.write(layer, slots, written[layer])
    return {int(slot): written[:, i] for i, slot in enumerate(slots)}


def row_values(cache, row):
    """The row's keys and values as read back: (layers, T, 2, KVH, D) float32."""
    table = torch.from_numpy(cache.slots(row))[None]
    return torch.stack([cache.read(layer, table)[0] for layer in range(cache.num_layers)])


def expected_values(cache, row, written):
    return torch.stack([rounded(written[int(slot)], cache.kv_dtype) for slot in cache.slots(row)], dim=1)


def test_quantize_int8_by_hand():
    """max|x| = 2.54 -> s = 0.02; codes round(x / s), half to even; an all-zero head has s = 0."""
    x = torch.tensor([[2.54, -1.27, 0.01, 0.03], [0.0, 0.0, 0.0, 0.0]])
    codes, scales = quantize_int8(x)
    torch.testing.assert_close(scales, torch.tensor([0.02, 0.0]))
    assert codes.tolist() == [[127, -64, 0, 2], [0, 0, 0, 0]]  # -63.5 -> -64, 0.5 -> 0, 1.5 -> 2
    assert codes.dtype == torch.int8
    torch.testing.assert_close(dequantize_int8(codes, scales)[0], torch.tensor([2.54, -1.28, 0.0, 0.04]))


@pytest.mark.parametrize("kv_dtype", FORMATS)
def test_write_then_read_gives_the_values_rounded_to_the_format_across_growth(kv_dtype):
    generator = torch.Generator().manual_seed(0)
    cache = make_cache(kv_dtype, capacity=16)  # 16 slots, then grown twice (scales grow with the pool)
    written = append(cache, [10], generator)
    written.update(append(cache, [30], generator))
    assert len(cache.pools[0]) >= 40
    got, expected = row_values(cache, 0), expected_values(cache, 0, written)
    assert got.dtype == torch.float32 and torch.equal(got, expected)
    original = torch.stack([written[int(slot)] for slot in cache.slots(0)], dim=1)
    error = (got - original).abs()
    if kv_dtype == "fp32":
        assert torch.equal(got, original)
    elif kv_dtype == "bf16":
        assert (error <= original.abs() * 2**-8).all()  # 8 significant bits, round to nearest: u = 2^-8
    else:
        step = original.abs().amax(-1, keepdim=True) / 127
        assert (error <= step / 2 + 1e-6).all() and error.max() > 0


@pytest.mark.parametrize("kv_dtype", FORMATS)
def test_fork_truncate_snapshot_restore_keep_every_rows_values(kv_dtype):
    generator = torch.Generator().manual_seed(1)
    cache = make_cache(kv_dtype)
    written = append(cache, [6], generator)
    cache.fork(0, 2)
    written.update(append(cache, [2, 3, 1], generator))  # grows the pool under shared rows
    cache.truncate(1, 4)  # into the shared prefix
    snapshot = cache.snapshot(2)
    written.update(append(cache, [1, 2, 5], generator))
    before = [row_values(cache, row) for row in range(3)]
    for row in range(3):
        assert torch.equal(before[row], expected_values(cache, row, written))
    cache.restore([snapshot, snapshot])
    assert cache.lengths == [7, 7]
    assert torch.equal(row_values(cache, 0), before[2][:, :7])
    assert torch.equal(row_values(cache, 1), before[2][:, :7])


@pytest.mark.parametrize("kv_dtype", FORMATS)
def test_copy_prefix_copies_elements_and_scales(kv_dtype):
    generator = torch.Generator().manual_seed(2)
    source = make_cache(kv_dtype, layers=3, capacity=16)
    written = append(source, [9], generator)
    target = make_cache(kv_dtype, layers=2, batch=2)
    target.copy_prefix(source, 0, 5, row=1)
    assert target.lengths == [0, 5]
    assert torch.equal(row_values(target, 1), expected_values(source, 0, written)[:2, :5])


def test_copy_prefix_refuses_another_format():
    source = make_cache("int8", capacity=16)
    append(source, [3], torch.Generator().manual_seed(3))
    target = make_cache("fp32")
    with pytest.raises(ValueError, match="source cache has kv_dtype=int8, this cache fp32"):
        target.copy_prefix(source, 0, 2)


def test_bytes_per_token_and_pool_bytes_halve_and_quarter():
    """30 layers, 3 KV heads of 64 (the embedded model): fp32 46,080 bytes per token, bf16 half,
    int8 64 + 4 bytes of scale per head: 26.6%."""
    sizes = {kv: token_bytes(30, 3, 64, kv) for kv in FORMATS}
    assert sizes == {"fp32": 46080, "bf16": 23040, "int8": 12240}
    for kv in FORMATS:
        cache = KVCache(30, 3, 64, KV_DTYPES[kv], 100, capacity=1000)
        assert cache.pool_bytes == 1000 * sizes[kv]  # every allocated slot, scales included


@pytest.mark.parametrize("kv_dtype, expected", [
    ("fp32", 2 * 2 * 2 * 8 * 4),  # layers · (K, V) · KV heads · head_dim 32 / 4 · 4 bytes = 256
    ("bf16", 2 * 2 * 2 * 8 * 2),  # 128
    ("int8", 2 * 2 * 2 * (8 + 4)),  # one byte per value and a float32 scale per head: 96
])
def test_a_models_kv_bytes_per_token_is_what_each_slot_of_its_cache_takes(tiny_checkpoint, kv_dtype, expected):
    """The tiny checkpoint (2 layers, 2 KV heads, head_dim 8): the model's `kv_bytes_per_token`,
    the one count the memory checks use, is exact in every KV format."""
    from metagen.models import load

    model = load(tiny_checkpoint, dtype="fp32", kv_dtype=kv_dtype, use_cache=False)
    assert model.kv_bytes_per_token == expected
    cache = model.new_cache(1, capacity=10)
    assert cache.pool_bytes == len(cache.pools[0]) * expected  # every slot allocated (whole pages), scales included


def test_unknown_formats_are_refused_by_name():
    with pytest.raises(ValueError, match=r"kv_dtype='fp16' is not supported: choose one of fp32, bf16, int8"):
        check_kv_dtype("fp16")
    with pytest.raises(ValueError, match=r"dtype=torch.float16 is not supported"):
        KVCache(1, 1, 4, torch.float16, 10)


def test_load_and_the_cli_offer_the_same_formats(capsys):
    from metagen.cli import build_parser
    from metagen.models import load

    with pytest.raises(ValueError, match=r"kv_dtype='int4' is not supported: choose one of fp32, bf16, int8"):
        load(kv_dtype="int4")
    parser = build_parser()
    option = next(a for a in parser._subparsers._group_actions[0].choices["generate"]._actions
                  if a.dest == "kv_dtype")
    assert list(option.choices) == FORMATS
    with pytest.raises(SystemExit):
        parser.parse_args(["info", "--kv-dtype", "int4"])
    assert "argument --kv-dtype: invalid choice: 'int4'" in capsys.readouterr().err


# ------------------------------------------------------------------------------- the real model
TEXT = ("The lighthouse keeper climbed the spiral stairs every evening at dusk. He trimmed the wick, polished the "
        "great lens and wound the clockwork that turned it, then sat by the window with his logbook, noting the "
        "wind, the state of the sea and every ship that passed. In forty years he had missed a single night, when "
        "a storm tore the door from its hinges and he spent the dark hours holding it shut with his back.")


@pytest.fixture(scope="module")
def models():
    from metagen.models import load

    return {kv: load(dtype="fp32", kv_dtype=kv) for kv in FORMATS}


def teacher_forced(model, prompt, continuation):
    """Logits after the prompt (one prefill: the general path) and after each continuation token
    (decode steps: the fused path), (1 + len(continuation), V)."""
    cache = model.new_cache(1)
    logits = [model.forward(cache, [prompt]).logits[0]]
    logits += [model.forward(cache, [[token]]).logits[0] for token in continuation[:-1]]
    return torch.stack(logits)


@pytest.mark.slow
def test_decoding_with_compact_kv_stays_close_to_fp32_kv(models):
    """88 prompt tokens + 48 greedy tokens (of the fp32-KV model), fp32 weights. Measured: bf16
    KL max 1.1e-4, mean 1.7e-5, top-1 agreement 100%; int8 KL max 3.8e-3, mean 4.5e-4, top-1 98%
    (benchmarks/kv_cache.py measures longer real text)."""
    from metagen.decoding import generate
    from metagen.sampling import SamplingParams

    reference = models["fp32"]
    prompt = reference.tokenizer.encode(TEXT)
    greedy = generate(reference, prompt, SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True), chat=False)
    continuation = list(greedy.completions[0].token_ids)
    assert len(continuation) == 48
    expected = teacher_forced(reference, prompt, continuation)
    assert torch.equal(expected.argmax(-1), torch.tensor(continuation))  # the same decode, step by step
    bounds = {"bf16": (5e-4, 1e-4, 0.97), "int8": (1.5e-2, 1.5e-3, 0.9)}  # max KL, mean KL, top-1 agreement
    kls = {}
    for kv, (max_kl, mean_kl, agreement) in bounds.items():
        logits = teacher_forced(models[kv], prompt, continuation)
        p, q = torch.log_softmax(expected, -1), torch.log_softmax(logits, -1)
        kl = (p.exp() * (p - q)).sum(-1)
        kls[kv] = kl.mean().item()
        assert kl.max() < max_kl and kl.mean() < mean_kl, (kv, kl.max(), kl.mean())
        assert (logits.argmax(-1) == expected.argmax(-1)).float().mean() >= agreement
        generated = generate(models[kv], prompt, SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True),
                             chat=False)
        assert len(generated.completions[0].token_ids) == 8
    assert 0 < kls["bf16"] < kls["int8"]  # the formats really round, int8 more than bf16


def kl_divergence(expected: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """KL(softmax(expected) ‖ softmax(logits)) over the last dimension."""
    p, q = torch.log_softmax(expected, -1), torch.log_softmax(logits, -1)
    return (p.exp() * (p - q)).sum(-1)


@pytest.mark.slow
@pytest.mark.parametrize("kv_dtype", ["bf16", "int8"])
def test_fused_decode_equals_the_general_path_with_compact_kv(kv_dtype, models):
    """Both paths store the same keys and values up to float rounding (RoPE and attention
    computed in another order: ~1e-6 before rounding to the format) and attend over them. A value
    within that of a rounding boundary (half an int8 code, a bf16 tie) is stored one code / one
    bf16 step apart, and one such element moves the logits as much as the whole rounding to the
    format does: on an AVX2 machine one int8 value at x/s = 19.499994 vs 19.500002 (layer 3 of
    30) moved them by 0.30 (KL 2.3e-4), as far as int8 vs fp32 KV (0.29, KL 7e-4). So logits
    are compared by KL, which a flipped element keeps small and a wrong kernel does not: below
    1e-3 at every position with the same top token (int8 vs fp32 KV here reach KL 1e-2; int8
    value scales 2% off in one kv head give 2.0e-3). Measured: bf16 KL 1.9e-6, max 5e-3 to 1e-2
    between runs; int8 KL 2.3e-7, max 2.2e-3 (one code flipped at the last layer); fp32 weights
    and KV agree to 3e-5 (test_fused_kernels)."""
    model = models[kv_dtype]
    prompts = [[1, 504, 3458, 282, 4649, 314, 7306, 30, 378, 22] * 6, [1, 504, 3458, 282, 4649] * 5]
    results = {}
    for fused in (True, False):
        model.use_fused = fused
        try:
            cache = model.new_cache(2)
            model.forward(cache, prompts, logits="none")
            results[fused] = torch.stack([model.forward(cache, [[11 + t], [40 + t]]).logits for t in range(3)])
        finally:
            model.use_fused = True
    kl = kl_divergence(results[False], results[True])
    assert kl.max() < 1e-3, kl
    assert torch.equal(results[True].argmax(-1), results[False].argmax(-1))


@pytest.mark.slow
@pytest.mark.parametrize("kv_dtype", FORMATS)
def test_cache_operations_on_the_model_with_compact_kv(kv_dtype, models):
    """Fork, truncate and snapshot / restore give the logits of a cache that never saw the
    dropped tokens. Each reference computes every token in a batch of the same shape as the cache
    under test (the fork's three new tokens in a step of 3 rows), so the same matrix products
    give the same keys: a step of 1 row (gemv) and one of 3 (gemm) differ by ~1e-6, which rounds
    a value at a tie one int8 code apart and moves the logits by up to 0.3 (measured on AVX2).
    Measured: the fork's logits equal bit for bit in every format."""
    model = models[kv_dtype]
    atol = 1e-4
    prompt = [1, 504, 3458, 282, 4649, 314, 7306, 30, 378, 5248, 282, 2997, 314, 10456, 28, 2045]
    tokens = [[11], [812], [45]]

    def three_rows():
        """A cache of 3 rows, each prefilled with the prompt, after the step `tokens`: (cache, logits)."""
        cache = model.new_cache(3)
        model.forward(cache, [prompt] * 3, logits="none")
        return cache, model.forward(cache, tokens).logits

    def after_812(token):
        cache, _ = three_rows()
        cache.select([1])
        return model.forward(cache, [[token]]).logits[0]

    cache = model.new_cache(1)
    model.forward(cache, [prompt], logits="none")
    snapshot = cache.snapshot(0)
    cache.fork(0, 2)
    out = model.forward(cache, tokens)
    torch.testing.assert_close(out.logits, three_rows()[1], atol=atol, rtol=0)
    model.forward(cache, [[7], [8], [9]], logits="none")
    cache.truncate(1, len(prompt) + 1)
    cache.select([1])
    torch.testing.assert_close(model.forward(cache, [[5]]).logits[0], after_812(5), atol=atol, rtol=0)
    cache.restore([snapshot])
    straight = model.new_cache(1)
    model.forward(straight, [prompt], logits="none")
    torch.testing.assert_close(model.forward(cache, [[99]]).logits[0], model.forward(straight, [[99]]).logits[0],
                               atol=atol, rtol=0)
    assert (after_812(6) - after_812(5)).abs().max() > 20 * atol  # another token: the checks above can fail


@pytest.mark.slow
def test_an_early_exit_draft_takes_the_targets_int8_prompt(models):
    """The drafter's copy_prefix moves int8 codes and their scales: the draft's first layers hold
    exactly the target's stored keys and values."""
    from metagen.speculative.drafters import ModelDrafter
    from metagen.speculative.self_draft import early_exit_model

    target = models["int8"]
    prompt = [1, 504, 3458, 282, 4649, 314, 7306, 30, 378, 5248]
    target_cache = target.new_cache(1)
    target.forward(target_cache, [prompt], logits="none")
    drafter = ModelDrafter(early_exit_model(target, 6), share_prompt_cache=True)
    drafter.start(prompt, 2, target_cache)
    assert drafter.cache.kv_dtype == "int8" and drafter.cache.lengths == [9, 9]
    table, source = torch.from_numpy(drafter.cache.slots(1)), torch.from_numpy(target_cache.slots(0)[:9])
    for layer in range(6):
        assert torch.equal(drafter.cache.pools[layer][table], target_cache.pools[layer][source])
        assert torch.equal(drafter.cache.scales[layer][table], target_cache.scales[layer][source])


@pytest.mark.slow
def test_the_serve_prefix_cache_budget_counts_compact_bytes(models):
    from metagen.serve.engine import Engine

    budget = 12240 * 1000  # 1000 tokens of int8 KV, 265 of fp32
    tokens = {kv: Engine(models[kv], max_rows=2, cache_memory=budget).prefix_cache.capacity for kv in FORMATS}
    assert tokens == {"fp32": 265, "bf16": 531, "int8": 1000}
