"""Values of partial solutions: prefix values for search and per-step process rewards.

Two interfaces, one for each way a partial solution is seen:

    PrefixValue.values(prompt_ids, continuations, hidden) -> Values   # token level, batched
    ProcessRewardModel.score_steps(prompt, steps)         -> Values   # text level, per step

Tree search and controlled decoding call a `PrefixValue` on every new node (a batch of token
sequences, with the model's final hidden state at each sequence's last token when the value
reads it). Implementations:
- `HeadValue`: a trained `ValueHead` on that hidden state — no extra forward, 2·H FLOPs (linear).
- `FunctionValue`: any function of the token ids (exact values on toy problems, rule checks).
- `StepRewardValue`: a `ProcessRewardModel` on the decoded steps, aggregated to one number
  ("last", "min" or "prod" of the step scores, as in search-and-learn's PRM aggregation).
- `ScorerValue`: any `Scorer` (a reward model, a judge, a verifier) on the decoded sequences,
  read as whole answers (Transfer Q*'s reward of its rollouts).

`ProcessRewardModel` implementations: `ValueHeadPRM` (the value head read at every step end, one
forward), `ArithmeticStepVerifier` (checks every `a op b = c` a step writes, exactly),
`JudgePRM` in `judge_prm.py` (an LLM asked whether each step is correct), `CheckpointPRM` in
`step_prm.py` (Math-Shepherd / Qwen2.5-Math-PRM checkpoints, several solutions per forward) and
`PoolingPRM` in `remote_prm.py` (such a PRM served by vLLM's pooling API).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from metagen.decoding.cost import Cost, forward_flops
from metagen.scoring.base import Scorer, Scores

AGGREGATES = ("last", "min", "prod", "mean")


@dataclass
class Values:
    """values: one number per sequence (or per step); cost: what computing them spent."""

    values: list[float]
    cost: Cost = field(default_factory=Cost)


class PrefixValue(ABC):
    """V(x, y) of partial sequences, in a batch. `needs_hidden`: pass the final hidden states.
    `reads_text`: the value is a function of the continuations' text (`text_values`), so it
    also runs where token ids are unknown (searches over a remote engine)."""

    needs_hidden: bool = False
    reads_text: bool = False

    def check_model(self, model) -> None:
        """Raise ValueError when the value cannot read `model`'s states (default: any model)."""

    @abstractmethod
    def values(self, prompt_ids: Sequence[int], continuations: Sequence[Sequence[int]],
               hidden: torch.Tensor | None = None) -> Values:
        """Values of prompt + each continuation; hidden: (B, H) at each sequence's last token."""

    def text_values(self, texts: Sequence[str]) -> Values:
        """Values of the prompt + each continuation's text (values with `reads_text` only)."""
        raise NotImplementedError(f"{type(self).__name__} reads token ids, not text")


class HeadValue(PrefixValue):
    """A `ValueHead` read on the model's final hidden state: V = σ(w · h + b) (or its MLP)."""

    needs_hidden = True

    def __init__(self, head) -> None:
        self.head = head

    def check_model(self, model) -> None:
        from metagen.scoring.value_head import model_identity

        expected = model_identity(model)
        for name, value in self.head.identity.items():
            if expected.get(name) != value:
                raise ValueError(f"the value head was trained on {name}={value!r}, "
                                 f"but the model has {name}={expected.get(name)!r}")

    def values(self, prompt_ids, continuations, hidden=None) -> Values:
        if hidden is None or hidden.shape[0] != len(continuations):
            raise ValueError("HeadValue needs hidden states (B, H), one per continuation")
        with torch.no_grad():
            values = self.head(hidden.float()).tolist()
        return Values(values, Cost(flops=float(self.head.flops_per_state) * len(values)))


class FunctionValue(PrefixValue):
    """`function(prompt_ids, continuation_ids) -> float`, called once per sequence (no FLOPs)."""

    def __init__(self, function: Callable[[list[int], list[int]], float]) -> None:
        self.function = function

    def values(self, prompt_ids, continuations, hidden=None) -> Values:
        prompt = list(prompt_ids)
        return Values([float(self.function(prompt, list(c))) for c in continuations])


class ProcessRewardModel(ABC):
    """Per-step scores of a partial solution: `score_steps(prompt, steps) -> Values`, one value
    per step, each judging the solution up to and including that step."""

    @abstractmethod
    def score_steps(self, prompt: str, steps: Sequence[str]) -> Values:
        """Scores of steps[0], steps[:2], ..., steps (the prompt is the question's text)."""

    def score_many(self, prompt: str, solutions: Sequence[Sequence[str]]) -> list[Values]:
        """`score_steps` of each solution; a PRM that scores several in one forward overrides it."""
        return [self.score_steps(prompt, steps) for steps in solutions]

    def close(self) -> None:
        """Release what the PRM holds outside the process (a served one's connections); nothing
        for one that holds nothing."""


def aggregate(scores: Sequence[float], how: str) -> float:
    """One number from per-step scores: last, min, prod or mean (an empty list scores 1)."""
    if how not in AGGREGATES:
        raise ValueError(f"aggregate={how!r} is not known; choose from {', '.join(AGGREGATES)}")
    if not scores:
        return 1.0
    if how == "last":
        return float(scores[-1])
    if how == "min":
        return float(min(scores))
    if how == "prod":
        return float(math.prod(scores))
    return float(sum(scores) / len(scores))


