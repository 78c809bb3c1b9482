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
    with pytest.raises(IndexError, match="row=3"):
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
    with pytest.raises(ValueError, match="snapshots\\[0\\] is not a live RowSnapshot"):
        cache.restore([left])
    cache.select([])
    cache.release(root)
    assert cache.num_cached_slots == 0
