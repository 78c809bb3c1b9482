"""Drafters: cheap proposals of the next γ tokens that the target model then verifies.

A drafter sees each row's committed tokens (prompt + generated, the last one not yet run through
the target) and proposes up to γ_b tokens per row together with the distributions they were
drawn from (after the same sampler chain as the target, so the verification rules compare like
with like). Deterministic drafters (n-gram lookup, greedy drafts) return point masses. The
protocol (`Draft`, `Drafter`) sits with the speculative loop in `metagen.decoding.drafts`:

    drafter.start(prompt_ids, batch_size)            # once per request
    draft = drafter.propose(contexts, lengths, chain, generator)
    drafter.select(rows)                             # rows leaving / reordering the batch
    drafter.finish(outputs)                          # end of the request

`ModelDrafter` drafts with any `LanguageModel` over the same vocabulary: a smaller model, the
target's own first layers (`self_draft.early_exit_model`) or a lower-precision copy of the target
(`self_draft.quantized_model`); `ngram.NgramDrafter` needs no model. The model drafter's cache
follows the committed tokens: before drafting it rolls each row back to the longest prefix the
target confirmed and runs the rest (usually the correction token, plus the last draft token when
all were accepted) in one ragged forward.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from metagen.decoding.cost import forward_flops
from metagen.decoding.drafts import Draft, Drafter
from metagen.models.base import PagedCache
from metagen.speculative.stop_head import stops

__all__ = ["Draft", "Drafter", "ModelDrafter"]  # the protocol lives with the loop (decoding.drafts)


class ModelDrafter(Drafter):
    """Drafts by sampling from a `LanguageModel` with the target's vocabulary.

    confidence: adaptive draft length — a row stops drafting after a token whose draft
        probability (after the sampler chain) is below this value; None drafts the full γ_b.
    stop_head: adaptive draft length learned (SpecDec++, `stop_head.StopHead`): a row stops
        after the token where 1 − Π(1 − r_i) > `stop_threshold`, r_i the head's predicted
        rejection probability of its i-th token; the draft forwards then also return hidden
        states. Exclusive with `confidence`.
    share_prompt_cache: copy the prompt's keys and values from the target's cache instead of
        prefilling the prompt again. Exact for an early-exit draft (its layers are the target's
        first layers); for a quantized copy the draft then reads the target's slightly different
        prompt keys and values, which changes only the draft, never the output distribution.
        Needs a target cache with the draft's layout (KVCache, at least as many layers); a
        `start` given no target cache (the serving engine's request copies: its shared cache
        holds every request) prefills the prompt instead.
    """

    def __init__(self, model, *, confidence: float | None = None, name: str = "model",
                 share_prompt_cache: bool = False, stop_head=None, stop_threshold: float = 0.5) -> None:
        if confidence is not None and not 0.0 <= confidence <= 1.0:
            raise ValueError(f"confidence={confidence!r} is out of range: must be in [0, 1] or None")
        if not 0.0 < stop_threshold < 1.0:
            raise ValueError(f"stop_threshold={stop_threshold!r} is out of range: must be in (0, 1)")
        if stop_head is not None and confidence is not None:
            raise ValueError(f"confidence={confidence!r} and a stop head are two stopping rules: give one")
        self.model = model
        self.confidence = confidence
        self.stop_head, self.stop_threshold = stop_head, stop_threshold
        self.name = name
        self.share_prompt_cache = share_prompt_cache
        self.vocab_size = model.vocab_size
        self.cache = None
        self._cached: list[list[int]] = []  # token ids held by each cache row
        self._committed: list[int] = []  # each row's committed length at its last proposal

    def start(self, prompt_ids: Sequence[int], batch_size: int, target_cache=None) -> None:
        # The prompt (all but its last token, which the first proposal runs) is cached once.
        self.cache = self.model.new_cache(1)
        head = list(prompt_ids[:-1])
        if self.share_prompt_cache and target_cache is not None:
            self._copy_prompt(target_cache, len(head))
            self.prefill_flops = 0.0
        else:
            self.prefill_flops = forward_flops(self.model, 0, len(head))
            if head:
                self.model.forward(self.cache, [head], logits="none")
        self.cache.select([0] * batch_size)
        self._cached = [list(head) for _ in range(batch_size)]
        self._committed = [len(head)] * batch_size

    @property
    def draft_models(self) -> tuple:
        return (self.model,)

    def _copy_prompt(self, target_cache, length: int) -> None:
        """Fill row 0 with the first `length` keys and values of the target's row 0 (both caches
        `PagedCache`s of one class)."""
        if not isinstance(self.cache, PagedCache) or type(target_cache) is not type(self.cache):
            raise ValueError(f"share_prompt_cache needs the target's cache and the {self.name} draft's to be one kind "
                             f"of PagedCache (a KVCache), got {type(target_cache).__name__} and "
                             f"{type(self.cache).__name__}")
        try:
            self.cache.copy_prefix(target_cache, 0, length, 0)
        except ValueError as error:
            raise ValueError(f"share_prompt_cache needs the target's KVCache with the {self.name} draft's layout "
                             f"(at least {self.cache.num_layers} layers, same KV heads, head size and dtype): "
                             f"{error}") from None

    def select(self, rows: Sequence[int]) -> None:
        self.cache.select(list(rows))
        self._cached = [list(self._cached[r]) for r in rows]
        self._committed = [self._committed[r] for r in rows]

    def propose(self, contexts, lengths, chain, generator) -> Draft:
        batch = len(contexts)
        if self.cache is None or self.cache.batch_size != batch:
            rows = 0 if self.cache is None else self.cache.batch_size
            raise RuntimeError(f"{self.name} drafter has {rows} rows, got {batch}: call start()/select() first")
        longest = max(lengths, default=0)
        if longest == 0:
            return Draft.chain([[] for _ in range(batch)])
        reads_hidden = self.stop_head is not None
        out, flops = self._catch_up(contexts, hidden=reads_hidden)
        calls = 1
        probe = chain.fork(torch.arange(batch))
        tokens: list[list[int]] = [[] for _ in range(batch)]
        probs: list[list[Tensor]] = [[] for _ in range(batch)]
        drafting = [n > 0 for n in lengths]
        greedy = chain.greedy
        survival = torch.ones(batch)  # Π(1 − r_i) per row (stop head)
        for step in range(longest):
            processed = probe.process(out.logits)
            chosen = probe.choose(processed, generator)
            probe.accept(chosen)
            wants_distribution = not greedy or self.confidence is not None
            distribution = torch.softmax(processed, dim=-1) if wants_distribution else None
            chosen_list = chosen.tolist()
            if reads_hidden:  # SpecDec++: stop once P(some token so far is rejected) > threshold
                rejects = self.stop_head.reject_probability(out.hidden, out.logits, chosen)  # (B,)
                survival, stop = stops(survival, rejects, self.stop_threshold)
                stop_list = stop.tolist()
            for b in range(batch):
                if not drafting[b]:
                    continue
                tokens[b].append(chosen_list[b])
                if not greedy:
                    probs[b].append(distribution[b])
                confident = self.confidence is None or (
                    distribution is None or float(distribution[b, chosen_list[b]]) >= self.confidence)
                if len(tokens[b]) >= lengths[b] or not confident or (reads_hidden and stop_list[b]):
                    drafting[b] = False
            if not any(drafting):
                break
            # rows that stopped keep stepping (one batched forward); their extra tokens are dropped
            out = self.model.forward(self.cache, chosen[:, None], hidden=reads_hidden)
            calls += 1
            for b in range(batch):
                flops += forward_flops(self.model, len(self._cached[b]), 1)
                self._cached[b].append(chosen_list[b])
        stacked = [torch.stack(rows) if rows else None for rows in probs]
        if greedy:
            stacked = [None] * batch
        return Draft.chain(tokens, stacked, calls, flops)

    def _catch_up(self, contexts, hidden: bool = False) -> tuple:
        """Run what each cache row lacks of its context (at least its last token) in one ragged
        forward; `(out, flops)`, `out.logits (B, V)` the next-token logits after each context
        (and `out.hidden (B, H)` the states they were read from, when `hidden`)."""
        feed, flops = [], 0.0
        for b, context in enumerate(contexts):
            keep = self._confirmed_length(b, context)
            self.cache.truncate(b, keep)
            del self._cached[b][keep:]
            new = list(context[keep:])
            feed.append(new)
            self._cached[b].extend(new)
            self._committed[b] = len(context)
            flops += forward_flops(self.model, keep, len(new))
        return self.model.forward(self.cache, feed, hidden=hidden), flops

    def _confirmed_length(self, row: int, context: Sequence[int]) -> int:
        """Longest prefix of the cached row equal to `context`, minus one token if it covers all
        of `context` (the last committed token is always run, to get its logits)."""
        cached = self._cached[row]
        keep = min(self._committed[row], len(cached))  # committed tokens never change
        limit = min(len(cached), len(context) - 1)
        while keep < limit and cached[keep] == context[keep]:
            keep += 1
        return min(keep, len(context) - 1)
