"""Shared-prefix (cascade) attention: the grouping read from the page table, each kernel part
against its PyTorch definition, the split against the unsplit kernel (fp32, 1e-5), and the
embedded model sampling forked rows with the split on and off."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from metagen.models.kernels import fused_kernels
from metagen.models.shared_prefix import (
    OWN_PREFIX_MIN_QUERY_KEYS,
    SHARED_PREFIX_MIN_KEYS,
    SHARED_PREFIX_MIN_QUERY_KEYS,
    SharedPrefixPlan,
    find_shared_prefixes,
    shared_prefix_default,
)

kernels = fused_kernels()
needs_kernels = pytest.mark.skipif(kernels is None, reason="fused kernels could not be built here")


# ------------------------------------------------------------------ grouping
def test_find_shared_prefixes_groups_rows_by_their_longest_common_slot_run():
    common = np.arange(100, 180)  # 80 slots
    table = np.zeros((6, 120), dtype=np.int64)
    table[0, :90] = np.r_[common, 1000 + np.arange(10)]
    table[1, :85] = np.r_[common, 2000 + np.arange(5)]
    table[2, :100] = np.r_[common[:70], 3000 + np.arange(30)]  # leaves the prompt after 70
    table[3, :95] = 4000 + np.arange(95)  # alone
    table[4, :120] = np.r_[5000 + np.arange(66), 6000 + np.arange(54)]
    table[5, :66] = 5000 + np.arange(66)  # shares all of its 66 tokens with row 4
    lengths = np.array([90, 85, 100, 95, 120, 66])
    groups = {tuple(rows.tolist()): prefix for rows, prefix in find_shared_prefixes(table, lengths, 64)}
    assert groups == {(0, 1, 2): 70, (4, 5): 66}
    # shorter than min_keys: no split; a row too short to reach min_keys is left out
    assert {tuple(r.tolist()): p for r, p in find_shared_prefixes(table, lengths, 67)} == {(0, 1, 2): 70}
    assert find_shared_prefixes(table, lengths, 71) == []
    assert find_shared_prefixes(table[:1], lengths[:1], 1) == []


def test_the_prefix_stops_at_the_shortest_rows_length():
    table = np.tile(np.arange(200), (3, 1))  # identical slots: only the lengths bound the prefix
    rows, prefix = find_shared_prefixes(table, np.array([150, 120, 199]), 64)[0]
    assert rows.tolist() == [0, 1, 2] and prefix == 120


def test_switch_reads_metagen_shared_prefix(monkeypatch):
    monkeypatch.delenv("METAGEN_SHARED_PREFIX", raising=False)
    assert shared_prefix_default() is True
    monkeypatch.setenv("METAGEN_SHARED_PREFIX", "0")
    assert shared_prefix_default() is False
    monkeypatch.setenv("METAGEN_SHARED_PREFIX", "off")
    with pytest.raises(ValueError, match=r"METAGEN_SHARED_PREFIX='off' is not supported: use '1'.*or '0'"):
        shared_prefix_default()


# ------------------------------------------------------------------ kernels
def reference_part(q, pool, slots, scale):
    """softmax attention of q (H, D) to pool[slots] with its log-sum-exp: ((H, D), (H,))."""
    heads, kv_heads = q.shape[0], pool.shape[2]
    keys = pool[slots, 0].repeat_interleave(heads // kv_heads, dim=1).transpose(0, 1)  # (H, T, D)
    values = pool[slots, 1].repeat_interleave(heads // kv_heads, dim=1).transpose(0, 1)
    scores = torch.einsum("hd,htd->ht", q.double(), keys.double()) * scale
    return torch.einsum("ht,htd->hd", scores.softmax(-1), values.double()).float(), scores.logsumexp(-1).float()


@needs_kernels
def test_paged_attention_part_returns_output_and_log_sum_exp_of_its_range():
    torch.manual_seed(0)
    heads, kv_heads, dim = 6, 2, 64
    pool = torch.randn(300, 2, kv_heads, dim)
    table = torch.stack([torch.randperm(300)[:200] for _ in range(3)])
    lengths, starts = torch.tensor([200, 50, 7]), torch.tensor([0, 20, 7])  # the last range is empty
    q = torch.randn(3, heads, dim)
    out, lse = kernels.paged_attention_part(q, pool, table, lengths, starts, 0.2, None)
    for b in range(2):
        expected_out, expected_lse = reference_part(q[b], pool, table[b, starts[b] : lengths[b]], 0.2)
        torch.testing.assert_close(out[b], expected_out, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(lse[b], expected_lse, atol=1e-5, rtol=1e-5)
    assert not out[2].any() and (lse[2] == -torch.inf).all()


@needs_kernels
@pytest.mark.parametrize("heads, kv_heads, dim", [(9, 3, 64), (8, 2, 128), (4, 4, 64)])
def test_shared_prefix_attention_matches_its_definition(heads, kv_heads, dim):
    """Two groups (prefixes of 700 and 65 keys, several key splits and a partial last block),
    queries in no group left at out = 0, lse = −inf."""
    torch.manual_seed(1)
    pool = torch.randn(1000, 2, kv_heads, dim)
    prefixes = [torch.randperm(1000)[:700], torch.randperm(1000)[:65]]
    members = [torch.tensor([4, 0, 2, 5]), torch.tensor([1, 6])]  # query 3 is in no group
    q = torch.randn(7, heads, dim)
    out, lse = kernels.shared_prefix_attention(q, pool, torch.cat(prefixes), torch.tensor([0, 700, 765]),
                                               torch.cat(members), torch.tensor([0, 4, 6]), 0.125, None)
    for slots, queries in zip(prefixes, members):
        for n in queries.tolist():
            expected_out, expected_lse = reference_part(q[n], pool, slots, 0.125)
            torch.testing.assert_close(out[n], expected_out, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(lse[n], expected_lse, atol=1e-5, rtol=1e-5)
    assert not out[3].any() and (lse[3] == -torch.inf).all()


@needs_kernels
@pytest.mark.parametrize("bf16", [False, True])
def test_combine_attention_parts_equals_attention_over_the_union(bf16):
    torch.manual_seed(2)
    pool = torch.randn(100, 2, 2, 64)
    q = torch.randn(3, 4, 64)
    a, b = torch.arange(0, 60), torch.arange(60, 100)
    parts = [reference_part(q[n], pool, s, 0.125) for s in (a, b) for n in range(3)]
    out_a, lse_a = (torch.stack([p[i] for p in parts[:3]]) for i in (0, 1))
    out_b, lse_b = (torch.stack([p[i] for p in parts[3:]]) for i in (0, 1))
    lse_b[2] = -torch.inf  # no keys in part b for query 2: its output is part a's
    out_b[2] = 0
    out = kernels.combine_attention_parts(out_a, lse_a, out_b, lse_b, bf16)
    expected = torch.stack([reference_part(q[n], pool, torch.arange(100), 0.125)[0] for n in range(2)] + [out_a[2]])
    assert out.shape == (3, 4 * 64) and out.dtype == (torch.bfloat16 if bf16 else torch.float32)
    tolerance = 1e-2 if bf16 else 1e-5
    torch.testing.assert_close(out.float(), expected.reshape(3, -1), atol=tolerance, rtol=tolerance)


def random_batch(heads, kv_heads, dim, prefixes, suffixes, counts, seed=3):
    """Rows sharing prompts: prefixes[b] = (group id, prefix length) or None, then suffixes[b]
    slots of its own, then counts[b] new tokens. Returns (pool, table (B, T), positions (B, Tq),
    counts) as `KVCache.allocate` gives them."""
    generator = torch.Generator().manual_seed(seed)
    pool = torch.randn(6000, 2, kv_heads, dim, generator=generator)
    free = iter(torch.randperm(6000, generator=generator).tolist())
    prompts = {}
    rows = []
    for prefix, suffix, count in zip(prefixes, suffixes, counts):
        row = []
        if prefix is not None:
            group, length = prefix
            if group not in prompts:
                prompts[group] = [next(free) for _ in range(length)]
            row += prompts[group][:length]
        rows.append(row + [next(free) for _ in range(suffix + count)])
    width = max(len(r) for r in rows)
    table = torch.zeros(len(rows), width, dtype=torch.int64)
    for b, row in enumerate(rows):
        table[b, : len(row)] = torch.tensor(row)
    counts = np.array(counts)
    starts = np.array([len(r) for r in rows]) - counts
    positions = torch.from_numpy(starts[:, None] + np.arange(counts.max())[None, :])
    return pool, table, positions, counts


def compact_pool(pool: torch.Tensor, kv_dtype: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`pool` (S, 2, KVH, D) float32 stored as the KV cache stores `kv_dtype`: (pool, int8 scales)."""
    if kv_dtype == "fp32":
        return pool, None
    if kv_dtype == "bf16":
        return pool.bfloat16(), None
    scales = pool.abs().amax(-1) / 127
    return torch.round(pool / scales[..., None]).clamp(-127, 127).to(torch.int8), scales.contiguous()


