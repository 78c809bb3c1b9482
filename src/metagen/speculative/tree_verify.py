r"""Tree verification: each row's draft tree checked against one target forward over the whole
tree (SpecInfer, Miao et al. 2024; recursive rejection sampling, Jeon et al. 2024).

The loop feeds each row's last committed token t0 and then its m draft nodes, with t0 the root
of the tree (`Draft.parents` shifted by one) and ancestor-only attention (`models/token_tree.py`),
so `logits (B, 1 + m, V)` hold at position 0 the target's logits after t0 and at position 1 + i
those after node i's root-to-node path. q(n) is their softmax after the sampler chain with its
state advanced by n's path (node −1 is t0, position 0). Per row, starting at n = −1:

    greedy (temperature 0)  follow the first child of n whose token is argmax q(n), while one is;
                            x = argmax q(end). The emitted path is the longest one whose every
                            token is the target's argmax, so the output is plain greedy's.
    sampling                with r = q(n) and n's children c_1..c_k tried in order, accept c_j
                            (token x_j) with prob min(1, r(x_j) / p_j(x_j)); on rejection
                                r ← norm(max(0, r − p_j))
                                p_{j+1} = norm(p_j with x_j removed)   (siblings drawn without
                                                                        replacement from p_1)
                                p_{j+1} = p_j                          (siblings drawn i.i.d.,
                                                                        `Draft.iid_siblings`)
                            an accepted child becomes n; when all are rejected, or n has none,
                            x ~ r. A deterministic draft (probs None) makes each child its own
                            point mass: accepted with prob r(x_j), then r ← norm(r without x_j).

The step at one node is `TreeVerification.select`, here `multi_draft.recursive_rejection` (a
maximal coupling at each try; `spectr.SpecTrVerification` puts SpecTr's k-sequential selection
there), so the token leaving n follows q(n) exactly; the subtree under an accepted child was drafted from
that child's path alone, so by induction over depth the emitted sequence follows plain
sampling from q. A node whose token the chain removed (q = 0) is never accepted and its subtree
is not processed.

The chain's state per node comes from forks (`SamplerChain.fork`, the committed state is never
advanced by a draft token): per depth ℓ, one fork row per live node at depth ℓ, advanced by its
ℓ path tokens, processes that node's position. Afterwards the chain accepts the kept path and x
token by token — the calls plain decoding makes for those tokens — so penalties, n-gram bans and
constraints stand where they would after plain decoding, and the stop verdicts are read after
each. A stateless chain processes every position in one call.
Cost: O(B·(1 + m)·V) for the chain and the rules; with state, one `process` per depth and
O(depth²·m) accepts.
"""

from __future__ import annotations

from collections.abc import Generator

import torch
from torch import Tensor

from metagen.decoding.batch import RowBatch
from metagen.decoding.drafts import Draft, Outcomes, Verification
from metagen.decoding.result import StreamEvent
from metagen.sampling import SamplerChain
from metagen.speculative.multi_draft import recursive_rejection
from metagen.speculative.rule_verification import emit_row
from metagen.speculative.verify import sample_residual

__all__ = ["TreeVerification", "process_tree"]


class TreeVerification(Verification):
    """Greedy tree verification at temperature 0, recursive rejection sampling over each node's
    children otherwise (module docstring). Returns per row `(tau, x, nodes)`: the kept path's
    node indices `nodes` (tau of them), then x."""

    spare = 1  # a token after the kept path is always drawn
    trees = True
    name = "multi-draft"

    def verify(self, batch: RowBatch, logits: Tensor, draft: Draft) -> Generator[StreamEvent, None, Outcomes]:
        chain, params, generator = batch.chain, batch.params, batch.generator
        processed, alive = process_tree(chain, logits, draft)
        outcomes = []
        for b in range(len(draft.tokens)):
            children = _children(draft.parents[b])
            if params.greedy:
                nodes, token = _greedy_path(draft.tokens[b], children, processed[b], alive[b])
            else:
                nodes, token = self._sample_path(draft, b, children, processed[b], generator)
            outcomes.append((len(nodes), token, nodes))
        verdicts = _advance(chain, draft, outcomes)
        for b, (_, token, nodes) in enumerate(outcomes):
            positions = torch.tensor([0] + [1 + i for i in nodes])
            tokens = [draft.tokens[b][i] for i in nodes] + [token]
            yield from emit_row(batch, b, tokens, logits[b, positions], processed[b, positions], verdicts[b])
        return outcomes

    def _sample_path(self, draft: Draft, b: int, children: list[list[int]], processed: Tensor,
                     generator: torch.Generator | None) -> tuple[list[int], int]:
        """Recursive rejection sampling down row b's tree; `processed (1 + m, V)`."""
        tokens, probs, node, nodes = draft.tokens[b], draft.probs[b], -1, []
        while True:
            q = torch.softmax(processed[node + 1].double(), dim=-1)  # (V,) q(n)
            kids = children[node + 1]
            if not kids:  # a leaf (or an empty draft): the bonus token from q(n)
                return nodes, int(sample_residual(q[None], q[None], generator)[0])
            proposal = None if probs is None else probs[kids[0]]
            if proposal is not None and any(not torch.equal(probs[c], proposal) for c in kids[1:]):
                raise RuntimeError(f"row {b}: the children of node {node} carry different draft distributions; "
                                   "siblings must be drawn from their parent's one distribution")
            u = torch.rand(len(kids), generator=generator, dtype=torch.float64)
            j, residual = self.select(q, proposal, [tokens[c] for c in kids], u, draft.iid_siblings)
            if j < 0:  # every child rejected: the correction from the residual
                return nodes, int(sample_residual(residual[None], q[None], generator)[0])
            node = kids[j]
            nodes.append(node)


    def select(self, q: Tensor, proposal: Tensor | None, candidates: list[int], u: Tensor,
               iid: bool) -> tuple[int, Tensor]:
        """The rule at one node: `(j, residual)` as `multi_draft.recursive_rejection`, the
        children's tokens `candidates` drawn from `proposal (V,)` i.i.d. when `iid`, else
        without replacement; q: (V,) the target's distribution there; u: (k,) uniforms."""
        return recursive_rejection(q, proposal, candidates, u, without_replacement=not iid)


