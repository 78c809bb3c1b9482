"""The contracts of the speculative loop (`draft_loop`): a `Draft` (a tree of tokens per row, a
chain in the loop today), the `Drafter` that proposes it, the `Verification` that turns a forward
over it into tokens, the `DraftSchedule` of its lengths. Drafters and verifications live in
`metagen.speculative` (models, n-gram tables; the token / block / greedy rules; named in
`metagen.speculative.registry`) and here (`jump_forward.ForcedRunDrafter`, `draw_verify`)."""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from metagen.decoding.batch import RowBatch
from metagen.decoding.result import StreamEvent
from metagen.sampling import SamplerChain

__all__ = ["Draft", "DraftSchedule", "Drafter", "Outcomes", "Verification"]

# per live row: (tau, x) — d_1..d_tau taken, then x; a tree verification returns (tau, x, nodes),
# the kept root-to-node path's node indices (tau of them)
Outcomes = list[tuple]


@dataclass
class Draft:
    """Proposed tokens per row, as a tree, and where they came from.

    Row b holds m_b draft nodes. Node i is token `tokens[b][i]` following node `parents[b][i]`
    (an earlier node: parents point backwards), or following the row's last committed token when
    the parent is -1. A chain d_1..d_m is the one-child case, parents `[-1, 0, 1, ..., m-2]`
    (`Draft.chain`); a tree shares prefixes between several continuations (k drafts from one
    context are k chains hanging from -1).

    tokens: per row, m_b token ids.
    parents: per row, m_b ints, `-1 <= parents[b][i] < i`.
    probs: per row, `(m_b, V)` float32 distributions, row i the one node i was drawn from (the
        drafter's next-token distribution after node i's parent, after the sampler chain), or
        None for a deterministic proposal (a point mass on each node's token).
    calls: drafter forwards spent (batched calls count once); flops: their estimated FLOPs.
    iid_siblings: how the siblings of a node were drawn from their parent's one distribution:
        False, one after another without replacement (distinct tokens, what recursive rejection
        sampling assumes by default); True, i.i.d. with replacement (SpecTr's k drafts: tokens
        may repeat, each copy with its own subtree). A chain has no siblings either way.

    Checked on construction (ValueError naming the field, row and node). The loop feeds a tree
    with tree attention when its verification verifies trees (`Verification.trees`); the chain
    rules call `require_chain`, which refuses a tree by name (`is_chain`: every row a chain).
    Helpers per row: `children(b, i)` O(m_b), `depth(b, i)` O(depth), `paths(b)` O(m_b·depth).
    """

    tokens: list[list[int]]
    parents: list[list[int]]
    probs: list[Tensor | None]
    calls: int = 0
    flops: float = 0.0
    iid_siblings: bool = False

    def __post_init__(self) -> None:
        rows = len(self.tokens)
        for name in ("parents", "probs"):
            if len(getattr(self, name)) != rows:
                raise ValueError(f"{name} has {len(getattr(self, name))} rows, tokens {rows}: one entry per row")
        for b, (tokens, parents, probs) in enumerate(zip(self.tokens, self.parents, self.probs)):
            if len(parents) != len(tokens):
                raise ValueError(f"parents[{b}] has {len(parents)} entries, tokens[{b}] {len(tokens)}: one per node")
            for i, parent in enumerate(parents):
                if isinstance(parent, bool) or not isinstance(parent, int) or not -1 <= parent < i:
                    raise ValueError(f"parents[{b}][{i}]={parent!r} must point backwards: an int in [-1, {i})")
            if probs is not None and (not isinstance(probs, Tensor) or probs.dim() != 2
                                      or probs.shape[0] != len(tokens)):
                got = tuple(probs.shape) if isinstance(probs, Tensor) else type(probs).__name__
                raise ValueError(f"probs[{b}] must be None or a tensor of shape (m, V) = ({len(tokens)}, V), got {got}")

    @classmethod
    def chain(cls, tokens: list[list[int]], probs: list[Tensor | None] | None = None, calls: int = 0,
              flops: float = 0.0) -> Draft:
        """One chain per row (parents `[-1, 0, 1, ...]`); `probs` None: point masses in every row."""
        parents = [list(range(-1, len(row) - 1)) for row in tokens]
        return cls(tokens, parents, [None] * len(tokens) if probs is None else probs, calls, flops)

    @property
    def is_chain(self) -> bool:
        """Whether every row is a chain (each node the child of the one before)."""
        return all(parent == i - 1 for parents in self.parents for i, parent in enumerate(parents))

    def require_chain(self, what: str) -> None:
        """ValueError naming the first row that is not a chain: `what` verifies chains only."""
        for b, parents in enumerate(self.parents):
            if any(parent != i - 1 for i, parent in enumerate(parents)):
                raise ValueError(f"{what} verifies chain drafts only (parents [-1, 0, 1, ...]), but row {b} is a "
                                 f"tree with parents {parents}: tree drafts need a tree verification rule and "
                                 "a target forward with tree attention")

    def children(self, row: int, node: int) -> list[int]:
        """The nodes of `row` whose parent is `node` (-1: those following the committed tokens), in order."""
        return [i for i, parent in enumerate(self.parents[row]) if parent == node]

    def depth(self, row: int, node: int) -> int:
        """Draft tokens on the path to `node`, itself included (1 for a child of -1)."""
        parents, depth = self.parents[row], 0
        while node != -1:
            node, depth = parents[node], depth + 1
        return depth

    def paths(self, row: int) -> list[list[int]]:
        """Every root-to-leaf path of `row` as node indices, leaves in node order (none when
        the row is empty; a chain has one path, all of its nodes)."""
        parents = self.parents[row]
        has_child = set(parents)
        paths = []
        for leaf in (i for i in range(len(parents)) if i not in has_child):
            path, node = [], leaf
            while node != -1:
                path.append(node)
                node = parents[node]
            paths.append(path[::-1])
        return paths


