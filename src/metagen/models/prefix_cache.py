"""A radix tree from token-id prefixes to KV-cache slots, shared across requests (RadixAttention).

RadixAttention (Zheng et al., 2024, "SGLang: Efficient Execution of Structured Language Model
Programs") keeps the keys and values of finished (and running) sequences in a radix tree keyed by
token ids; a new sequence starts from the longest cached prefix of its prompt and computes only
the rest. Multi-turn chats (turn 2's prompt is turn 1's prompt + answer + the new message) and
a system prompt shared by many requests are the workloads that gain.

Each node holds an edge: `tokens (k,)` and the `slots (k,)` storing their keys and values, plus one
*handle* from `hold(slots)` that keeps those slots alive in the cache (for `KVCache`: a
`RowSnapshot` from `KVCache.share`, one reference per slot) until `release(handle)`. The tree is
a pure data structure: it never reads keys or values.

- `match(tokens)`: the longest cached prefix, its slots and the node where it ends (splitting an
  edge that matches only in part, so that node covers exactly the prefix). O(len(tokens)).
- `insert(tokens, slots)`: add what is not cached yet (the matched part keeps its own slots; the
  caller's slots for it are not held). O(len(tokens)).
- `lock(node)` / `unlock(node)`: a running sequence pins the path root → node; `evict` never
  removes a locked node.
- `evict()`: while more than `capacity` tokens are held, remove the least recently used unlocked
  leaf and release its slots. O(L log L) for L leaves.

Holding at most `capacity` tokens (plus the locked paths, which running rows use anyway) bounds
the memory the tree keeps out of the cache's free list.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

@dataclass(eq=False)
class Node:
    """An edge of the tree: `tokens (k,)` stored in `slots (k,)`, kept alive by `handle`."""

    tokens: np.ndarray
    slots: np.ndarray
    handle: object
    parent: Node | None
    children: dict[int, Node] = field(default_factory=dict)  # first token of the child's edge -> child
    last_use: int = 0
    locks: int = 0  # running sequences whose path goes through this node


@dataclass
class Match:
    """The longest cached prefix: `length` tokens, stored in `slots (length,)`, ending at `node`."""

    length: int
    slots: np.ndarray
    node: Node


class PrefixCache:
    """Radix tree of cached token prefixes (see the module docstring).

    capacity: most tokens held (an int >= 0); hold(slots) -> handle keeps slots alive,
    release(handle) gives them back.
    """

    def __init__(self, capacity: int, hold: Callable[[np.ndarray], object], release: Callable[[object], None]) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 0:
            raise ValueError(f"capacity={capacity!r} must be an int >= 0 (tokens)")
        self.capacity = capacity
        self._hold, self._release = hold, release
        empty = np.zeros(0, dtype=np.int64)
        self.root = Node(empty, empty, None, None)
        self.size = 0  # tokens held
        self._clock = 0

    # ------------------------------------------------------------------ lookups
    def match(self, tokens: Sequence[int]) -> Match:
        """The longest prefix of `tokens` in the tree; marks its path as just used."""
        tokens = np.asarray(tokens, dtype=np.int64)
        self._clock += 1
        node, position, parts = self.root, 0, []
        while position < tokens.size:
            child = node.children.get(int(tokens[position]))
            if child is None:
                break
            common = _common_length(child.tokens, tokens[position:])
            if common < child.tokens.size:
                child = self._split(child, common)
            child.last_use = self._clock
            parts.append(child.slots)
            position += common
            node = child
        slots = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
        return Match(position, slots, node)

    def insert(self, tokens: Sequence[int], slots: Sequence[int]) -> Node:
        """Cache `tokens` stored in `slots` (same length); returns the node where they end.

        The already cached prefix keeps its slots; only the new tail is held. Does not evict:
        call `evict` (after `lock`ing what must stay)."""
        tokens = np.asarray(tokens, dtype=np.int64)
        slots = np.asarray(slots, dtype=np.int64)
        if tokens.shape != slots.shape or tokens.ndim != 1:
            raise ValueError(f"tokens {tokens.shape} and slots {slots.shape} must be 1-D of one length")
        found = self.match(tokens)
        node = found.node
        if found.length < tokens.size:
            tail_tokens, tail_slots = tokens[found.length:].copy(), slots[found.length:].copy()
            child = Node(tail_tokens, tail_slots, self._hold(tail_slots), node, last_use=self._clock)
            node.children[int(tail_tokens[0])] = child
            self.size += tail_tokens.size
            node = child
        return node

    # ------------------------------------------------------------------ pins
    def lock(self, node: Node) -> None:
        """Pin the path root → `node` (a running sequence uses it)."""
        while node is not self.root:
            node.locks += 1
            node = node.parent

    def unlock(self, node: Node) -> None:
        while node is not self.root:
            if node.locks <= 0:
                raise RuntimeError("unlock of a node that is not locked")
            node.locks -= 1
            node = node.parent

    # ------------------------------------------------------------------ eviction
    def evict(self) -> int:
        """Remove least recently used unlocked leaves until at most `capacity` tokens are held
        (or only locked nodes remain); returns the tokens released."""
        if self.size <= self.capacity:
            return 0
        leaves = [(leaf.last_use, id(leaf), leaf) for leaf in self._leaves() if not leaf.locks]
        heapq.heapify(leaves)
        released = 0
        while self.size > self.capacity and leaves:
            _, _, leaf = heapq.heappop(leaves)
            parent = leaf.parent
            del parent.children[int(leaf.tokens[0])]
            self._release(leaf.handle)
            self.size -= leaf.tokens.size
            released += leaf.tokens.size
            if parent is not self.root and not parent.children and not parent.locks:
                heapq.heappush(leaves, (parent.last_use, id(parent), parent))
        return released

    def clear(self) -> None:
        """Release every node (locks included: call when nothing runs)."""
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            self._release(node.handle)
        self.root.children.clear()
        self.size = 0

    # ------------------------------------------------------------------ internals
    def _leaves(self) -> list[Node]:
        leaves, stack = [], list(self.root.children.values())
        while stack:
            node = stack.pop()
            if node.children:
                stack.extend(node.children.values())
            else:
                leaves.append(node)
        return leaves

    def _split(self, child: Node, length: int) -> Node:
        """Cut `child`'s edge after `length` tokens; returns the new upper node (same locks)."""
        upper = Node(child.tokens[:length].copy(), child.slots[:length].copy(), self._hold(child.slots[:length]),
                     child.parent, last_use=child.last_use, locks=child.locks)
        lower_slots = child.slots[length:].copy()
        handle = self._hold(lower_slots)
        self._release(child.handle)
        child.parent.children[int(upper.tokens[0])] = upper
        child.tokens, child.slots, child.handle, child.parent = child.tokens[length:].copy(), lower_slots, handle, upper
        upper.children[int(child.tokens[0])] = child
        return upper


def _common_length(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the common prefix of two 1-D int arrays."""
    n = min(a.size, b.size)
    differ = np.nonzero(a[:n] != b[:n])[0]
    return int(differ[0]) if differ.size else n