def _children(parents: list[int]) -> list[list[int]]:
    """children[n + 1]: the nodes whose parent is n (n = −1 the root), in node order. O(m)."""
    children: list[list[int]] = [[] for _ in range(len(parents) + 1)]
    for i, parent in enumerate(parents):
        children[parent + 1].append(i)
    return children


def _greedy_path(tokens: list[int], children: list[list[int]], processed: Tensor,
                 alive: list[bool]) -> tuple[list[int], int]:
    """The path whose every token is the target's argmax, and the argmax after it. O(depth·V)."""
    node, nodes = -1, []
    while True:
        best = int(processed[node + 1].argmax())
        following = next((c for c in children[node + 1] if alive[c] and tokens[c] == best), None)
        if following is None:
            return nodes, best
        node = following
        nodes.append(node)


def process_tree(chain: SamplerChain, logits: Tensor, draft: Draft) -> tuple[Tensor, list[list[bool]]]:
    """The chain applied at every position of `logits (B, 1 + m, V)`, the position of node i
    seeing the chain advanced by node i's path (forks; `chain` itself is not advanced).

    Returns `(processed (B, 1 + m, V), alive)`: `alive[b][i]` is False when a token on node i's
    path was removed by the chain at its parent (q = 0 there: no rule accepts it, and the node's
    position is left 0, unread). Padding positions of shorter rows are left as they come out.
    """
    rows, length, vocab = logits.shape
    if not chain.stateful:
        processed = chain.process(logits.reshape(rows * length, vocab)).view(rows, length, vocab)
        return processed, [_alive(draft, b, processed[b], range(len(t))) for b, t in enumerate(draft.tokens)]
    processed = torch.zeros(rows, length, vocab)
    processed[:, 0] = chain.process(logits[:, 0])
    depths = [_depths(parents) for parents in draft.parents]
    alive = [[False] * len(tokens) for tokens in draft.tokens]
    deepest = max((max(d, default=0) for d in depths), default=0)
    for level in range(1, deepest + 1):
        pairs = []
        for b, row_depths in enumerate(depths):
            level_nodes = [i for i, depth in enumerate(row_depths) if depth == level]
            for i, keep in zip(level_nodes, _alive(draft, b, processed[b], level_nodes, alive[b])):
                alive[b][i] = keep
                if keep:
                    pairs.append((b, i))
        if not pairs:
            break
        fork = chain.fork(torch.tensor([b for b, _ in pairs]))
        paths = [_path_tokens(draft, b, i) for b, i in pairs]  # each `level` tokens long
        for t in range(level):
            fork.accept(torch.tensor([path[t] for path in paths]))
        row_index = torch.tensor([b for b, _ in pairs])
        position = torch.tensor([1 + i for _, i in pairs])
        processed[row_index, position] = fork.process(logits[row_index, position])
    return processed, alive


def _alive(draft: Draft, b: int, processed: Tensor, nodes, known: list[bool] | None = None) -> list[bool]:
    """For `nodes` of row b (parents first): whether the node's parent is alive and its token
    survived the chain at the parent's position (`processed (1 + m, V)`)."""
    tokens, parents = draft.tokens[b], draft.parents[b]
    status = list(known) if known is not None else [False] * len(tokens)
    result = []
    for i in nodes:
        parent = parents[i]
        ok = (parent < 0 or status[parent]) and float(processed[parent + 1, tokens[i]]) > float("-inf")
        status[i] = ok
        result.append(ok)
    return result


def _depths(parents: list[int]) -> list[int]:
    """Depth of every node (1 for a child of the root), parents first. O(m)."""
    depths: list[int] = []
    for parent in parents:
        depths.append(1 if parent < 0 else depths[parent] + 1)
    return depths


def _path_tokens(draft: Draft, b: int, node: int) -> list[int]:
    """The tokens from the root to `node`, inclusive."""
    tokens, parents, path = draft.tokens[b], draft.parents[b], []
    while node != -1:
        path.append(tokens[node])
        node = parents[node]
    return path[::-1]


def _advance(chain: SamplerChain, draft: Draft, outcomes) -> list[list | None]:
    """Accept each row's kept path then its x into `chain`, one column per call (negative: no
    token); per row the stop verdicts after each accepted token, or None when no processor
    judges stops."""
    columns = [[draft.tokens[b][i] for i in nodes] + [token] for b, (_, token, nodes) in enumerate(outcomes)]
    verdicts = [[] for _ in columns]
    for t in range(max((len(c) for c in columns), default=0)):
        column = [c[t] if t < len(c) else -1 for c in columns]
        chain.accept(torch.tensor(column, dtype=torch.long))
        if chain.judges_stop:
            for b, token in enumerate(column):
                if token >= 0:
                    verdicts[b].append(chain.stop_verdict(b))
    return verdicts if chain.judges_stop else [None] * len(columns)
