"""Search trees over reasoning steps: nodes that keep their cache, and a batched step expander.

A node is a partial solution: the prompt plus the steps on its path. It holds a snapshot of its
cache row (`cache.snapshot`), the next-token logits after its last token and, when the value
reads it, the final hidden state there. Expanding nodes never re-prefills a prefix:

    rows  = cache.restore([parent.snapshot] * k for each parent)   # page-table copies only
    loop:   token = chain(logits); forward(token) for every open row  # one batched step
            a row whose step ended (delimiter, EOS, max tokens) leaves the batch as a child node
    V     = value(children)                                          # one batched call

Every sampled token is fed to the model once (the step's last token too, which gives the child's
logits and hidden state). Cost: the prompt is computed once; each child counts its parent's
length (prompt + path) as reused — what a naive implementation would recompute.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from metagen.decoding.cost import Cost, forward_flops
from metagen.decoding.prompts import Prompt, encode_prompt, stop_token_set
from metagen.sampling import SamplerChain, SamplingParams


@dataclass(frozen=True)
class StepConfig:
    """delimiter: text that ends a step (a step ends with the first token whose text contains
    it); None: steps are blocks of exactly max_step_tokens tokens (blockwise control);
    max_step_tokens: a step longer than this ends there (it stays expandable); the solution
    ends at EOS / a stop token, a stop string, or params.max_tokens in total."""

    delimiter: str | None = "\n"
    max_step_tokens: int = 64

    def __post_init__(self) -> None:
        if self.delimiter == "":
            raise ValueError("delimiter is empty: give the text that ends a step, e.g. '\\n'")
        if self.max_step_tokens < 1:
            raise ValueError(f"max_step_tokens={self.max_step_tokens} is out of range: must be >= 1")


@dataclass(eq=False)
class Node:
    """A partial solution. token_ids: this step's tokens (None: unknown, a remote engine that
    returns no ids); finish_reason: None while the solution
    can go on, else "stop" (EOS, stop token or stop string) or "length"; value: V of the path;
    logprob: Σ log p(token) of this step under the unmodified model."""

    parent: Node | None = field(repr=False)
    token_ids: list[int] | None
    depth: int
    length: int  # cached tokens: prompt + path
    snapshot: object = field(default=None, repr=False)
    logits: torch.Tensor | None = field(default=None, repr=False)  # (V,) next-token logits after it
    hidden: torch.Tensor | None = field(default=None, repr=False)  # (H,) final hidden state there
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str | None = None
    value: float | None = None
    text: str = ""  # the whole path's text (stop strings cut off)
    children: list[Node] = field(default_factory=list, repr=False)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def path(self) -> list[Node]:
        """Nodes from the first step down to this one (the root excluded)."""
        nodes, node = [], self
        while node.parent is not None:
            nodes.append(node)
            node = node.parent
        return nodes[::-1]

    def path_ids(self) -> list[int] | None:
        """The path's token ids, None when a step's ids are unknown."""
        path = self.path()
        if any(node.token_ids is None for node in path):
            return None
        return [token for node in path for token in node.token_ids]

    def path_logprobs(self) -> list[float]:
        return [lp for node in self.path() for lp in node.logprobs]


class StepExpander:
    """Owns one cache for a search: prefills the prompt once (the root), expands nodes by steps.

    model: a LanguageModel whose cache has snapshot / restore / release; value: a PrefixValue
    (or None) applied to every new node; params: stateless sampling (temperature, top-k/p,
    min-p, typical, epsilon, eta, logit bias; stop strings and stop tokens honoured).
    """

    has_logprobs = True  # every node carries log p of its tokens

    def __init__(self, model, prompt: Prompt, params: SamplingParams, step: StepConfig,
                 value=None, *, chat: bool | None = None, generator: torch.Generator | None = None) -> None:
        self.model, self.params, self.step, self.value = model, params, step, value
        if value is not None:
            value.check_model(model)
        self.prompt_ids = encode_prompt(model.tokenizer, prompt, chat, vocab_size=model.vocab_size)
        self.chain = SamplerChain.from_params(params, 1, model.vocab_size, self.prompt_ids)
        if self.chain.stateful:
            raise ValueError("tree search needs stateless sampling: repetition / frequency / presence penalties, "
                             "no_repeat_ngram_size and mirostat keep per-path state and are not supported")
        if params.n != 1:
            raise ValueError(f"params.n={params.n}: tree search sets its own branching; leave n=1")
        self.generator = generator if generator is not None else params.make_generator()
        self.stop_ids = stop_token_set(params, model)
        self.max_length = min(len(self.prompt_ids) + params.max_tokens, model.max_context)
        if len(self.prompt_ids) >= self.max_length:
            raise ValueError(f"prompt has {len(self.prompt_ids)} tokens, the model's context is "
                             f"{model.max_context}: no room to generate")
        self.cost = Cost()
        start = time.perf_counter()
        self.cache = model.new_cache(1)
        with torch.no_grad():
            out = model.forward(self.cache, torch.tensor([self.prompt_ids]), hidden=self._needs_hidden)
        length = len(self.prompt_ids)
        self.root = Node(None, [], 0, length, self.cache.snapshot(0), out.logits[0],
                         out.hidden[0] if self._needs_hidden else None)
        self.cost += Cost(model_calls=1, prompt_tokens_computed=length, flops=forward_flops(model, 0, length),
                          wall_seconds=time.perf_counter() - start)
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
        self.cache.restore([p.snapshot for p in origin])
        self.cost.prompt_tokens_reused += sum(p.length for p in origin)
        logits = torch.stack([p.logits for p in origin])  # (B, V)
        steps: list[list[int]] = [[] for _ in origin]
        logprobs: list[list[float]] = [[] for _ in origin]
        active = list(range(len(origin)))  # child index of each cache row
        new_nodes: list[Node] = []
        while active:
            tokens = self.chain.choose(self.chain.process(logits), self.generator)  # (B,)
            chosen = torch.log_softmax(logits, dim=-1).gather(1, tokens[:, None]).squeeze(1).tolist()
            with torch.no_grad():
                out = self.model.forward(self.cache, tokens[:, None], hidden=self._needs_hidden)
            self.cost.model_calls += 1
            self.cost.generated_tokens += len(active)
            self.cost.target_steps += len(active)
            keep: list[int] = []
            for b, (child, token) in enumerate(zip(active, tokens.tolist())):
                parent = origin[child]
                steps[child].append(token)
                logprobs[child].append(chosen[b])
                length = parent.length + len(steps[child])
                self.cost.flops += forward_flops(self.model, length - 1, 1)
                node = self._finish(parent, steps[child], length, token)
                if node is None:
                    keep.append(b)
                    continue
                node.logprobs = logprobs[child]
                node.snapshot = self.cache.snapshot(b)
                node.logits = out.logits[b].clone()
                node.hidden = out.hidden[b].clone() if self._needs_hidden else None
                produced[owner[child]].append(node)
                parent.children.append(node)
                new_nodes.append(node)
            if len(keep) < len(active):
                self.cache.select(keep)
                active = [active[b] for b in keep]
                logits = out.logits[keep]
            else:
                logits = out.logits
        self.cost.wall_seconds += time.perf_counter() - start
        if self.value is not None:
            self.score(new_nodes)
        return produced

    def _finish(self, parent: Node, step: list[int], length: int, token: int) -> Node | None:
        """The child node when `step` (ending with `token`) ends a step, else None."""
        tokenizer = self.model.tokenizer
        text = tokenizer.decode(step, skip_special_tokens=True)
        reason = None
        if token in self.stop_ids:
            reason = "stop"
        elif length >= self.max_length:
            reason = "length"
        full = parent.text + text
        for stop in self.params.stop:
            at = full.find(stop, max(len(parent.text) - len(stop) + 1, 0))
            if at >= 0:
                full, reason = full[:at], "stop"
        delimited = self.step.delimiter is not None and self.step.delimiter in text
        if reason is None and not delimited and len(step) < self.step.max_step_tokens:
            return None
        return Node(parent, list(step), parent.depth + 1, length, finish_reason=reason, text=full)

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
        """Drop a node's cache snapshot and logits (pruned branches); it can no longer expand."""
        if node.snapshot is not None:
            self.cache.release(node.snapshot)
        node.snapshot, node.logits, node.hidden = None, None, None
