"""KVCache bookkeeping: shared slots, reference counts, release on truncate/select."""

import numpy as np
import pytest
import torch

from metagen.models.cache import KVCache


def make_cache(batch=1, capacity=16):
    cache = KVCache(num_layers=2, num_kv_heads=1, head_dim=4, dtype=torch.float32, max_length=100, capacity=capacity)
    cache.reset(batch)
    return cache


def append(cache, counts):
    slots, table, positions = cache.allocate(np.array(counts))
    for layer in range(cache.num_layers):
        values = slots.float()[:, None, None, None].expand(-1, 2, 1, 4)
        cache.write(layer, slots, values)
    return slots, table, positions


def test_fork_shares_slots_and_truncate_releases_only_unshared():
    cache = make_cache()
    append(cache, [5])
    children = cache.fork(0, 2)
    assert children == [1, 2]
    assert cache.num_cached_slots == 5  # nothing copied
    assert all((cache.slots(r) == cache.slots(0)).all() for r in children)
    append(cache, [1, 2, 3])
    assert cache.lengths == [6, 7, 8]
    assert cache.num_cached_slots == 5 + 6
    cache.truncate(2, 3)  # cuts into the shared prefix: shared slots must survive
    assert cache.num_cached_slots == 5 + 3
    assert (cache.slots(2) == cache.slots(0)[:3]).all()


def test_a_window_releases_slots_no_future_query_reads_keeping_a_truncation_margin():
    """window 4, keep 2: when a row of length L grows, its positions below L − 4 + 1 − 2 are
    released (once at least 2 are due); shared positions stay until no row holds them."""
    cache = KVCache(num_layers=1, num_kv_heads=1, head_dim=4, dtype=torch.float32, max_length=100, capacity=16,
                    window=4, keep=2)
    cache.reset(1)
    append(cache, [6])  # from empty: nothing to release
    assert cache.released(0) == 0 and cache.num_cached_slots == 6
    first = cache.snapshot(0)  # holds positions 0..5 outside the batch
    append(cache, [1])  # L = 6: positions < 6 − 3 − 2 = 1 are due, but fewer than keep
    assert cache.released(0) == 0
    append(cache, [1])  # L = 7: positions < 2 released from the row (the snapshot keeps them)
    assert cache.released(0) == 2 and cache.length(0) == 8 and cache.num_cached_slots == 8
    cache.release(first)
    assert cache.num_cached_slots == 6  # now free
    cache.fork(0, 1)
    append(cache, [3, 1])  # row 0: L = 8 -> release < 3 (1 more, not due); row 1: same
    assert [cache.released(r) for r in (0, 1)] == [2, 2]
    append(cache, [1, 2])  # row 0: L = 11 -> < 6; row 1: L = 9 -> < 4
    assert [cache.released(r) for r in (0, 1)] == [6, 4]
    assert cache.num_cached_slots == len(set(cache._table[0, 6:12]) | set(cache._table[1, 4:11]))
    cache.truncate(0, 9)  # the next query at 9 reads 6..9: still held
    with pytest.raises(ValueError, match=r"length=8 is out of range for row 0: .*truncated to 9 tokens at least"):
        cache.truncate(0, 8)
    with pytest.raises(ValueError, match="no longer holds its first 4 positions"):
        cache.slots(1)
    snapshot = cache.snapshot(1)
    assert snapshot.start == 4 and snapshot.length == 11
    cache.restore([snapshot])
    assert cache.released(0) == 4 and cache.length(0) == 11


def test_select_drops_rows_and_frees_their_private_slots():
    cache = make_cache()
    append(cache, [4])
    cache.select([0, 0, 0])
    append(cache, [2, 2, 2])
    assert cache.num_cached_slots == 4 + 6
    cache.select([1])
    assert cache.batch_size == 1 and cache.lengths == [6]
    assert cache.num_cached_slots == 6
    cache.select([])
    assert cache.num_cached_slots == 0


