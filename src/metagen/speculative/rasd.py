"""RASD, retrieval-augmented speculative decoding (Quan et al. 2025): draft trees retrieved from a
datastore by longest suffix match, optionally fused with a draft model's tree.

Per step and row, with context c (prompt + committed tokens):

    datastore     three suffix arrays (`suffix_array`): the corpus (a text file tokenized once
                  with the target's tokenizer), the outputs of earlier requests, and c itself
    match         L* = the longest suffix of c (at most `max_match` tokens) occurring with a
                  follower in any of them; every store reaching L* gives up to `continuations`
                  runs of up to γ_b tokens after its occurrences
    retrieval     the trie of those runs (`token_trie.continuation_tree`: the most frequent
                  prefixes within `max_nodes`)
    fusion        with a model drafter (`TreeDrafter`), its tree and the retrieval tree merged
                  on shared prefixes, the retrieval tree first, within `max_nodes`
                  (`token_trie.fuse_trees`)

The drafts are point masses (probs None, the model's tokens included): the multi-draft rule
accepts each child with probability r(x), which keeps the target's law whatever proposed the
tokens, and verifies greedily at temperature 0. Cost per step: the row's suffix array is
rebuilt, O(n log² n) for n context tokens; corpus and history queries O(q log n log q);
earlier outputs' array rebuilt at the end of each request (`finish`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from metagen.decoding.drafts import Draft, Drafter
from metagen.speculative.suffix_array import SEPARATOR, SuffixArray
from metagen.speculative.token_trie import continuation_tree, fuse_trees

__all__ = ["DEFAULT_MAX_NODES", "RasdDrafter", "load_corpus"]

DEFAULT_MAX_NODES = 24


def load_corpus(path: str | Path, tokenizer) -> list[int]:
    """The token ids of the text file at `path` (UTF-8), each blank-line-separated document
    encoded without special tokens, documents joined by `SEPARATOR`. FileNotFoundError /
    ValueError name the path."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"draft_corpus={str(path)!r} is not a file")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"draft_corpus={str(path)!r} is not UTF-8 text: {error}") from None
    ids: list[int] = []
    for document in (part for part in text.split("\n\n") if part.strip()):
        ids.extend(tokenizer.encode(document, add_special_tokens=False))
        ids.append(SEPARATOR)
    return ids


class RasdDrafter(Drafter):
    """Retrieval trees from a corpus, earlier outputs and the context, fused with an optional
    model tree (module docstring).

    corpus: token ids (documents separated by `SEPARATOR`), or None. model: a tree drafter
    whose tree is fused in, or None (model-free). max_nodes: node budget per row and step.
    continuations: runs retrieved per store. max_match: longest suffix looked up.
    remember_outputs: outputs of finished requests join the datastore (at most `memory_size`
    tokens, oldest dropped).
    """

    name = "rasd"
    proposes_trees = True

    def __init__(self, corpus: Sequence[int] | None = None, *, model: Drafter | None = None,
                 max_nodes: int = DEFAULT_MAX_NODES, continuations: int = 8, max_match: int = 16,
                 remember_outputs: bool = True, memory_size: int = 200_000) -> None:
        for label, value in (("max_nodes", max_nodes), ("continuations", continuations),
                             ("max_match", max_match), ("memory_size", memory_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{label}={value!r} must be an int >= 1")
        self.corpus = SuffixArray(corpus) if corpus else None
        self.model = model
        if model is not None:
            self.name, self.vocab_size = f"rasd+{model.name}", model.vocab_size
        self.max_nodes, self.continuations, self.max_match = max_nodes, continuations, max_match
        self.remember_outputs, self.memory_size = remember_outputs, memory_size
        self.history_tokens: list[int] = []
        self.history: SuffixArray | None = None

    @property
    def prefill_flops(self) -> float:  # the model drafter's prompt, when there is one
        return 0.0 if self.model is None else self.model.prefill_flops

    @property
    def draft_models(self) -> tuple:
        return () if self.model is None else self.model.draft_models

    def for_request(self) -> RasdDrafter:
        """A copy reading the same stores, with a copy of the model drafter of its own."""
        copy = super().for_request()
        if self.model is not None:
            copy.model = self.model.for_request()
        return copy

    def start(self, prompt_ids: Sequence[int], batch_size: int, target_cache=None) -> None:
        if self.model is not None:
            self.model.start(prompt_ids, batch_size, target_cache)

    def select(self, rows: Sequence[int]) -> None:
        if self.model is not None:
            self.model.select(rows)

    def finish(self, outputs: Sequence[Sequence[int]]) -> None:
        if self.model is not None:
            self.model.finish(outputs)
        if not self.remember_outputs:
            return
        for output in outputs:
            if output:
                self.history_tokens += [*output, SEPARATOR]
        if len(self.history_tokens) > self.memory_size:  # drop whole oldest documents
            cut = len(self.history_tokens) - self.memory_size
            while cut < len(self.history_tokens) and self.history_tokens[cut - 1] != SEPARATOR:
                cut += 1
            self.history_tokens = self.history_tokens[cut:]
        self.history = SuffixArray(self.history_tokens) if self.history_tokens else None

    def retrieve(self, context: Sequence[int], length: int) -> list[list[int]]:
        """Runs of up to `length` tokens following the longest suffix of `context` found in the
        corpus, the earlier outputs or `context` itself (every store reaching the longest)."""
        found: list[tuple[int, list[list[int]]]] = []
        for store in (self.corpus, self.history, SuffixArray(context)):
            if store is not None:
                found.append(store.continuations(context, self.continuations, length, self.max_match))
        longest = max((size for size, _ in found), default=0)
        return [run for size, runs in found if size == longest > 0 for run in runs]

    def propose(self, contexts, lengths, chain, generator) -> Draft:
        model = self.model.propose(contexts, lengths, chain, generator) if self.model is not None else None
        tokens, parents = [], []
        for b, (context, length) in enumerate(zip(contexts, lengths)):
            tree = continuation_tree(self.retrieve(context, length), self.max_nodes) if length > 0 else ([], [])
            if model is not None:
                tree = fuse_trees([tree, (model.tokens[b], model.parents[b])], self.max_nodes)
            tokens.append(tree[0])
            parents.append(tree[1])
        calls, flops = (0, 0.0) if model is None else (model.calls, model.flops)
        return Draft(tokens, parents, [None] * len(tokens), calls, flops)