@needs_kernels
@pytest.mark.parametrize("heads, kv_heads, dim", [(9, 3, 64), (8, 2, 128)])
@pytest.mark.parametrize("t_q", [1, 3])
@pytest.mark.parametrize("kv_dtype", ["fp32", "bf16", "int8"])
def test_split_attention_equals_unsplit_attention(heads, kv_heads, dim, t_q, kv_dtype):
    """Two prompts shared by 3 and 2 rows (one of them forked at a shorter length), a row of its
    own; suffixes of unequal lengths; t_q new tokens per row (ragged when 3: each query reads its
    row's keys up to its own position, as the fused path packs them); every KV format (compact
    keys and values widened as they are read, as the unsplit kernel does)."""
    prefixes = [(0, 300), (0, 300), (1, 320), (None), (0, 250), (1, 320)]
    suffixes = [0, 17, 5, 900, 40, 1]
    counts = [1] * 6 if t_q == 1 else [3, 1, 2, 3, 1, 3]
    pool, table, positions, counts = random_batch(heads, kv_heads, dim, prefixes, suffixes, counts)
    pool, scales = compact_pool(pool, kv_dtype)
    plan = SharedPrefixPlan.of_step(table, positions, counts)
    own = [([3], 900)] if t_q == 3 else []  # row 3's 3 queries read its own 900 keys once
    assert [(rows.tolist(), p) for rows, p in plan.groups] == [([0, 1, 4], 250), ([2, 5], 320)] + own
    # packed queries, one per real new token (as _FusedOps builds them)
    valid = torch.from_numpy((np.arange(counts.max())[None, :] < counts[:, None]).reshape(-1))
    lengths = positions.reshape(-1)[valid] + 1
    query_table = table[torch.from_numpy(np.repeat(np.arange(len(counts)), counts))]
    q = torch.randn(int(counts.sum()), heads, dim, generator=torch.Generator().manual_seed(4))
    expected = kernels.paged_decode_attention(q, pool, query_table, lengths, dim**-0.5, False, None, scales)
    out = plan.attend(kernels, q, pool, query_table, lengths, dim**-0.5, False, scales)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_a_group_is_split_only_when_its_queries_times_prefix_keys_pay():
    assert (SHARED_PREFIX_MIN_KEYS, SHARED_PREFIX_MIN_QUERY_KEYS) == (64, 256)
    _, table, positions, counts = random_batch(4, 2, 64, [(0, 40)] * 16, [3] * 16, [1] * 16)
    assert SharedPrefixPlan.of_step(table, positions, counts) is None  # 40 keys < 64
    _, table, positions, counts = random_batch(4, 2, 64, [(0, 100), (0, 100), None], [3, 9, 50], [1, 1, 1])
    assert SharedPrefixPlan.of_step(table, positions, counts) is None  # 2 queries × 100 keys < 256
    _, table, positions, counts = random_batch(4, 2, 64, [(0, 100), (0, 100), None], [3, 9, 50], [2, 1, 1])
    assert [(r.tolist(), p) for r, p in SharedPrefixPlan.of_step(table, positions, counts).groups] == [([0, 1], 100)]
    _, table, positions, counts = random_batch(4, 2, 64, [(0, 64)] * 4, [3] * 4, [1] * 4)
    assert SharedPrefixPlan.of_step(table, positions, counts).groups[0][1] == 64  # 4 × 64 = 256


