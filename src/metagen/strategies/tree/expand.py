"""Search trees over reasoning steps: nodes that keep their cache, and a batched step expander.

A node is a partial solution: the prompt plus the steps on its path. It holds a snapshot of its
cache row (`cache.snapshot`), the next-token logits after its last token, when the value reads
it the final hidden state there, and the state of its row: the per-row bookkeeping (`Row`: text,
stop strings, limits) and a one-row fork of the sampler chain (penalties, n-gram bans, a
constraint follow the path). Expanding nodes never re-prefills a prefix:

    rows  = cache.restore([parent.snapshot] * k for each parent)   # page-table copies only
    chain = SamplerChain.concat([parent.sampler] * k ...)          # the processors' rows likewise
    loop:   token = chain.next_tokens(logits); forward(token) for every open row  # one batched step
            a row whose step ended (delimiter, EOS, max tokens) leaves the batch as a child node,
            with cache.snapshot(b) and chain.fork([b])
    V     = value(children)                                          # one batched call

Every sampled token is fed to the model once (the step's last token too, which gives the child's
logits and hidden state). The rows are the shared machinery: the root is set up by
`RowBatch.start` (stop rules, generator, sampler chain, the prompt's `Row`); an expansion is a
`RowBatch` of the children's rows (`rows=`, each forked from its parent's), checked to fit in
memory first (`check_batch_fits` of the open children, naming n: every search sizes its
expansions by its budget n), and the rows whose step ended leave through `RowBatch.keep` (the
cache, the chain and `active` together) once their node holds a snapshot.

Cost: the prompt is computed once (`cost.prefill_cost`); each decode step is
`cost.forward_cost` of the open rows (one model call, each row's fed token at its position, a
target step per row: every drawn token is fed, so generated_tokens == target_steps and the
prefill counts none); each child counts its parent's length (prompt + path) as reused — what a
naive implementation would recompute.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from metagen.decoding.batch import RowBatch
from metagen.decoding.cost import Cost, forward_cost, prefill_cost
from metagen.decoding.memory import check_batch_fits
from metagen.decoding.prompts import Prompt, encode_prompt
from metagen.decoding.records import token_records
from metagen.decoding.request import refuse_token_healing
from metagen.decoding.rows import Row
from metagen.sampling import LogitsProcessor, SamplerChain, SamplingParams
from metagen.strategies.tree.node import Node, StepConfig


class StepExpander:
    """Owns one cache for a search: prefills the prompt once (the root), expands nodes by steps.

    model: a LanguageModel whose cache has snapshot / restore / release; value: a PrefixValue
    (or None) applied to every new node; params: sampling, stop strings and stop tokens, all
    honoured per path (penalties and n-gram bans see the path's own tokens); processors: extra
    logits processors (constraints) with their state after the prompt, followed per path.
    """

    has_logprobs = True  # every node carries log p of its tokens

    def __init__(self, model, prompt: Prompt, params: SamplingParams, step: StepConfig,
                 value=None, *, chat: bool | None = None, generator: torch.Generator | None = None,
                 processors: Sequence[LogitsProcessor] = ()) -> None:
        self.model, self.params, self.step, self.value = model, params, step, value
        if value is not None:
            value.check_model(model)
        self.prompt_ids = encode_prompt(model.tokenizer, prompt, chat, vocab_size=model.vocab_size)
        if params.n != 1:
            raise ValueError(f"params.n={params.n}: tree search sets its own branching; leave n=1")
        refuse_token_healing(params, "tree search (StepExpander)")
        root = RowBatch.start(model, self.prompt_ids, params, processors, generator=generator)  # the prompt's row
        self.rules, self.generator = root.rules, root.generator
        self.cost = Cost()
        start = time.perf_counter()
        self.cache = model.new_cache(1)
        with torch.no_grad():
            out = model.forward(self.cache, torch.tensor([self.prompt_ids]), hidden=self._needs_hidden)
        length = len(self.prompt_ids)
        self.root = Node(None, [], 0, length, self.cache.snapshot(0), out.logits[0],
                         out.hidden[0] if self._needs_hidden else None, row=root.rows[0], sampler=root.chain)
        self.cost += prefill_cost(model, length, produced=False)  # target steps: the fed tokens
        self.cost.wall_seconds += time.perf_counter() - start
        if value is not None:
            self.score([self.root])

    @property
    def _needs_hidden(self) -> bool:
        return bool(self.value is not None and self.value.needs_hidden)

    def expand(self, parents: list[Node], counts: list[int]) -> list[list[Node]]:
        """Sample `counts[i]` next steps of `parents[i]` (all in one batch); returns the children
        per parent, valued, and appends them to `parent.children`. Finished parents raise."""
        if len(parents) != len(counts) or any(c < 0 for c in counts):
            raise ValueError(f"counts {counts} must be >= 0, one per parent ({len(parents)})")
        for parent in parents:
            if parent.finished:
                raise ValueError("a finished node cannot be expanded")
        start = time.perf_counter()
        origin = [p for p, c in zip(parents, counts) for _ in range(c)]
        produced: list[list[Node]] = [[] for _ in parents]
        owner = [i for i, c in enumerate(counts) for _ in range(c)]
        if not origin:
            return produced
        check_batch_fits(self.model, len(origin), min(self.step.max_step_tokens, self.rules.max_new_tokens))
        self.cache.restore([p.snapshot for p in origin])
        # The open children: each forks its parent's row; the chain and cache rows are the parents'.
        batch = RowBatch(self.model, self.prompt_ids, self.params, self.rules,
                         SamplerChain.concat([p.sampler for p in origin]), self.generator,
                         rows=[p.row.fork() for p in origin], cache=self.cache)
        self.cost.prompt_tokens_reused += sum(p.length for p in origin)
        logits = torch.stack([p.logits for p in origin])  # (B, V)
        step_texts = ["" for _ in origin]
        new_nodes: list[Node] = []
        while True:
            chain, active = batch.chain, batch.active  # active: the child index of each cache row
            processed = chain.process(logits)
            tokens = chain.choose(processed, self.generator)  # (B,)
            chain.accept(tokens)
            records = token_records(logits, tokens, None if chain.greedy else processed)
            with torch.no_grad():
                out = self.model.forward(self.cache, tokens[:, None], hidden=self._needs_hidden)
            self.cost.generated_tokens += len(active)
            keep: list[int] = []
            fed: list[int] = []  # the position of each row's token in this forward
            for b, (child, token) in enumerate(zip(active, tokens.tolist())):
                parent, row = origin[child], batch.rows[child]
                batch.push(b, token, records[b])
                step_texts[child] += row.decoded
                step_length = len(row.completion.token_ids) - len(parent.row.completion.token_ids)
                length = parent.length + step_length
                fed.append(length - 1)
                if not self._step_ends(row, step_texts[child], step_length):
                    keep.append(b)
                    continue
                node = self._child(parent, row, length)
                node.snapshot = self.cache.snapshot(b)
                node.sampler = chain.fork(torch.tensor([b]))
                node.logits = out.logits[b].clone()
                node.hidden = out.hidden[b].clone() if self._needs_hidden else None
                produced[owner[child]].append(node)
                parent.children.append(node)
                new_nodes.append(node)
            self.cost += forward_cost(self.model, fed)
            if not keep:  # every row's step ended (a processor's state has no empty batch)
                break
            logits = out.logits[keep] if len(keep) < len(active) else out.logits
            batch.keep(keep)  # the children made leave: cache, chain and `active` together
        self.cost.wall_seconds += time.perf_counter() - start
        if self.value is not None:
            self.score(new_nodes)
        return produced

    def _step_ends(self, row: Row, step_text: str, step_length: int) -> bool:
        """Does the step end here: the solution ended (stop token, stop string, a processor,
        max tokens), the step's text holds the delimiter, or the step is max_step_tokens long?"""
        delimited = self.step.delimiter is not None and self.step.delimiter in step_text
        return row.finished or delimited or step_length >= self.step.max_step_tokens

    @staticmethod
    def _child(parent: Node, row: Row, length: int) -> Node:
        """The node of the step `row` made after `parent` (its tokens, logprobs, text, finish)."""
        done = len(parent.row.completion.token_ids)
        completion = row.completion
        text = completion.text if row.finished else row.full_text
        return Node(parent, completion.token_ids[done:], parent.depth + 1, length,
                    logprobs=completion.logprobs[done:], finish_reason=completion.finish_reason, text=text, row=row,
                    complete=completion.complete)

    def score(self, nodes: list[Node]) -> None:
        """Set `node.value` for `nodes` with one call of the value; its cost joins `self.cost`."""
        if not nodes:
            return
        start = time.perf_counter()
        hidden = torch.stack([n.hidden for n in nodes]) if self._needs_hidden else None
        values = self.value.values(self.prompt_ids, [n.path_ids() for n in nodes], hidden)
        for node, value in zip(nodes, values.values):
            node.value = float(value)
        values.cost.scorer_flops = values.cost.flops  # everything the value spent is scoring
        values.cost.wall_seconds = time.perf_counter() - start
        self.cost += values.cost

    def release(self, node: Node) -> None:
        """Drop a node's cache snapshot, logits and row state (pruned branches); it can no longer
        expand."""
        if node.snapshot is not None:
            self.cache.release(node.snapshot)
        node.snapshot, node.logits, node.hidden, node.sampler, node.row = None, None, None, None, None
