"""In-context navigation: search the answer space by asking again with the answers already
explored in the context, each time for a different one.

    y_1 ~ p(· | x)
    for k = 2 .. K:
        y_k ~ p(· | template(x, [a(y_1), ..., a(y_{k−1})]))     "answers already proposed: ... give a
                                                                 different answer"
        stop early if a(y_k) repeats an explored answer (or is empty)
    return select(y_1 .. y_k)

I.i.d. samples of p(· | x) keep returning its modes (at temperature 0, one answer K times); each
round here conditions on what was found, so the model is pushed away from it and reaches answers
that sampling the same prompt rarely or never does. It is a search over answers carried out in the
model's context rather than by a search algorithm. No published prompt format is followed: the
request (`TEMPLATE`, an option) states the question, lists the explored answers one per line and
asks for one that is not among them.

a(y): what is explored and compared (`explore`): the reply's text, or the answer extracted from it
(pattern / answer_field, for replies that reason before answering). Two answers are the same when
equal after case folding, whitespace collapsing and dropping trailing punctuation (`answer_key`).

The choice (`selection`): "first" (round 1, the model's own first answer: ICN then adds coverage,
the candidates, without changing the pick), "last" (the last new answer), "likelihood" (the highest
log p(y | x) of a reply under the original prompt, `scoring.likelihood.AnswerLikelihood`: local
model), or
"scorer" (the highest score of a `Scorer` or `Verifier` given to `in_context_navigation`).

Extractive QA (`passage`): every round's reply is constrained to a span of the passage
(`sampling.span.SpanProcessor`), decoded on the local model. Capabilities: any generator for
"first" / "last" / "scorer"; the local model (LOCAL_CACHE) for "likelihood" or a passage, refused by
name before any request. Cost: at most K generate calls of one reply each (round k's prompt lists
k − 1 answers), plus the scorer's call over the distinct answers.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from metagen.decoding import capabilities as caps
from metagen.decoding.cost import Cost
from metagen.decoding.result import GenerationResult, prefer_complete
from metagen.sampling import SamplingParams
from metagen.scoring.answers import check_answer_field, extract_answer
from metagen.scoring.base import Scorer, as_scorer
from metagen.strategies import runners
from metagen.strategies.options import check_options, configure, option
from metagen.strategies.self_refine import chat_prompt, split_question
from metagen.strategies.spec import StrategySpec, register, shared
from metagen.strategies.templates import check_template

if TYPE_CHECKING:
    import torch

    from metagen.decoding.generator import Generator
    from metagen.decoding.prompts import Prompt
    from metagen.decoding.result import Completion

TEMPLATE = (
    "{question}\n\n"
    "Answers already proposed:\n{explored}\n\n"
    "Give a different answer, one that is not in the list above. Reply with the answer only."
)
SELECTIONS = ("first", "last", "likelihood", "scorer")
LOCAL = frozenset({caps.LOCAL_CACHE})  # what selection="likelihood" and a passage need
EXPLORE = ("text", "answer")


@dataclass(frozen=True)
class InContextNavigationConfig:
    """The options are declared with their fields; params: how each reply is decoded (its n is
    set to 1); pattern / answer_field: how an answer is extracted with explore="answer"."""

    rounds: int = option(4, int, "replies asked for at most (round 1: the prompt as given)", low=1, sizes_work=True)
    params: SamplingParams = SamplingParams(temperature=0.0, max_tokens=64)
    request_template: str = option(TEMPLATE, str, "a later round's request: {question} and {explored} (the explored "
                           "answers, one '- answer' line each), both required")
    stop_on_repeat: bool = option(True, bool, "stop when a reply repeats an explored answer (or is empty)")
    explore: str = option("text", str, "what is listed and compared: the reply's text, or the answer extracted "
                          "from it (pattern / answer_field)", choices=EXPLORE)
    selection: str = option("first", str, "the answer returned: first (round 1), last (the last new one), "
                            "likelihood (max log p(reply | prompt); local model), scorer (library call with a "
                            "scorer)", choices=SELECTIONS)
    passage: str | None = option(None, str, "extractive QA: every reply is a span of this text (local model)",
                                 optional=True)
    pattern: str | None = shared("pattern")
    answer_field: str | None = shared("answer_field")

    def __post_init__(self) -> None:
        check_options(self)
        check_answer_field(self.pattern, self.answer_field)
        if not isinstance(self.params, SamplingParams):
            raise ValueError(f"params={self.params!r} is not a SamplingParams")
        check_template("request_template", self.request_template, {"question", "explored"}, {"question", "explored"})
        if self.passage is not None and not self.passage:
            raise ValueError("passage='' is out of range: must be a non-empty str or None")
        if self.passage is not None and self.params.structured_outputs is not None:
            raise ValueError("passage and params.structured_outputs are two constraints on one reply: give one")


@dataclass
class NavigationResult(GenerationResult):
    """completions: every round's reply, in order (the candidates); explored: the distinct
    non-empty answers listed to the model, in order; repeated: the search stopped because a reply
    repeated an explored answer (or was empty)."""

    explored: list[str] = field(default_factory=list)
    repeated: bool = False


def answer_key(answer: str) -> str:
    """What two answers are compared by: case folded, whitespace collapsed, trailing
    punctuation and spaces dropped ("Paris." and " paris" are one answer)."""
    return " ".join(answer.split()).casefold().rstrip(" .,;:!?")


def listing(explored: list[str]) -> str:
    """The {explored} field: one "- answer" line per answer, its whitespace collapsed."""
    return "\n".join("- " + " ".join(answer.split()) for answer in explored)


def in_context_navigation(
    generator: Generator,
    prompt: Prompt,
    config: InContextNavigationConfig | None = None,
    scorer: Scorer | None = None,
    *,
    rng: torch.Generator | None = None,
) -> NavigationResult:
    """Ask `config.rounds` times at most, each later round listing the answers explored so far
    (see the module); the chosen reply by `config.selection` among the complete ones
    (`prefer_complete`). ValueError before any request when the generator lacks what the options
    need, or a scorer comes without selection="scorer" or the other way round."""
    config = config or InContextNavigationConfig()
    what = "in_context_navigation"
    if config.selection == "scorer" and scorer is None:
        raise ValueError("selection='scorer' needs a scorer: pass scorer= to in_context_navigation, or choose "
                         f"one of {', '.join(s for s in SELECTIONS if s != 'scorer')}")
    if scorer is not None and config.selection != "scorer":
        raise ValueError(f"a scorer is read by selection='scorer' only; selection is {config.selection!r}")
    if config.selection == "likelihood":
        caps.require({caps.LOCAL_CACHE}, generator, f"{what} with selection='likelihood'")
    if config.passage is not None:
        caps.require({caps.LOCAL_CACHE}, generator, f"{what} with a passage (span-constrained replies)")
    caps.require_constraint(config.params, generator, f"{what} with structured_outputs")
    context, question = split_question(prompt)
    ask = _asker(generator, config, rng)
    params = replace(config.params, n=1)
    replies: list[Completion] = []
    explored: list[str] = []
    seen: set[str] = set()
    cost, repeated = Cost(), False
    for round_index in range(config.rounds):
        request = prompt if round_index == 0 else chat_prompt(context, config.request_template, question=question,
                                                              explored=listing(explored))
        result = ask(request, params)
        cost += result.cost
        reply = result.completions[0]
        replies.append(reply)
        answer = _explored_answer(reply.text, config)
        key = answer_key(answer)
        if key and key not in seen:
            seen.add(key)
            explored.append(answer.strip())
        elif config.stop_on_repeat:
            repeated = True
            break
    chosen, cost = _select(generator, prompt, replies, config, scorer, cost)
    return NavigationResult(replies, cost=cost, chosen=chosen, explored=explored, repeated=repeated)


def _explored_answer(text: str, config: InContextNavigationConfig) -> str:
    if config.explore == "text":
        return text
    return extract_answer(text, config.pattern, config.answer_field) or ""


def _asker(generator, config: InContextNavigationConfig, rng):
    """request, params -> GenerationResult: the generator's `generate`, or with a passage the
    local model's sampling loop with a span constraint (one index, forked for every call)."""
    if config.passage is None:
        return lambda request, params: generator.generate(request, params, generator=rng)
    from metagen.decoding.sample_loop import generate
    from metagen.sampling.span import SpanProcessor

    local = generator.local_model()
    processor = SpanProcessor(config.passage, local.model.tokenizer,
                              stop_token_ids=config.params.stop_token_ids)
    return lambda request, params: generate(local.model, request, params, chat=local.chat, generator=rng,
                                            processors=[processor])


