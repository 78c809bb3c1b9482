"""Medusa-style draft heads (Cai et al. 2024): K heads on the target's own last hidden state.

After verification the target drew its next token x from its final hidden state h_t (H,) at
the kept path's last position (t0 when nothing was kept). Head k reads the same h_t and guesses
the token k positions after x (token t + k + 1; the model's own LM head gives token t + 1 = x):

    y_k      = h_t + M_k h_t                   M_k: (H, H), k = 1..K   (a residual block)
    logits_k = lm_head(y_k)                    the target's LM head, shared (Medusa-1)

Medusa's block is h + SiLU(W h); here it is linear so that it has a closed form: M_k is the ridge
regression of the target's hidden state k positions ahead on h_t, over the model's own sampled
text (self-distillation; `adapter.ridge_residual`, seconds), so lm_head(y_k) approximates the
target's own next-token distribution after x and the k − 1 tokens that follow.

The heads' top-k_d tokens (d = 1..K) form a tree: the Cartesian product of the candidate sets,
each path scored by the sum of its heads' log-probabilities, grown best-first within the node
budget (a node is added only after its parent, so the tree is prefix-closed). Its nodes are
point masses (the candidates are a deterministic function of the committed text), so the
multi-draft rule verifies them losslessly (each candidate accepted with the residual's
probability, then removed from it; greedy: the argmax path). Clover (Xiao et al. 2024) adds
the path's tokens to each head's input; these heads read h_t alone, so every node at depth d
has the same children. Cost per step: one (R·K, H)×(H, H) and (R·K, H)×(H, V) matmul for the R
drafting rows, no draft model; one target forward verifies the tree.
"""

from __future__ import annotations

import heapq
import os
from collections.abc import Sequence

import torch
from torch import Tensor

from metagen.decoding.drafts import Draft, Drafter
from metagen.speculative.adapter import check_identity, load_tensors, model_identity, save_tensors
from metagen.speculative.tree_drafter import check_tree_shape

__all__ = ["DEFAULT_MAX_NODES", "DEFAULT_WIDTHS", "MedusaDrafter", "MedusaHeads", "medusa_tree"]

DEFAULT_WIDTHS = (4, 3, 2)  # candidates of heads 1, 2, 3
DEFAULT_MAX_NODES = 16
_FORMAT = "metagen.medusa_heads/1"


class MedusaHeads:
    """K residual maps y_k = h + M_k h on the target's final hidden state h (..., H) float32.

    tensors: maps (K, H, H); identity: the target's `adapter.model_identity`. Parameters K·H²
    (SmolLM2-135M, K = 3: 995,328)."""

    def __init__(self, num_heads: int, identity: dict) -> None:
        if isinstance(num_heads, bool) or not isinstance(num_heads, int) or num_heads < 1:
            raise ValueError(f"num_heads={num_heads!r} must be an int >= 1")
        hidden = int(identity["hidden_size"])
        self.num_heads, self.identity = num_heads, dict(identity)
        self.maps = torch.zeros(num_heads, hidden, hidden)

    def __call__(self, hidden: Tensor, heads: int | None = None) -> Tensor:
        """hidden (B, H) -> (B, K', H): y_k for the first K' = `heads` heads (default all)."""
        maps = self.maps[: heads or self.num_heads]  # (K', H, H)
        return hidden[:, None, :] + torch.einsum("bh,kgh->bkg", hidden.float(), maps)

    def save(self, path: str | os.PathLike) -> None:
        """One safetensors file: the maps, and the head count and identity as JSON metadata."""
        save_tensors(path, {"maps": self.maps}, {"format": _FORMAT, "num_heads": self.num_heads,
                                                 "identity": self.identity})

    @classmethod
    def load(cls, path: str | os.PathLike, target) -> "MedusaHeads":
        """The heads saved at `path`; ValueError unless they were trained on `target`."""
        meta, tensors = load_tensors(path, _FORMAT, "Medusa heads file", names=("maps",))
        check_identity(meta["identity"], model_identity(target), what="Medusa heads")
        heads = cls(meta["num_heads"], meta["identity"])
        heads.maps = tensors["maps"]
        return heads