def split_steps(text: str, delimiter: str) -> list[str]:
    """Steps of a solution: pieces ending at each delimiter; empty pieces are dropped."""
    if not delimiter:
        raise ValueError("delimiter is empty: give the text that separates steps, e.g. '\\n'")
    pieces = text.split(delimiter)
    steps = [piece + delimiter for piece in pieces[:-1]] + [pieces[-1]]
    return [step for step in steps if step.strip()]


class StepRewardValue(PrefixValue):
    """A `ProcessRewardModel` as a prefix value: decode, split into steps, aggregate.

    tokenizer: decodes continuations (None: text only, `text_values`); prompt: the question
    text the PRM sees.
    """

    reads_text = True

    def __init__(self, prm: ProcessRewardModel, tokenizer, prompt: str, delimiter: str = "\n",
                 how: str = "last") -> None:
        aggregate([], how)  # validates `how`
        split_steps("", delimiter)  # validates `delimiter`
        self.prm, self.tokenizer, self.prompt = prm, tokenizer, prompt
        self.delimiter, self.how = delimiter, how

    def values(self, prompt_ids, continuations, hidden=None) -> Values:
        if self.tokenizer is None:
            raise ValueError("StepRewardValue has no tokenizer to decode token ids: call text_values")
        return self.text_values([self.tokenizer.decode(list(c), skip_special_tokens=True) for c in continuations])

    def text_values(self, texts: Sequence[str]) -> Values:
        solutions = [split_steps(text, self.delimiter) or [text] for text in texts]  # a blank one is one step
        out, cost = [], Cost()
        for scored in self.prm.score_many(self.prompt, solutions):  # one call: the PRM may batch them
            out.append(aggregate(scored.values, self.how))
            cost += scored.cost
        return Values(out, cost)


class TextValueScorer(Scorer):
    """A value that reads text (`PrefixValue.reads_text`) as a `Scorer` of finished candidates:
    `value.text_values` of their texts, in one call (a PRM may batch them)."""

    name = "text_value"

    def __init__(self, value: PrefixValue) -> None:
        if not value.reads_text:
            raise ValueError(f"{type(value).__name__} does not read text: it cannot score finished answers")
        self.value = value

    def score(self, prompt, candidates) -> Scores:
        found = self.value.text_values([candidate.text for candidate in candidates])
        return Scores(list(found.values), found.cost)


class ScorerValue(PrefixValue):
    """A `Scorer` as a value: each continuation decoded (special tokens skipped) into a
    `Completion` of the prompt, all of them scored in one `scorer(prompt, candidates)` call.

    prompt: the prompt as the scorer reads it (text or chat messages); tokenizer: decodes ids."""

    def __init__(self, scorer, prompt, tokenizer) -> None:
        from metagen.scoring.base import as_scorer

        self.scorer, self.prompt, self.tokenizer = as_scorer(scorer), prompt, tokenizer

    def values(self, prompt_ids, continuations, hidden=None) -> Values:
        from metagen.decoding.result import Completion

        candidates = [Completion(self.tokenizer.decode(list(c), skip_special_tokens=True), list(c))
                      for c in continuations]
        scores = self.scorer(self.prompt, candidates)
        return Values([float(v) for v in scores.values], scores.cost)


class ValueHeadPRM(ProcessRewardModel):
    """Per-step values of a trained `ValueHead`: one forward over prompt + all steps with hidden
    states at every position, read at the last token of each step. O(T) tokens per call."""

    def __init__(self, model, head, chat: bool | None = None) -> None:
        self.model, self.head, self.chat = model, head, chat

    def score_steps(self, prompt: str, steps: Sequence[str]) -> Values:
        from metagen.decoding.prompts import encode_prompt

        prompt_ids = encode_prompt(self.model.tokenizer, prompt, self.chat, vocab_size=self.model.vocab_size)
        if not steps:
            return Values([])
        ends, text = [], ""
        for step in steps:  # token count of each cumulative prefix marks the step's end
            text += step
            ends.append(len(self.model.tokenizer.encode(text, add_special_tokens=False)))
        ids = self.model.tokenizer.encode(text, add_special_tokens=False)
        cache = self.model.new_cache(1)
        with torch.no_grad():
            out = self.model.forward(cache, torch.tensor([prompt_ids + ids]), logits="all", hidden=True)
            hidden = out.hidden[0, len(prompt_ids) - 1:]  # (1 + len(ids), H): state after each token
            values = self.head(hidden[[min(end, len(ids)) for end in ends]].float()).tolist()
        total = len(prompt_ids) + len(ids)
        cost = Cost(model_calls=1, prompt_tokens_computed=total,
                    flops=forward_flops(self.model, 0, total) + self.head.flops_per_state * len(values))
        cost.scorer_flops = cost.flops
        return Values(values, cost)


class ArithmeticStepVerifier(ProcessRewardModel):
    """Checks every equation `expression = number` a step writes with the exact calculator.

    A step scores 1.0 when all its equations hold, 0.0 when one is wrong, and `neutral` when it
    writes none (a sentence without arithmetic). Costs nothing in model FLOPs.
    """

    def __init__(self, neutral: float = 0.5) -> None:
        if not 0.0 <= neutral <= 1.0:
            raise ValueError(f"neutral={neutral} is out of range: must be in [0, 1]")
        self.neutral = neutral

    def score_steps(self, prompt: str, steps: Sequence[str]) -> Values:
        return Values([self.check(step) for step in steps])

    def check(self, step: str) -> float:
        from metagen.scoring.step_equations import find_equations

        verdicts = [holds for _, _, holds in find_equations(step)]
        if not verdicts:
            return self.neutral
        return 1.0 if all(verdicts) else 0.0
