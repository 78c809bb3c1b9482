"""`AnswerLikelihood`: each candidate scored by the model's own log-likelihood of its text as the
reply to the prompt,

    s(x, y) = log p(y | x) = sum_t log p(y_t | x, y_<t)      (y: the text's plain encoding)

whatever prompt actually produced y. Strategies that draw answers under rewritten prompts (in-context
navigation lists earlier answers in the request) use it to rank them under the original question.
A sum favours short answers, as "the most likely answer" does; an empty text scores 0.

Needs the local model (`Generator.local_model()`, the LOCAL_CACHE capability): the prompt is
prefilled once and forked into the B non-empty candidates, whose tokens go in one ragged forward
with logits at every position. Cost: 2 model calls, the prompt's T tokens once (reused B − 1
times) and sum_b |y_b| tokens; memory: the (B, max |y|, V) float32 logits of the second forward
(about 200 KB per token at V = 49152), so it is meant for short answers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from metagen.decoding import capabilities as caps
from metagen.decoding.cost import forward_cost, prefill_cost
from metagen.scoring.base import Scorer, Scores

if TYPE_CHECKING:
    from metagen.decoding.generator import Generator
    from metagen.decoding.prompts import Prompt
    from metagen.decoding.result import Completion


class AnswerLikelihood(Scorer):
    """log p(candidate text | prompt) under `generator`'s local model (see the module)."""

    def __init__(self, generator: Generator) -> None:
        caps.require({caps.LOCAL_CACHE}, generator, "answer likelihood scoring")
        self.local = generator.local_model()

    def score(self, prompt: Prompt, candidates: Sequence[Completion]) -> Scores:
        import torch

        from metagen.decoding.prompts import encode_prompt

        model, chat = self.local.model, self.local.chat
        prompt_ids = encode_prompt(model.tokenizer, prompt, chat, vocab_size=model.vocab_size)
        answers = [model.tokenizer.encode(candidate.text, add_special_tokens=False) for candidate in candidates]
        filled = [b for b, ids in enumerate(answers) if ids]
        values = [0.0] * len(candidates)
        if not filled:
            return Scores(values)
        rows = [answers[b] for b in filled]
        with torch.no_grad():
            cache, first = model.prefill(prompt_ids, len(rows))  # first.logits: (B, V), predicts y_0
            rest = model.forward(cache, rows, logits="all").logits  # (B, max |y|, V): row b's t predicts y_{t+1}
        logits = torch.cat([first.logits[:, None].float(), rest.float()], dim=1)  # (B, 1 + max |y|, V)
        logprobs = torch.log_softmax(logits, dim=-1)
        for row, (b, ids) in enumerate(zip(filled, rows)):
            targets = torch.tensor(ids)  # (|y|,)
            values[b] = float(logprobs[row, torch.arange(len(ids)), targets].double().sum())
        cost = prefill_cost(model, len(prompt_ids), len(rows), produced=False)
        cost += forward_cost(model, [len(prompt_ids)] * len(rows), [len(ids) for ids in rows], produced=False)
        cost.prompt_tokens_computed += sum(len(ids) for ids in rows)
        cost.scorer_flops = cost.flops
        return Scores(values, cost)