class Drafter(ABC):
    """Proposes draft tokens for a batch of rows.

    A drafter sees each row's committed tokens (prompt + generated, the last one not yet run
    through the target) and proposes up to γ_b tokens per row together with the distributions
    they were drawn from (after the same sampler chain as the target, so the verification rules
    compare like with like). Deterministic drafters (n-gram lookup, greedy drafts, forced runs)
    return point masses.

        drafter.start(prompt_ids, batch_size)            # once per request (`for_request`: a copy per request)
        draft = drafter.propose(contexts, lengths, chain, generator)
        drafter.observe(fed, logits, committed)          # the target's logits of that step
        drafter.select(rows)                             # rows leaving / reordering the batch
        drafter.finish(outputs)                          # end of the request
    """

    name: str = "drafter"
    vocab_size: int | None = None  # None: any vocabulary (token-id based drafters)
    prefill_flops: float = 0.0  # FLOPs `start` spent (set by drafters that run a model)
    forced: bool = False  # True: proposes the text processors force (counted as forced tokens)
    proposes_trees: bool = False  # True: its drafts branch (needs a verification with `trees`)
    iid_siblings: bool = False  # True: a node's children are drawn i.i.d. (`Draft.iid_siblings`)
    max_nodes: int | None = None  # most draft nodes per row and step (a tree's budget); None: γ bounds them
    reads_hidden: bool = False  # True: the verify forward also returns hidden states, for `observe_hidden`

    @property
    def draft_models(self) -> tuple:
        """The models this drafter runs, each keeping a cache of the request's rows (their bytes
        per token join the serving engine's admission check); () for a model-free drafter."""
        return ()

    def for_request(self) -> Drafter:
        """A drafter for one more request running at the same time as others (the serving engine
        gives each request its own): a shallow copy, so what this one keeps across requests —
        an n-gram table of outputs, a successor matrix, a corpus — is read and updated in
        place by every copy, while `start` gives the copy its own per-request state. A drafter
        whose per-request state is not all reset by `start` must override it."""
        return copy.copy(self)

    def start(self, prompt_ids: Sequence[int], batch_size: int, target_cache=None) -> None:
        """Begin a request whose rows all start from `prompt_ids`; `target_cache` holds the
        target's prefilled prompt (row 0), for drafters that can reuse it."""

    @abstractmethod
    def propose(
        self,
        contexts: Sequence[Sequence[int]],
        lengths: Sequence[int],
        chain: SamplerChain,
        generator: torch.Generator | None,
    ) -> Draft:
        """Up to `lengths[b]` tokens following `contexts[b]` (the row's committed tokens).

        `chain` is the target's sampler chain for these rows (state up to the committed tokens);
        a drafter that samples forks it and never changes it.
        """

    def observe(self, fed: Sequence[Sequence[int]], logits: Tensor,
                committed: Sequence[tuple[Sequence[int], int]] | None = None) -> None:
        """The target's raw logits of a forward the loop ran: `logits[b, j] (V,)` are the target's
        next-token logits after `fed[b][j]` (and what precedes it: the committed tokens, and for
        a tree draft node j − 1's ancestors), for j < len(fed[b]); positions past it are padding.
        Called after every verification with `fed[b] = [t0] + draft.tokens[b]` — rejected nodes
        included — and `committed[b] = (nodes, x)`: the indices into `draft.tokens[b]` of the path
        row b kept and the token drawn after it (its tokens `fed[b][1 + i]`, drawn from the logits
        at positions 0 and 1 + i); and once after the prefill with the prompt's last token
        (`logits (n, 1, V)`, `committed` None). Read-only: drafters that learn from the target's
        scores (token recycling from every position, STAND from the committed ones); the default
        ignores it."""

    def observe_hidden(self, hidden: Tensor, committed: Sequence[tuple[Sequence[int], int]]) -> None:
        """With `reads_hidden`, after every verification (following `observe`): the target's final
        hidden states `hidden (B, T, H)` at the fed positions of `observe`, and the same
        `committed`. Row b's kept path ends at position `1 + nodes[-1]` (0 when no draft token
        was kept): the state the target drew its next token x from (Medusa heads read it)."""

    def select(self, rows: Sequence[int]) -> None:
        """Row i becomes old row `rows[i]` (finished rows leave the batch)."""

    def finish(self, outputs: Sequence[Sequence[int]]) -> None:
        """The request ended with these generated token ids per row."""


class Verification(ABC):
    """Turns one forward over the drafts into tokens pushed into the rows.

    `verify` leaves the chain advanced by exactly the tokens it pushed, yields the rows' events
    and returns each live row's `(tau, x)`: its draft tokens d_1..d_tau were taken, then x (a
    row that finished took at most these). `spare`: tokens of a row's budget a draft leaves
    free (1 when a token after the draft is always drawn, 0 when drawing stops where the row ends).
    """

    spare: int = 1
    trees: bool = False  # True: verifies tree drafts (returns (tau, x, nodes) per row)

    @abstractmethod
    def verify(self, batch: RowBatch, logits: Tensor, draft: Draft) -> Generator[StreamEvent, None, Outcomes]:
        """`logits (B, 1 + most nodes, V)`: position j of row b follows its t0 and d_1..d_j of a
        chain (a chain rule refuses a tree by name, `Draft.require_chain`); with `trees`, position
        1 + i follows t0 and node i's root-to-node path."""


class DraftSchedule(Protocol):
    """γ per row: `num_draft_tokens` to start, then `next_length` after each step."""

    num_draft_tokens: int

    def next_length(self, gamma: int, proposed: int, accepted: int) -> int: ...
