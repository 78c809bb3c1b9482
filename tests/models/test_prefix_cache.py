"""The radix tree of cached prefixes: longest match, insertion of new tails only, edge splits,
LRU eviction under a token budget that never removes a locked path, and exact reference
counting (every held slot released once) — against a `KVCache` too."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch

from metagen.models.cache import KVCache
from metagen.models.prefix_cache import PrefixCache
from metagen.sizes import parse_size


class Refs:
    """Reference counts per slot, as a cache keeps them; handles are the held slot tuples."""

    def __init__(self) -> None:
        self.count: Counter[int] = Counter()

    def hold(self, slots: np.ndarray) -> tuple[int, ...]:
        handle = tuple(int(s) for s in slots)
        self.count.update(handle)
        return handle

    def release(self, handle: tuple[int, ...]) -> None:
        self.count.subtract(handle)
        assert min(self.count.values(), default=0) >= 0

    def held(self) -> set[int]:
        return {slot for slot, n in self.count.items() if n > 0}


def tree(capacity: int = 100) -> tuple[PrefixCache, Refs]:
    refs = Refs()
    return PrefixCache(capacity, refs.hold, refs.release), refs


def test_longest_prefix_and_only_new_tails_are_held():
    cache, refs = tree()
    cache.insert([1, 2, 3, 4], [10, 11, 12, 13])
    found = cache.match([1, 2, 3, 4, 5])
    assert found.length == 4 and found.slots.tolist() == [10, 11, 12, 13]
    # a second sequence sharing [1, 2]: the shared part keeps the first slots, its own are not held
    cache.insert([1, 2, 7, 8], [20, 21, 22, 23])
    assert cache.size == 6
    assert refs.held() == {10, 11, 12, 13, 22, 23}
    assert cache.match([1, 2, 7, 9]).slots.tolist() == [10, 11, 22]
    assert cache.match([1, 2, 3]).slots.tolist() == [10, 11, 12]
    assert cache.match([5, 1]).length == 0
    assert cache.match([]).length == 0
    # a split keeps exactly one reference per slot
    assert all(refs.count[s] == 1 for s in refs.held())


def test_split_edges_still_match_their_whole_sequences():
    cache, refs = tree()
    cache.insert([1, 2, 3, 4, 5, 6], list(range(6)))
    cache.match([1, 2, 3, 9])  # splits [1..6] after 3
    cache.match([1, 9])  # and after 1
    assert cache.match([1, 2, 3, 4, 5, 6]).slots.tolist() == list(range(6))
    assert cache.size == 6 and sorted(refs.held()) == list(range(6))
    assert all(refs.count[s] == 1 for s in range(6))


def test_lru_eviction_under_budget_and_locked_paths_stay():
    cache, refs = tree(capacity=6)
    a = cache.insert([1, 2, 3], [0, 1, 2])
    cache.insert([4, 5, 6], [3, 4, 5])
    cache.insert([7, 8, 9], [6, 7, 8])  # 9 tokens held > 6
    cache.lock(a)
    cache.match([4, 5, 6])  # [4,5,6] used more recently than [7,8,9]
    assert cache.evict() == 3
    assert refs.held() == {0, 1, 2, 3, 4, 5}
    cache.capacity = 0
    cache.evict()  # everything unlocked goes; the locked path stays
    assert refs.held() == {0, 1, 2} and cache.size == 3
    cache.unlock(a)
    cache.evict()
    assert refs.held() == set() and cache.size == 0
    with pytest.raises(RuntimeError, match="not locked"):
        cache.unlock(a)


def test_eviction_goes_leaf_first_and_frees_emptied_parents():
    cache, refs = tree(capacity=2)
    cache.insert([1, 2, 3], [0, 1, 2])
    cache.insert([1, 2, 4], [0, 1, 5])  # splits: [1,2] -> {[3], [4]}
    assert cache.size == 4
    cache.match([1, 2, 4])
    cache.evict()  # [3] first (least recent), then [4], then... stops at 2 tokens
    assert refs.held() == {0, 1} and cache.size == 2
    assert cache.match([1, 2, 4]).length == 2


def test_a_lock_below_a_later_split_protects_the_new_upper_node():
    cache, refs = tree(capacity=0)
    node = cache.insert([1, 2, 3, 4], [0, 1, 2, 3])
    cache.lock(node)
    cache.insert([1, 2, 9], [0, 1, 7])  # splits the locked edge; [9] is unlocked
    cache.evict()
    assert refs.held() == {0, 1, 2, 3}
    cache.unlock(node)
    cache.evict()
    assert refs.held() == set()


def test_random_sequences_keep_reference_counts_exact_and_never_serve_a_wrong_slot():
    rng = np.random.default_rng(0)
    cache, refs = tree(capacity=40)
    meaning: dict[int, tuple] = {}  # slot -> the token prefix whose last key/value it stores
    next_slot = 0
    for _ in range(300):
        length = int(rng.integers(1, 12))
        tokens = rng.integers(0, 4, size=length).tolist()
        found = cache.match(tokens)
        assert found.length <= length
        for i, slot in enumerate(found.slots.tolist()):
            assert meaning[slot] == tuple(tokens[: i + 1])
        slots = found.slots.tolist()
        for i in range(found.length, length):
            meaning[next_slot] = tuple(tokens[: i + 1])
            slots.append(next_slot)
            next_slot += 1
        node = cache.insert(tokens, slots)
        cache.lock(node)
        cache.evict()
        assert cache.match(tokens).slots.tolist() == slots  # locked: still whole
        cache.unlock(node)
        assert cache.size <= 40
        assert sum(refs.count.values()) == cache.size
    cache.clear()
    assert refs.held() == set()


def test_with_a_kv_cache_evicted_slots_return_to_the_free_list():
    kv = KVCache(num_layers=1, num_kv_heads=1, head_dim=2, dtype=torch.float32, max_length=64, capacity=16)
    prefixes = PrefixCache(4, kv.share, kv.release)
    kv.allocate(np.array([6]))
    prefixes.insert(list(range(6)), kv.slots(0))
    kv.reset(1)  # the row leaves: the tree alone keeps its 6 slots
    assert kv.num_cached_slots == 6
    found = prefixes.match([0, 1, 2, 3, 9])
    row = kv.share(found.slots)
    kv.restore([row])
    kv.release(row)
    assert kv.slots(0).tolist() == found.slots.tolist()
    prefixes.evict()  # over budget (6 > 4): the unlocked tail [4, 5] goes
    assert kv.num_cached_slots == 4 and prefixes.size == 4
    with pytest.raises(ValueError, match="free"):
        kv.share([found.slots[0], 15])
    with pytest.raises(TypeError, match="integer"):
        kv.share([0.5])
    with pytest.raises(ValueError, match=r"\[0, 16\)"):
        kv.share([16])
    with pytest.raises(ValueError, match="distinct"):
        kv.share([found.slots[0], found.slots[0]])


@pytest.mark.parametrize(("text", "expected"), [("256MiB", 256 * 2**20), ("1.5GB", 1_500_000_000), ("0", 0),
                                                  ("4096", 4096), ("2 kib", 2048), ("10B", 10)])
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "-1MiB", "12 parsecs", "MiB", "1e9"])
def test_parse_size_refuses_what_is_not_a_size(text):
    with pytest.raises(ValueError, match="--cache-memory"):
        parse_size(text)
