"""Refinement with verifier feedback (extrinsic refinement; Iterative Agent Decoding,
Chakraborty et al. 2025).

    Y_0 = {y_1 .. y_k} ~ p(· | x)                                     round 0
    B_t = the best b of Y_0 ∪ .. ∪ Y_t by (passed, v(y), s(y), newer first)
    Y_{t+1} = ∪_{y ∈ B_t} {y'_1 .. y'_m} ~ p(· | revise(x, y, feedback(y)))
    stop at the first batch holding a passing candidate, or after R rounds

v is the verifier's score, feedback its text (failing tests, a wrong answer), s an optional
scorer that breaks ties in v (e.g. mean logprob). A revision displaces its parent from the beam
only when it ranks higher; the newer wins full ties, so with a pass/fail verifier and no scorer
the rounds form a chain, each revising the last attempt. Feedback from outside the model is what makes
refinement work where self-critique does not: it adds information the model lacks, and can
detect and localize errors. Each revision prompt is one user turn: the question, the previous attempt
and its feedback. Cost: at most 1 + R·b `generate` calls (k + R·b·m samples), as many
verifications, and one scorer call per batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from metagen.decoding import capabilities as caps
from metagen.decoding.cost import Cost
from metagen.decoding.result import Completion, GenerationResult, prefer_complete
from metagen.sampling import SamplingParams
from metagen.scoring.base import Scorer, Verdict, Verifier, as_scorer, prompt_text
from metagen.strategies import runners
from metagen.strategies.options import check_options, configure, option
from metagen.strategies.self_refine import chat_prompt, check_params, split_question
from metagen.strategies.spec import StrategySpec, register
from metagen.strategies.templates import check_template

if TYPE_CHECKING:
    import torch

    from metagen.decoding.generator import Generator
    from metagen.decoding.prompts import Prompt

REVISION_TEMPLATE = (
    "Question:\n{question}\n\n"
    "Previous attempt:\n{answer}\n\n"
    "A checker rejected this attempt with the following feedback:\n{feedback}\n\n"
    "Write a corrected, complete answer to the question."
)
NO_FEEDBACK = "The attempt did not pass the check."


@dataclass(frozen=True)
class VerifierRefineConfig:
    """k, R, m, b of the module's formula and the revision template, declared with their fields;
    params: sampling of every call (its `n` is overridden)."""

    initial_candidates: int = option(4, int, "k, samples of round 0", low=1, sizes_work=True)
    rounds: int = option(3, int, "revision rounds at most (the budget R)", low=0, sizes_work=True)
    revisions_per_round: int = option(4, int, "m, samples drawn for each revised candidate", low=1, sizes_work=True)
    beam: int = option(1, int, "b, candidates revised per round (the best so far)", low=1, sizes_work=True)
    params: SamplingParams = SamplingParams(temperature=0.8, max_tokens=256)
    revision_template: str = option(REVISION_TEMPLATE, str, "the revision request: {question}, {answer} and "
                                    "{feedback} (the last two required)")

    def __post_init__(self) -> None:
        check_options(self)
        check_params("params", self.params)
        check_template("revision_template", self.revision_template, {"answer", "feedback"},
                       {"question", "answer", "feedback"})


@dataclass
class VerifierRefineResult(GenerationResult):
    """candidates: everything generated, in order, each with its verifier score; verdicts[i]:
    the verdict on candidates[i]; parents[i]: the index of the candidate it revises (None in
    round 0); tiebreak_scores[i]: the scorer's value (empty without a scorer); rounds: revision
    rounds run; passed: the chosen candidate passed the verifier."""

    verdicts: list[Verdict] = field(default_factory=list)
    parents: list[int | None] = field(default_factory=list)
    tiebreak_scores: list[float] = field(default_factory=list)
    rounds: int = 0
    passed: bool = False


def verifier_refine(
    generator: Generator,
    prompt: Prompt,
    verifier: Verifier,
    config: VerifierRefineConfig | None = None,
    scorer: Scorer | None = None,
    *,
    rng: torch.Generator | None = None,
) -> VerifierRefineResult:
    """Sample, verify, and revise the best failing candidates with the verifier's feedback until
    one passes or the round budget ends. Returns the best passing candidate, else the best of all.
    The verifier and scorer always see the original prompt."""
    config = config or VerifierRefineConfig()
    caps.require_constraint(config.params, generator, "verifier_refine with structured_outputs")
    context, question = split_question(prompt)
    tiebreaker = as_scorer(scorer) if scorer is not None else None
    result = VerifierRefineResult([], cost=Cost())  # filled in below; chosen set last

    def rank(i: int) -> tuple:
        tiebreak = result.tiebreak_scores[i] if tiebreaker is not None else 0.0
        return result.verdicts[i].passed, result.verdicts[i].score, tiebreak, i  # i: newer first

    first = generator.generate(prompt, replace(config.params, n=config.initial_candidates), generator=rng)
    passed = _assess(result, first.completions, first.cost, None, prompt, verifier, tiebreaker)
    while not passed and result.rounds < config.rounds:
        result.rounds += 1
        beam = sorted(range(len(result.completions)), key=rank, reverse=True)[: config.beam]
        for parent in beam:
            revision_prompt = chat_prompt(context, config.revision_template, question=question,
                                          answer=result.completions[parent].text,
                                          feedback=result.verdicts[parent].feedback or NO_FEEDBACK)
            revisions = generator.generate(revision_prompt, replace(config.params, n=config.revisions_per_round),
                                           generator=rng)
            passed = _assess(result, revisions.completions, revisions.cost, parent, prompt, verifier, tiebreaker)
            if passed:
                break
    eligible = {id(c) for c in prefer_complete(result.completions)}  # never a cut output over a complete one
    best = max((i for i, c in enumerate(result.completions) if id(c) in eligible), key=rank)
    result.chosen, result.passed = result.completions[best], result.verdicts[best].passed
    return result


def _assess(result: VerifierRefineResult, batch: list[Completion], generation_cost: Cost, parent: int | None,
            prompt: Prompt, verifier: Verifier, tiebreaker: Scorer | None) -> bool:
    """Verify (and score) one batch, append it to `result` with its costs; True if one passed."""
    verdicts = verifier.verify_all(prompt, batch)
    if len(verdicts) != len(batch):
        raise ValueError(f"verifier {verifier.name!r} returned {len(verdicts)} verdicts for {len(batch)} candidates")
    result.cost += generation_cost
    for candidate, verdict in zip(batch, verdicts):
        candidate.score = float(verdict.score)
        result.cost += verdict.cost
    if tiebreaker is not None:
        scores = tiebreaker(prompt, batch)
        result.tiebreak_scores.extend(float(value) for value in scores.values)
        result.cost += scores.cost
    result.completions.extend(batch)
    result.verdicts.extend(verdicts)
    result.parents.extend([parent] * len(batch))
    return any(verdict.passed for verdict in verdicts)


def _runner(generator, prompt, n, params, options, rng, overrides):
    """Refinement by the prompt's docstring examples: n attempts at most, a sample, then each
    revision shown the examples its predecessor failed (`ExampleTests.verifier`; rounds = n − 1,
    one candidate per round unless the overrides widen it). A prompt without examples has no
    verifier: the first sample (complete ones first) is returned, with no revision. Cost: the
    samples' plus the sandbox's wall seconds."""
    from metagen.scoring.example_tests import ExampleTests

    config = configure(VerifierRefineConfig(initial_candidates=1, rounds=n - 1, revisions_per_round=1, beam=1,
                                            params=replace(params, n=1)), overrides)
    tests = ExampleTests(prompt_text(prompt))
    if tests.verifier is not None:
        return runners.with_answers(verifier_refine(generator, prompt, tests.verifier, config, rng=rng), options)
    result = generator.generate(prompt, replace(config.params, n=config.initial_candidates), generator=rng)
    result.chosen = prefer_complete(result.completions)[0]
    return runners.with_answers(result, options)

register(StrategySpec("verifier_refine", "code: a sample, then up to n - 1 revisions each shown the docstring "
                      "examples the last attempt failed; stops at the first that passes them",
                      _runner, extracts=True, pooled=False, budget="rounds",
                      config=VerifierRefineConfig, set_by_run=frozenset({"rounds", "params"})), __name__)