def test_a_row_of_its_own_reads_its_keys_once_for_its_queries_when_that_pays():
    """A row in no group appending several tokens is a group of one when its new tokens × cached
    keys reach OWN_PREFIX_MIN_QUERY_KEYS (a speculative verification: 5 tokens over 500 keys);
    its prefix is all its cached keys. One token stays row by row, however long its context."""
    assert OWN_PREFIX_MIN_QUERY_KEYS == 2048

    def groups(suffixes, counts):
        _, table, positions, counts = random_batch(4, 2, 64, [None] * len(suffixes), suffixes, counts)
        plan = SharedPrefixPlan.of_step(table, positions, counts)
        return None if plan is None else [(rows.tolist(), p) for rows, p in plan.groups]

    assert groups([500], [5]) == [([0], 500)]
    assert groups([1100, 1000, 400, 3000], [2, 2, 5, 1]) == [([0], 1100)]  # 2000 and 2000 query-keys; one token
    _, table, positions, counts = random_batch(4, 2, 64, [(0, 100), (0, 100), None], [3, 9, 700], [2, 1, 3])
    assert [(r.tolist(), p) for r, p in SharedPrefixPlan.of_step(table, positions, counts).groups] == [
        ([0, 1], 100), ([2], 700)]


# ------------------------------------------------------------------ the model
class CountingKernels:
    """The fused kernels module, counting calls of the shared-prefix kernel."""

    def __init__(self, module):
        self.module, self.shared_calls = module, 0

    def shared_prefix_attention(self, *args):
        self.shared_calls += 1
        return self.module.shared_prefix_attention(*args)

    def __getattr__(self, name):
        return getattr(self.module, name)