def _select(generator, prompt, replies, config: InContextNavigationConfig, scorer, cost: Cost):
    """(the chosen reply, the cost with the scorer's): among complete replies with a new,
    non-empty answer (any complete reply when none has one; any reply when none is complete)."""
    keys = [answer_key(_explored_answer(reply.text, config)) for reply in replies]
    first_of = {}
    for index, key in enumerate(keys):
        first_of.setdefault(key, index)
    distinct = [replies[index] for key, index in first_of.items() if key]
    eligible = prefer_complete(distinct or replies)
    if config.selection == "first":
        return eligible[0], cost
    if config.selection == "last":
        return eligible[-1], cost
    if config.selection == "likelihood":
        from metagen.scoring.likelihood import AnswerLikelihood

        scorer = AnswerLikelihood(generator)
    scores = as_scorer(scorer)(prompt, distinct)
    for reply, value in zip(distinct, scores.values):
        reply.score = value
    for reply, key in zip(replies, keys):  # a repeat shares its answer's score
        if key and reply.score is None:
            reply.score = replies[first_of[key]].score
    scored = [reply for reply in eligible if reply.score is not None]
    return (max(scored, key=lambda reply: reply.score) if scored else eligible[0]), cost + scores.cost


def _runner(generator, prompt, n, params, options, rng, overrides):
    config = InContextNavigationConfig(rounds=n, params=params, pattern=options.pattern,
                                       answer_field=options.answer_field)
    return runners.with_answers(in_context_navigation(generator, prompt, configure(config, overrides), rng=rng),
                                options)

register(StrategySpec("in_context_navigation", "n rounds, each asking for an answer not among those already "
                      "proposed (listed in the prompt); stops at a repeat", _runner, pooled=False, budget="rounds",
                      config=InContextNavigationConfig,
                      set_by_run=frozenset({"rounds", "params"}),
                      option_needs=(("selection", ("likelihood",), LOCAL), ("passage", None, LOCAL))), __name__)