def test_read_gathers_each_rows_own_values_after_growth():
    cache = make_cache(capacity=16)
    append(cache, [3])
    cache.fork(0, 1)
    _, table, positions = append(cache, [20, 1])  # forces the pool to grow past 16 slots
    gathered = cache.read(1, table)
    assert gathered.shape == (2, 23, 2, 1, 4)
    assert torch.equal(gathered[0, :23, 1, 0, 0], torch.from_numpy(cache.slots(0)).float())
    assert torch.equal(gathered[1, :4, 0, 0, 0], torch.from_numpy(cache.slots(1)).float())
    assert positions.tolist()[1][:1] == [3]


def test_errors_name_the_problem():
    cache = make_cache()
    append(cache, [3])
    with pytest.raises(ValueError, match="length=5"):
        cache.truncate(0, 5)
    with pytest.raises(ValueError, match=r"row=3 is out of range: the cache has rows 0\.\.0"):
        cache.truncate(3, 1)
    with pytest.raises(ValueError, match="context of 100"):
        cache.allocate(np.array([98]))
    assert cache.lengths == [3]  # a refused append changes nothing


def test_snapshots_keep_nodes_alive_and_restore_any_set_of_them():
    cache = make_cache()
    append(cache, [4])
    root = cache.snapshot(0)
    cache.select([0, 0])
    append(cache, [2, 3])
    left, right = cache.snapshot(0), cache.snapshot(1)
    left_slots = left.slots.copy()
    cache.select([])  # the batch is gone; the snapshots keep every slot
    assert cache.num_cached_slots == 4 + 5
    cache.restore([right, left, right])
    assert cache.lengths == [7, 6, 7]
    assert (cache.slots(1) == left_slots).all()
    append(cache, [1, 1, 1])  # new tokens go to fresh slots; the snapshots are unchanged
    assert cache.num_cached_slots == 4 + 5 + 3
    assert left.length == 6 and (left.slots == left_slots).all()
    cache.restore([root])
    assert cache.lengths == [4] and cache.num_cached_slots == 4 + 5
    for snapshot in (left, right):
        cache.release(snapshot)
    assert cache.num_cached_slots == 4
    with pytest.raises(ValueError, match="already released"):
        cache.release(left)
    with pytest.raises(ValueError, match="snapshots\\[0\\] was already released"):
        cache.restore([left])
    cache.select([])
    cache.release(root)
    assert cache.num_cached_slots == 0


# ----------------------------------------------- argument checks, the same for every row cache
def kv_cache(batch):
    cache = make_cache(batch)
    append(cache, [3] * batch)
    return cache


def kgram_cache(batch):
    from metagen.models.kgram import KGramCache

    cache = KGramCache(batch)
    cache.rows = [[1, 2, 3] for _ in range(batch)]
    return cache


def transformers_cache(batch):
    from metagen.models.transformers_adapter import TransformersCache

    cache = TransformersCache(batch)
    cache.valid = torch.ones(batch, 3, dtype=torch.bool)  # row operations only; no transformers model needed
    cache._lengths[:] = 3
    return cache


ROW_CACHES = {"KVCache": kv_cache, "KGramCache": kgram_cache, "TransformersCache": transformers_cache}
row_caches = pytest.mark.parametrize("build", ROW_CACHES.values(), ids=list(ROW_CACHES))