def forked_steps(model, prompt, rows, steps, split):
    """Prefill `prompt`, fork it into `rows` rows, append 3 ragged tokens then greedy-decode
    `steps` tokens per row (each row starts from another of the top tokens). Returns the logits
    of every step."""
    model.use_shared_prefix = split
    cache = model.new_cache(1)
    logits = model.forward(cache, [prompt]).logits
    cache.fork(0, rows - 1)
    out = [model.forward(cache, [[11 + b] * (1 + b % 3) for b in range(rows)], logits="all").logits]
    tokens = logits[0].topk(rows).indices
    for _ in range(steps):
        step = model.forward(cache, [[int(t)] for t in tokens]).logits
        out.append(step)
        tokens = step.argmax(-1)
    return out


@needs_kernels
@pytest.mark.slow
@pytest.mark.parametrize("kv_dtype", ["bf16", "int8"])
def test_a_compact_cache_splits_too_and_gives_the_same_logits(kv_dtype):
    """fp32 weights, a bf16 / int8 KV cache: forked rows read the shared prompt through the split
    (counted) and match row-by-row attention on the same cache format. Not to fp32's 2e-4: a
    1e-6 change of a hidden state can flip the rounding of a stored key or value (2^-8 relative
    in bf16), which later layers carry. Measured: 0.007-0.045 apart, where each format is 0.13
    (bf16) and 0.49 (int8) from an fp32 cache on the first step; the bound is 0.1 and the same
    greedy tokens."""
    from metagen.models import load

    model = load(dtype="fp32", kv_dtype=kv_dtype)
    counting = CountingKernels(model.kernels)
    prompt = [1, 504, 3458, 282, 4649, 314, 7306, 30, 378, 22] * 10
    model.kernels = counting
    split = forked_steps(model, prompt, 6, 2, True)
    assert counting.shared_calls == 3 * model.config.num_hidden_layers
    plain = forked_steps(model, prompt, 6, 2, False)
    for a, b in zip(split, plain):
        torch.testing.assert_close(a, b, atol=0.1, rtol=0)
        assert torch.equal(a.argmax(-1), b.argmax(-1))


@needs_kernels
@pytest.mark.slow
def test_model_forked_rows_give_the_same_logits_with_the_split_on_and_off(model_fp32):
    model = model_fp32
    counting = CountingKernels(model.kernels)
    prompt = [1, 504, 3458, 282, 4649, 314, 7306, 30, 378, 22] * 10
    saved = model.kernels, model.use_shared_prefix
    try:
        model.kernels = counting
        split = forked_steps(model, prompt, 6, 4, True)
        assert counting.shared_calls == 5 * model.config.num_hidden_layers  # every decode call, every layer
        plain = forked_steps(model, prompt, 6, 4, False)
        assert counting.shared_calls == 5 * model.config.num_hidden_layers
    finally:
        model.kernels, model.use_shared_prefix = saved
    for a, b in zip(split, plain):
        torch.testing.assert_close(a, b, atol=2e-4, rtol=0)  # as fused vs general (test_fused_kernels)


