"""Self-refine (Madaan et al. 2023): the model critiques and revises its own answer.

    y_0 ~ p(· | x)
    for t = 0 .. R − 1:
        f_t ~ p(· | critique(x, y_t))         stop if the stop phrase occurs in f_t
        y_{t+1} ~ p(· | revise(x, y_t, f_t))
    return y_last, or argmax_t s(x, y_t) when a scorer is given

Intrinsic refinement: no information from outside the model enters the loop, so it
helps only as far as the model can judge its own answers (Huang et al. 2024 find it often cannot
on math). Critique and revision prompts are chat messages (one user turn built from a template),
so any chat model or remote server can run them. Each revision sees the current answer and its
critique only, not the whole history. Cost: at most 1 + 2R `generate` calls of one sample each,
plus one scorer call over all versions.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from metagen.decoding import capabilities as caps
from metagen.decoding.cost import Cost
from metagen.decoding.result import GenerationResult, prefer_complete
from metagen.sampling import SamplingParams
from metagen.scoring.base import Scorer, as_scorer
from metagen.strategies import runners
from metagen.strategies.options import check_options, configure, option
from metagen.strategies.spec import StrategySpec, register
from metagen.strategies.templates import check_template

if TYPE_CHECKING:
    import torch

    from metagen.decoding.generator import Generator
    from metagen.decoding.prompts import Prompt

CRITIQUE_TEMPLATE = (
    "Question:\n{question}\n\n"
    "Proposed answer:\n{answer}\n\n"
    "Check the proposed answer step by step and point out every error in it. Do not write a "
    "corrected answer. If it has no errors, reply with exactly: {stop_phrase}"
)
REVISION_TEMPLATE = (
    "Question:\n{question}\n\n"
    "Previous answer:\n{answer}\n\n"
    "Feedback on the previous answer:\n{critique}\n\n"
    "Write an improved answer to the question that fixes the problems the feedback names. "
    "Reply with the complete new answer only."
)
DEFAULT_PARAMS = SamplingParams(temperature=0.7, max_tokens=256)


@dataclass(frozen=True)
class SelfRefineConfig:
    """The options are declared with their fields. draft_params / critique_params /
    revision_params: sampling of each step (`n` is set to 1). The templates are str.format
    templates with plain field names only (`templates.check_template`); the stop phrase is a
    case-sensitive substring of the critique."""

    rounds: int = option(3, int, "critique-and-revise rounds at most (0: the draft)", low=0, sizes_work=True)
    draft_params: SamplingParams = DEFAULT_PARAMS
    critique_params: SamplingParams = DEFAULT_PARAMS
    revision_params: SamplingParams = DEFAULT_PARAMS
    critique_template: str = option(CRITIQUE_TEMPLATE, str, "the critique request: {question}, {answer} (required) "
                                    "and {stop_phrase}")
    revision_template: str = option(REVISION_TEMPLATE, str, "the revision request: {question}, {answer} and "
                                    "{critique} (the last two required)")
    stop_phrase: str = option("NO ERRORS", str, "refinement ends when the critique contains it")

    def __post_init__(self) -> None:
        check_options(self)
        for name in ("draft_params", "critique_params", "revision_params"):
            check_params(name, getattr(self, name))
        check_template("critique_template", self.critique_template, {"answer"}, {"question", "answer", "stop_phrase"})
        check_template("revision_template", self.revision_template, {"answer", "critique"},
                       {"question", "answer", "critique"})
        if not isinstance(self.stop_phrase, str) or not self.stop_phrase.strip():
            raise ValueError(f"stop_phrase={self.stop_phrase!r} is out of range: must be a non-blank string")


@dataclass
class SelfRefineResult(GenerationResult):
    """candidates: the draft and every revision, in order; critiques[i]: the critique of
    candidates[i] (the last version has none unless it was accepted); rounds: revisions made;
    stopped: the last critique contained the stop phrase."""

    critiques: list[str] = field(default_factory=list)
    rounds: int = 0
    stopped: bool = False


def self_refine(
    generator: Generator,
    prompt: Prompt,
    config: SelfRefineConfig | None = None,
    scorer: Scorer | None = None,
    *,
    rng: torch.Generator | None = None,
) -> SelfRefineResult:
    """Draft, then critique and revise until the critique accepts the answer or `config.rounds`
    revisions are made. Returns the last version, or with a `scorer` the highest-scoring of all
    versions (the later one among ties: refinement is meant to improve); versions cut before
    their constraint accepted them are passed over while a complete one exists."""
    config = config or SelfRefineConfig()
    caps.require_constraint([config.draft_params, config.critique_params, config.revision_params], generator,
                            "self_refine with structured_outputs")
    context, question = split_question(prompt)
    cost = Cost()
    draft = generator.generate(prompt, replace(config.draft_params, n=1), generator=rng)
    cost += draft.cost
    versions = list(draft.completions)
    critiques: list[str] = []
    stopped = False
    for _ in range(config.rounds):
        answer = versions[-1].text
        critique_prompt = chat_prompt(context, config.critique_template, question=question, answer=answer,
                                      stop_phrase=config.stop_phrase)
        critique = generator.generate(critique_prompt, replace(config.critique_params, n=1), generator=rng)
        cost += critique.cost
        critiques.append(critique.completions[0].text)
        if config.stop_phrase in critiques[-1]:
            stopped = True
            break
        revision_prompt = chat_prompt(context, config.revision_template, question=question, answer=answer,
                                      critique=critiques[-1])
        revision = generator.generate(revision_prompt, replace(config.revision_params, n=1), generator=rng)
        cost += revision.cost
        versions.append(revision.completions[0])
    eligible = prefer_complete(versions)  # a version cut before its constraint accepted is never chosen
    chosen = eligible[-1]
    if scorer is not None:
        scores = as_scorer(scorer)(prompt, versions)
        cost += scores.cost
        for version, value in zip(versions, scores.values):
            version.score = value
        chosen = max(reversed(eligible), key=lambda c: c.score)  # max keeps the first: the latest
    return SelfRefineResult(versions, cost=cost, chosen=chosen, critiques=critiques, rounds=len(versions) - 1,
                            stopped=stopped)


# Shared by the refinement strategies (verifier_refine imports them).

def split_question(prompt: Prompt) -> tuple[list[dict[str, str]], str]:
    """(context, question) of a prompt. Text is the question itself; for chat messages the
    question is the last user turn and the messages before it (system prompt, earlier turns)
    are the context. Token ids carry no text to rewrite: ValueError."""
    if isinstance(prompt, str):
        return [], prompt
    messages = list(prompt)
    if messages and all(isinstance(m, Mapping) for m in messages):
        users = [i for i, m in enumerate(messages) if m.get("role") == "user"]
        if users:
            return [dict(m) for m in messages[: users[-1]]], str(messages[users[-1]].get("content", ""))
    raise ValueError(
        "refinement writes the question into new chat messages: the prompt must be text or chat "
        "messages with a user turn, not token ids"
    )


def chat_prompt(context: list[dict[str, str]], template: str, **fields: str) -> list[dict[str, str]]:
    """The context messages followed by one user turn: `template` filled with `fields`."""
    return [*context, {"role": "user", "content": template.format(**fields)}]


def check_params(name: str, value: object) -> None:
    if not isinstance(value, SamplingParams):
        raise ValueError(f"{name}={value!r} is not a SamplingParams")


def _runner(generator, prompt, n, params, options, rng, overrides):
    # The answers (draft, revisions) keep the request's constraint; a critique is free text.
    critique = replace(params, structured_outputs=None)
    config = SelfRefineConfig(rounds=n - 1, draft_params=params, critique_params=critique, revision_params=params)
    return runners.with_answers(self_refine(generator, prompt, configure(config, overrides), rng=rng), options)

register(StrategySpec("self_refine", "draft + (n - 1) critique/revision rounds", _runner, extracts=True,
                      pooled=False, budget="rounds", config=SelfRefineConfig,
                      set_by_run=frozenset({"rounds", "draft_params", "critique_params", "revision_params"})),
         __name__)