def medusa_tree(values: Sequence[Sequence[float]], ids: Sequence[Sequence[int]], max_nodes: int
                ) -> tuple[list[int], list[int]]:
    """The best-first Cartesian tree: `values[d]`, `ids[d]` the candidates' log-probabilities and
    tokens at depth d + 1 (any number each; depth = len(values)). A path's score is the sum of its
    nodes' values; the `max_nodes` highest-scoring paths' nodes are kept, each after its parent.
    Returns (tokens, parents). Time O(N·k·log(N·k)) for N nodes and k candidates per depth."""
    tokens: list[int] = []
    parents: list[int] = []
    heap = [(-float(v), r, -1, 0) for r, v in enumerate(values[0])] if values else []  # (−score, rank, parent, depth)
    heapq.heapify(heap)
    while heap and len(tokens) < max_nodes:
        negative, rank, parent, depth = heapq.heappop(heap)
        node = len(tokens)
        tokens.append(int(ids[depth][rank]))
        parents.append(parent)
        if depth + 1 < len(values):
            for r, v in enumerate(values[depth + 1]):
                heapq.heappush(heap, (negative - float(v), r, node, depth + 1))
    return tokens, parents


class MedusaDrafter(Drafter):
    """Token trees from `MedusaHeads` on the target's hidden state (see the module docstring).

    widths: candidates per head (head d's top widths[d]); the tree is len(widths) deep (at most
    the head count), cut to each row's γ_b. max_nodes: node budget per row and step. A row has
    no hidden state before its first verification (the prefill's is not returned), so its first
    step proposes nothing."""

    name = "medusa"
    proposes_trees = True
    reads_hidden = True

    def __init__(self, target, heads: MedusaHeads, *, widths: Sequence[int] = DEFAULT_WIDTHS,
                 max_nodes: int = DEFAULT_MAX_NODES) -> None:
        widths = check_tree_shape(widths, max_nodes)
        if len(widths) > heads.num_heads:
            raise ValueError(f"widths={widths!r} asks for {len(widths)} depths, the Medusa heads have "
                             f"{heads.num_heads}: give at most {heads.num_heads} widths")
        self.target, self.heads, self.widths, self.max_nodes = target, heads, widths, max_nodes
        self.vocab_size = target.vocab_size
        self.states: list[Tensor | None] = []  # per row: (H,) the target's state after the kept path

    def start(self, prompt_ids: Sequence[int], batch_size: int, target_cache=None) -> None:
        self.states = [None] * batch_size

    def select(self, rows: Sequence[int]) -> None:
        self.states = [self.states[r] for r in rows]

    def observe_hidden(self, hidden: Tensor, committed) -> None:
        for b, (nodes, _) in enumerate(committed):
            self.states[b] = hidden[b, 1 + nodes[-1] if len(nodes) else 0].float()

    def propose(self, contexts, lengths, chain, generator) -> Draft:
        batch = len(contexts)
        if len(self.states) != batch:
            raise RuntimeError(f"medusa drafter has {len(self.states)} rows, got {batch}: call start()/select() first")
        ready = [b for b in range(batch) if self.states[b] is not None and lengths[b] > 0]
        tokens: list[list[int]] = [[] for _ in range(batch)]
        parents: list[list[int]] = [[] for _ in range(batch)]
        if not ready:
            return Draft(tokens, parents, [None] * batch)
        depth = len(self.widths)
        states = self.heads(torch.stack([self.states[b] for b in ready]), depth)  # (R, K', H)
        logprobs = torch.log_softmax(self.target.logits_from_hidden(states), dim=-1)  # (R, K', V)
        top = [logprobs[:, d].topk(width, dim=-1) for d, width in enumerate(self.widths)]  # K' × (R, k_d)
        for i, b in enumerate(ready):
            limit = min(depth, lengths[b])
            values = [top[d].values[i].tolist() for d in range(limit)]
            ids = [top[d].indices[i].tolist() for d in range(limit)]
            tokens[b], parents[b] = medusa_tree(values, ids, self.max_nodes)
        hidden_size, vocab = states.shape[-1], logprobs.shape[-1]
        flops = 2.0 * len(ready) * depth * hidden_size * (hidden_size + vocab)
        return Draft(tokens, parents, [None] * batch, 1, flops)