@needs_kernels
@pytest.mark.slow
def test_windowed_layers_split_only_where_the_window_sees_the_whole_prefix(model_fp32):
    """Layers given a window of 60 (shorter than the 100-token prompt: every query's window
    cuts into the prefix) attend row by row; a window of 4096 lets them split. Results equal
    the unsplit run either way."""
    model = model_fp32
    layers = model.config.num_hidden_layers
    saved = model.kernels, model.use_shared_prefix, model.layer_windows
    counting = CountingKernels(model.kernels)
    prompt = [1, 504, 3458, 282, 4649, 314, 7306, 30, 378, 22] * 10
    try:
        model.kernels = counting
        model.layer_windows = [60 if i % 3 == 0 else (4096 if i % 3 == 1 else None) for i in range(layers)]
        split = forked_steps(model, prompt, 6, 2, True)
        cut = sum(1 for w in model.layer_windows if w == 60)
        assert counting.shared_calls == 3 * (layers - cut)
        plain = forked_steps(model, prompt, 6, 2, False)
        model.layer_windows = saved[2]
        unwindowed = forked_steps(model, prompt, 6, 2, False)
    finally:
        model.kernels, model.use_shared_prefix, model.layer_windows = saved
    for a, b in zip(split, plain):
        torch.testing.assert_close(a, b, atol=2e-4, rtol=0)  # as fused vs general (test_fused_kernels)
    assert max((a - b).abs().max().item() for a, b in zip(split, unwindowed)) > 1e-2  # the window matters


@needs_kernels
@pytest.mark.slow
def test_sampling_forked_rows_gives_the_same_tokens_with_the_split_on_and_off(model_fp32):
    """The embedded model (fp32 weights) sampling 6 rows from one prompt (one prefill, forked):
    the same tokens, and logprobs equal up to float rounding, with the split on and off."""
    from metagen.decoding import generate
    from metagen.sampling import SamplingParams

    model = model_fp32
    messages = [{"role": "user", "content": "Write a short story about a lighthouse keeper. " * 8}]
    params = SamplingParams(n=6, max_tokens=12, temperature=1.0, top_p=0.95, ignore_eos=True)
    results = {}
    saved = model.use_shared_prefix
    try:
        for split in (True, False):
            model.use_shared_prefix = split
            results[split] = generate(model, messages, params, generator=torch.Generator().manual_seed(7))
    finally:
        model.use_shared_prefix = saved
    assert 6 * len(results[True].prompt_token_ids) >= SHARED_PREFIX_MIN_QUERY_KEYS
    for a, b in zip(results[True].completions, results[False].completions):
        assert a.token_ids == b.token_ids
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=2e-4)
    # the switch changes the computation (identical logprobs would mean the split never ran)
    assert any(a.logprobs != b.logprobs for a, b in zip(results[True].completions, results[False].completions))


@needs_kernels
@pytest.mark.slow
def test_default_dtype_forked_steps_agree_up_to_bf16_rounding(model):
    """In the default dtype the matmul inputs are bf16: the split's float-rounding change in
    attention (~1e-7) flips bf16 roundings that add up to ~0.3 in logits, the same noise as
    between the fused and general paths (test_fused_kernels), so sampled tokens may differ in a
    long run. Each step's distributions stay within KL 1e-2 and the greedy tokens agree."""
    prompt = [1, 504, 3458, 282, 4649, 314, 7306, 30, 378, 22] * 10
    saved = model.use_shared_prefix
    try:
        split, plain = (forked_steps(model, prompt, 6, 1, on) for on in (True, False))
    finally:
        model.use_shared_prefix = saved
    for a, b in zip(split, plain):
        p, q = torch.log_softmax(b, -1), torch.log_softmax(a, -1)
        assert (p.exp() * (p - q)).sum(-1).max().item() < 1e-2
        assert torch.equal(a.argmax(-1), b.argmax(-1))
