"""Token-level states and greedy rollouts on a local model's cache, for PG-TD (`pg_td.py`).

A state is a prefix's cache snapshot (`cache.snapshot`, a page-table hold: no K/V copy), its
next-token logits (V,) and its `Row` (text, stop strings, max tokens: `decoding.rows`). The cache
has one row; every operation first restores the state it starts from:

    child(s, a):  restore s; push a on a fork of s's row; forward a (skipped when a ended the
                  row): the child's logits; snapshot            — 1 forward
    complete(s):  restore s; repeat argmax, push, forward until the row ends — 1 forward per token

The ranking and the greedy choice read the model's unmodified distribution: p(a | s) is the
softmax of the logits, the greedy token its argmax (top-1 of the same `topk`, so the first child
of a node is the next token of its greedy completion, which the sequence cache relies on).

Cost: the prompt is computed once (`cost.prefill_cost`); each forward is `cost.forward_cost` of
its one row (a target step: every chosen token is fed); each restore counts the state's length
as reused (what recomputing the prefix would cost). Memory: one row plus the snapshots of the
tree's nodes, all released by `close`.
"""

from __future__ import annotations

import time

import torch

from metagen.decoding.cost import Cost, forward_cost, prefill_cost
from metagen.decoding.memory import check_batch_fits
from metagen.decoding.prompts import Prompt, encode_prompt
from metagen.decoding.records import token_records
from metagen.decoding.result import Completion
from metagen.decoding.request import refuse_token_healing
from metagen.decoding.rows import Row
from metagen.decoding.stop_rules import StopRules
from metagen.sampling import SamplingParams


class TokenState:
    """A prefix: its snapshot and logits (None once the row ended: nothing follows), row, length
    (cached tokens: prompt + path)."""

    __slots__ = ("snapshot", "logits", "row", "length")

    def __init__(self, snapshot, logits: torch.Tensor | None, row: Row, length: int) -> None:
        self.snapshot, self.logits, self.row, self.length = snapshot, logits, row, length


class LocalTokenDecoder:
    """`pg_td.TokenDecoder` on `model` (a LanguageModel whose cache has snapshot / restore /
    release) for `prompt`; params: max_tokens, stop strings and stop tokens."""

    def __init__(self, model, prompt: Prompt, params: SamplingParams, *, chat: bool | None = None) -> None:
        refuse_token_healing(params, "pg_td")
        self.model = model
        self.prompt_ids = encode_prompt(model.tokenizer, prompt, chat, vocab_size=model.vocab_size)
        self.rules = StopRules.from_params(params, model, len(self.prompt_ids))
        check_batch_fits(model, 1, self.rules.max_new_tokens)
        start = time.perf_counter()
        self.cache = model.new_cache(1)
        with torch.no_grad():
            out = model.forward(self.cache, torch.tensor([self.prompt_ids]))
        self._snapshots = [self.cache.snapshot(0)]
        self._root = TokenState(self._snapshots[0], out.logits[0], Row(model.tokenizer, self.prompt_ids, self.rules),
                                len(self.prompt_ids))
        self.cost = prefill_cost(model, len(self.prompt_ids), produced=False)
        self.cost.wall_seconds += time.perf_counter() - start

    def root(self) -> TokenState:
        return self._root

    def ended(self, state: TokenState) -> bool:
        return state.row.finished

    def top_tokens(self, state: TokenState, k: int) -> list[tuple[int, float]]:
        """The k most probable next tokens and their p (softmax of the raw logits). O(V)."""
        top = torch.topk(torch.softmax(state.logits.float(), dim=-1), min(k, state.logits.shape[-1]))
        return list(zip(top.indices.tolist(), top.values.tolist()))

    def child(self, state: TokenState, token: int) -> TokenState:
        start = time.perf_counter()
        row = state.row.fork()
        row.push(token, token_records(state.logits[None], torch.tensor([token]))[0])
        if row.finished:  # EOS, a stop string or max tokens: no forward, no snapshot
            child = TokenState(None, None, row, state.length + 1)
        else:
            self.cache.restore([state.snapshot])
            self.cost.prompt_tokens_reused += state.length
            logits = self._forward(token, state.length)
            snapshot = self.cache.snapshot(0)
            self._snapshots.append(snapshot)
            child = TokenState(snapshot, logits, row, state.length + 1)
        self.cost.wall_seconds += time.perf_counter() - start
        return child

    def complete(self, state: TokenState) -> Completion:
        """The greedy completion of `state`: the whole path after the prompt (its own when its
        row ended)."""
        start = time.perf_counter()
        row, logits, length = state.row.fork(), state.logits, state.length
        if not row.finished:
            self.cache.restore([state.snapshot])
            self.cost.prompt_tokens_reused += length
        while not row.finished:
            token = torch.topk(logits, 1).indices  # (1,): the argmax, as top_tokens ranks
            row.push(int(token), token_records(logits[None], token)[0])
            if row.finished:
                break
            logits = self._forward(int(token), length)
            length += 1
        self.cost.wall_seconds += time.perf_counter() - start
        return row.completion

    def _forward(self, token: int, position: int) -> torch.Tensor:
        """Feed `token` at `position` to the cache's row (restored or extended); its logits (V,)."""
        with torch.no_grad():
            out = self.model.forward(self.cache, torch.tensor([[token]]))
        self.cost += forward_cost(self.model, [position])
        self.cost.generated_tokens += 1
        return out.logits[0]

    def close(self) -> None:
        """Release every snapshot (the tree's nodes can no longer be expanded)."""
        for snapshot in self._snapshots:
            self.cache.release(snapshot)
        self._snapshots = []
