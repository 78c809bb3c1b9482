"""STAND: stochastic n-gram drafting from the target's own distributions (Song et al. 2025,
"Accelerated Test-Time Scaling with Model-Free Speculative Sampling").

Test-time scaling samples N answers to one prompt, and those answers repeat each other's
reasoning. STAND keeps one store per request, shared by its N rows, that maps every n-gram
context c (the last k committed tokens, k in [min_ngram, max_ngram]) to the target's
next-token distributions observed after c — not just the token that followed (an n-gram
count), so a draft drawn from the store is a *sample* of what the target would say:

    observe    for every committed token, its position's q = softmax(chain.process(logits))
               (the verification forward's logits, `Drafter.observe`), truncated to its top_k
               tokens, is added to M[c] for each suffix c of the context before it:
                   M[c][t] += q(t)            t in top_k(q)
    draft      s(c) = M[c'] / Σ_t M[c'][t], c' the longest suffix of the context with an entry
    tree       per node n at depth d (breadth first, within `max_nodes`): k_d children drawn
               from s(context + path(n)) without replacement by Gumbel-top-k (k_d capped by the
               tokens covering `coverage` of s: a function of s, not of the draws)
                   keys_t = log s(t) + G_t,  G_t ~ Gumbel(0, 1);  children = top-k_d keys
               (the order of the keys is that of sequential draws without replacement); every
               child carries s as its `probs` row. At temperature 0: the top k_d of s, point masses.

Verification is the multi-draft rule (`tree_verify`): recursive rejection sampling over each
node's children with s as the proposal. s is a function of what was committed before the step
(all rows' past), never of this step's random numbers, so the rule's guarantee holds as for any
proposal: each row's tokens follow the target's law given its own prefix, and rows stay
independent given the past — best-of-N and self-consistency see the same samples' law as with
plain decoding. Greedy trees give plain greedy's tokens.

Memory: O(top_k · (max_ngram − min_ngram + 1)) floats per generated token, for the request.
Time per step: one `process` + `topk` over the committed positions (O(tokens·V)), then
O(nodes · (top_k + V)) to draw the tree and write its dense `(m, V)` proposals.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from metagen.decoding.drafts import Draft, Drafter
from metagen.speculative.tree_drafter import check_tree_shape

__all__ = ["DEFAULT_STAND_NODES", "DEFAULT_STAND_WIDTHS", "NgramDistributions", "StandDrafter"]

DEFAULT_STAND_WIDTHS = (3, 2, 1, 1)  # children per node at depths 1..4: up to 3 + 6 + 6 + 6 nodes
DEFAULT_STAND_NODES = 12


class NgramDistributions:
    """The store: n-gram context -> {token: summed observed probability}.

    `table[c][t]` = Σ q(t) over the observations after context c whose top_k held t (insertion
    order kept). `add` is O(top_k · orders); `lookup` O(orders).
    """

    def __init__(self, min_ngram: int = 1, max_ngram: int = 4, top_k: int = 8) -> None:
        for label, value in (("min_ngram", min_ngram), ("max_ngram", max_ngram), ("top_k", top_k)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{label}={value!r} must be an int >= 1")
        if min_ngram > max_ngram:
            raise ValueError(f"min_ngram={min_ngram} is larger than max_ngram={max_ngram}")
        self.min_ngram, self.max_ngram, self.top_k = min_ngram, max_ngram, top_k
        self.table: dict[tuple[int, ...], dict[int, float]] = {}

    def add(self, context: Sequence[int], tokens: Sequence[int], probs: Sequence[float]) -> None:
        """One observation: after `context`, the target gave `probs[i]` to `tokens[i]` (its top
        tokens); added under every suffix of `context` of min_ngram..max_ngram tokens."""
        for k in range(self.min_ngram, min(self.max_ngram, len(context)) + 1):
            entry = self.table.setdefault(tuple(context[len(context) - k:]), {})
            for token, p in zip(tokens, probs):
                if p > 0.0:
                    entry[token] = entry.get(token, 0.0) + p

    def lookup(self, context: Sequence[int]) -> dict[int, float] | None:
        """The entry of the longest suffix of `context` (max_ngram down to min_ngram) that has one."""
        for k in range(min(self.max_ngram, len(context)), self.min_ngram - 1, -1):
            entry = self.table.get(tuple(context[len(context) - k:]))
            if entry:
                return entry
        return None


class StandDrafter(Drafter):
    """Model-free token trees drawn from the target's stored distributions (module docstring).

    widths: children per node at each depth (ints >= 1), cut to the row's draft length γ_b;
    max_nodes: node budget per row and step; min_ngram / max_ngram: context lengths of the
    store; top_k: tokens kept of each observed distribution; coverage: a node gets at most as
    many children as the most likely tokens of s covering this share of its mass need (confident
    contexts spend one node, not k_d). The store lives for one request
    (`start` empties it) and all its rows read and feed it.
    """

    name = "stand"
    proposes_trees = True

    def __init__(self, widths: Sequence[int] = DEFAULT_STAND_WIDTHS, max_nodes: int = DEFAULT_STAND_NODES, *,
                 min_ngram: int = 1, max_ngram: int = 4, top_k: int = 8, coverage: float = 0.9) -> None:
        widths = check_tree_shape(widths, max_nodes)
        if not 0.0 < coverage <= 1.0:
            raise ValueError(f"coverage={coverage!r} is out of range: must be in (0, 1]")
        self.widths, self.max_nodes, self.coverage = widths, max_nodes, coverage
        self.store = NgramDistributions(min_ngram, max_ngram, top_k)
        self._tails: list[list[int]] = []  # per row of the last propose: its context's last max_ngram tokens
        self._chain = None  # the sampler chain of the last propose (processes observed logits)
        self._vocab: int | None = None

    def start(self, prompt_ids: Sequence[int], batch_size: int, target_cache=None) -> None:
        store = self.store
        self.store = NgramDistributions(store.min_ngram, store.max_ngram, store.top_k)
        self._tails, self._chain, self._vocab = [], None, None

    def propose(self, contexts, lengths, chain, generator) -> Draft:
        self._chain = chain
        self._tails = [list(context[-self.store.max_ngram:]) for context in contexts]
        tokens: list[list[int]] = [[] for _ in contexts]
        parents: list[list[int]] = [[] for _ in contexts]
        probs: list[Tensor | None] = [None] * len(contexts)
        if self._vocab is None:  # nothing observed yet
            return Draft(tokens, parents, probs)
        for b, (tail, length) in enumerate(zip(self._tails, lengths)):
            rows = self._grow(tail, length, tokens[b], parents[b], chain.greedy, generator)
            if rows:
                probs[b] = torch.stack(rows)  # (m_b, V)
        return Draft(tokens, parents, probs)

    def _grow(self, tail: list[int], length: int, tokens: list[int], parents: list[int], greedy: bool,
              generator: torch.Generator | None) -> list[Tensor]:
        """Fill one row's tree breadth first; returns its nodes' proposals (empty when greedy)."""
        rows: list[Tensor] = []
        frontier = [(-1, tail)]  # (node, the last max_ngram tokens of its context)
        for width in self.widths[:length]:
            grown = []
            for node, context in frontier:
                room = self.max_nodes - len(tokens)
                entry = self.store.lookup(context) if room > 0 else None
                if entry is None:
                    continue
                chosen, proposal = self._children(entry, min(width, room), greedy, generator)
                for token in chosen:
                    parents.append(node)
                    tokens.append(token)
                    if proposal is not None:
                        rows.append(proposal)
                    grown.append((len(tokens) - 1, (context + [token])[-self.store.max_ngram:]))
            frontier = grown
            if not frontier:
                break
        return rows

    def _children(self, entry: dict[int, float], count: int, greedy: bool,
                  generator: torch.Generator | None) -> tuple[list[int], Tensor | None]:
        """Up to `count` distinct tokens from s = entry / Σ entry: the top ones when greedy (no
        proposal), else Gumbel-top-k (draws without replacement, in draw order) and s as a dense
        `(V,)` float32 proposal."""
        candidates = torch.tensor(list(entry), dtype=torch.long)
        mass = torch.tensor(list(entry.values()), dtype=torch.float64)
        # as many children as the most likely tokens covering `coverage` of s need: a function
        # of s alone, never of the draws, so the draws stay without replacement from s
        covered = mass.sort(descending=True).values.cumsum(0) >= self.coverage * float(mass.sum()) - 1e-12
        count = min(count, int(covered.int().argmax()) + 1)
        if greedy:
            return candidates[mass.topk(count).indices].tolist(), None
        uniform = torch.rand(len(entry), generator=generator, dtype=torch.float64)
        keys = mass.log() - (-uniform.clamp(min=1e-300).log()).log()  # log s(t) + Gumbel(0, 1), up to a constant
        chosen = candidates[keys.topk(count).indices].tolist()
        proposal = torch.zeros(self._vocab)
        proposal[candidates] = (mass / mass.sum()).float()
        return chosen, proposal

    def observe(self, fed, logits, committed=None) -> None:
        """Each committed token's position (`Drafter.observe`: the kept path, then the drawn token)
        adds its processed distribution's top_k to the store under the n-gram contexts before it.
        The call after the prefill (`committed` None) adds nothing: the first token is observed
        with the step that follows."""
        if not committed:
            return
        rows = list(range(len(committed)))
        tokens = [[fed[b][1 + i] for i in nodes] + [token] for b, (nodes, token) in enumerate(committed)]
        logits = [logits[b, [0] + [1 + i for i in nodes]] for b, (nodes, _) in enumerate(committed)]  # (1 + τ, V)
        stacked = torch.cat(list(logits))  # (Σ (1 + τ_b), V)
        self._vocab = stacked.shape[-1]
        top_probs, top_tokens = self._distributions(stacked).topk(min(self.store.top_k, self._vocab), dim=-1)
        top_probs, top_tokens = top_probs.tolist(), top_tokens.tolist()
        position = 0
        for row, committed in zip(rows, tokens):
            context = list(self._tails[row])
            for token in committed:
                self.store.add(context, top_tokens[position], top_probs[position])
                context.append(token)
                position += 1

    def _distributions(self, logits: Tensor) -> Tensor:
        """q per position `(P, V)`: the chain's processing when it holds no state (temperature,
        truncations), else softmax(logits / temperature) — the proposal's closeness to q only
        moves the acceptance, never the law."""
        chain = self._chain
        if chain is not None and not chain.stateful:
            return torch.softmax(chain.process(logits), dim=-1)
        params = chain.params if chain is not None else None
        temperature = params.temperature if params is not None and params.temperature > 0 else 1.0
        return torch.softmax(logits.float() / temperature, dim=-1)