@row_caches
@pytest.mark.parametrize(
    ("operation", "error", "message"),
    [
        pytest.param(lambda c: c.select([0.5]), TypeError, r"indices\[0\] must be an int, got 0\.5", id="select-float"),
        pytest.param(lambda c: c.select([1, True]), TypeError, r"indices\[1\] must be an int, got the bool True", id="select-bool"),
        pytest.param(lambda c: c.select(np.array([0.0, 1.0])), TypeError, "indices must hold ints, got dtype float64", id="select-float-array"),
        pytest.param(lambda c: c.select([[0, 1]]), TypeError, r"indices\[0\] must be an int", id="select-nested"),
        pytest.param(lambda c: c.select([0, 2]), ValueError, r"indices\[1\]=2 is out of range: the cache has rows 0\.\.1", id="select-past-end"),
        pytest.param(lambda c: c.select([-1]), ValueError, r"indices\[0\]=-1 is out of range", id="select-negative"),
        pytest.param(lambda c: c.truncate(0.0, 1), TypeError, "row must be an int, got 0.0", id="truncate-float-row"),
        pytest.param(lambda c: c.truncate(0, 1.0), TypeError, "length must be an int, got 1.0", id="truncate-float-length"),
        pytest.param(lambda c: c.truncate(-1, 1), ValueError, r"row=-1 is out of range: the cache has rows 0\.\.1", id="truncate-negative-row"),
        pytest.param(lambda c: c.truncate(0, 4), ValueError, r"length=4 is out of range: must be in \[0, 3\]", id="truncate-too-long"),
        pytest.param(lambda c: c.fork(0, 1.0), TypeError, "n must be an int", id="fork-float-n"),
        pytest.param(lambda c: c.fork(0, -1), ValueError, "n=-1 is out of range: must be >= 0", id="fork-negative-n"),
        pytest.param(lambda c: c.fork(2, 1), ValueError, "row=2 is out of range", id="fork-bad-row"),
        pytest.param(lambda c: c.snapshot(1.0), TypeError, "row must be an int", id="snapshot-float-row"),
        pytest.param(lambda c: c.snapshot(2), ValueError, "row=2 is out of range", id="snapshot-bad-row"),
        pytest.param(lambda c: c.restore(c.snapshot(0)), TypeError, r"snapshots must be a sequence .*: pass \[snapshot\]", id="restore-one-snapshot"),
        pytest.param(lambda c: c.restore([(1, 2, 3)]), TypeError, r"snapshots\[0\] must be a \w+Snapshot made by this cache", id="restore-not-a-snapshot"),
        pytest.param(lambda c: c.release(None), TypeError, r"snapshot must be a \w+Snapshot", id="release-not-a-snapshot"),
    ],
)
def test_bad_arguments_are_refused_by_name_and_change_nothing(build, operation, error, message):
    """Regression: select([0.5]) was accepted (row 0), float rows / lengths raised raw
    IndexError / TypeError, and the list caches took row -1 as the last row."""
    cache = build(2)
    with pytest.raises(error, match=message):
        operation(cache)
    assert cache.batch_size == 2 and cache.lengths == [3, 3]


@row_caches
def test_integer_scalars_of_numpy_and_torch_are_rows_too(build):
    cache = build(2)
    cache.truncate(np.int64(1), torch.tensor(2))
    cache.select(np.array([1, 0]))
    cache.select(torch.tensor([1, 1, 0]))
    assert cache.fork(np.int32(2), torch.tensor(1)) == [3]
    assert cache.lengths == [3, 3, 2, 2]


@row_caches
def test_snapshots_are_restored_only_into_the_cache_that_made_them(build):
    """Regression: KVCache.restore took another cache's snapshot and the model then read that
    cache's slot ids in its own pools (wrong keys and values, wrong logits)."""
    mine, other = build(2), build(1)
    snapshot = mine.snapshot(0)
    with pytest.raises(ValueError, match=r"snapshots\[0\] was made by another cache"):
        other.restore([snapshot])
    with pytest.raises(ValueError, match="snapshot was made by another cache"):
        other.release(snapshot)
    assert other.batch_size == 1 and other.lengths == [3]
    mine.restore([snapshot, snapshot])
    assert mine.lengths == [3, 3]
    mine.release(snapshot)
    with pytest.raises(ValueError, match=r"snapshots\[0\] was already released"):
        mine.restore([snapshot])
    with pytest.raises(ValueError, match="snapshot was already released"):
        mine.release(snapshot)


@row_caches
@pytest.mark.parametrize(("batch_size", "error"), [(1.0, TypeError), (True, TypeError), (-1, ValueError)])
def test_batch_size_must_be_a_non_negative_int(build, batch_size, error):
    with pytest.raises(error, match="batch_size"):
        build(batch_size)


def test_prefill_refuses_a_batch_size_below_one():
    """Regression: prefill(ids, batch_size=0) returned a 1-row cache."""
    from tests.decoding.toy_model import BOS, ToyModel

    model = ToyModel()
    for batch_size, error in ((0, ValueError), (-2, ValueError), (2.0, TypeError)):
        with pytest.raises(error, match="batch_size"):
            model.prefill([BOS], batch_size=batch_size)
    assert model.calls == []  # refused before any forward
    cache, out = model.prefill([BOS], batch_size=np.int64(2))
    assert cache.batch_size == 2 and out.logits.shape == (2, 5)
