"""The evaluation harness: strategies × n on a set of problems, resumable, with cost.

    report = evaluate(generator, problems, EvalConfig(("greedy", "self_consistency"), (1, 4, 16)), out_dir)

For every problem the harness stores, in `out_dir/results.jsonl`, one line per unit of work as
soon as it is done:
  - a pool of max(n) samples when any pooled strategy is asked for (see `pool.py`): pooled
    strategies at every n are then evaluated on random n-subsets of it, without new generation;
  - one record per (strategy, n) for strategies that are not pooled (greedy, self-refine).
Code problems (`Problem.is_code`, HumanEval's form) are put to the model completion- or
chat-style (`code_prompts.py`; the mode used is part of the set-up) and graded by running their
hidden tests in the sandbox (`code_grading.py`), here only: every pool sample once when the pool
is stored, and the chosen reply of each live run; a pooled strategy's choice is graded by the
stored grade of the sample whose text it is (or run when it built a new text). Their samples and
live records keep the raw reply (`text`), the `program` run, the `reason` it failed and the
sandbox's `sandbox_seconds` (grading time, not the strategy's compute: not in `cost`).

Every line carries the fingerprint of what produced it (problem, model, generation set-up; see
`fingerprint.py`). A rerun with the same directory skips every unit already on disk whose
fingerprint matches (a torn last line from a killed run is dropped and redone) and refuses a
directory holding units of another set-up or of other problems under the same ids, naming the
file, line and field, before generating anything (see `results.py`).

`evaluate_models(models, ...)` runs a sweep of several models into one directory, one model
after another (opened, every problem run, closed: one local model in memory at a time); each
model's units are keyed by its own set-up fingerprint and its points named by its label, so
one report, frontier and plot span them all (`ModelRun`; `evaluate` is the one-model case).

`evaluate(..., concurrency=k)` runs k problems at once on threads, for generators that allow it
(`Generator.concurrent`, e.g. a remote server): each unit is appended whole under one lock, so a
kill loses at most the units in flight, and every unit draws from its own rng, so the results
equal those of a sequential run. A problem whose remote request finally fails (a server that
stays down or busy past the transport's retries and deadline) does not stop the others: they run
to the end, then `UnfinishedProblemsError` names each unfinished problem and its failure (the
finished ones are on disk, and a rerun with the same directory resumes the rest).
"""

from __future__ import annotations

import json
import math
import random
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path

from metagen.decoding.capabilities import described, require
from metagen.decoding.cost import Cost
from metagen.eval.fingerprint import generator_identity, model_identity, weights_digest
from metagen.eval.code_grading import MEMORY_MB, TIMEOUT, Grade, grade, grade_all
from metagen.eval.code_prompts import chat_applies, code_params, code_prompt, code_setup, resolve_mode
from metagen.eval.metrics import pass_at_k
from metagen.eval.points import CurvePoint, curve_point, mean_cost, mixed_prompts_note, stable_seed
from metagen.eval.pool import Pool, PoolGenerator, Sample
from metagen.eval.results import ModelUnits, ResultsFile
from metagen.eval.tasks import Problem
from metagen.sampling import SamplingParams
from metagen.scoring.answers import answers_match, extract_answer
from metagen.strategies.registry import StrategyOptions, check_options, get_strategy, value_is_head

ORACLE = "pass@k"


# SamplingParams fields added after results files were first written: at their default they stay
# out of the set-up, so older results (which predate them and meant the default) remain readable.
ADDED_LATER = {"token_healing": False}


@dataclass(frozen=True)
class EvalConfig:
    """strategies: registry names; ns: budgets to evaluate; params: sampling of every sample
    (its n and seed are ignored: the harness sets n per unit and seeds from `seed`); seed:
    seeds pools, subsets and live runs; subsets: random n-subsets of a pool averaged per
    problem for n < pool size; prompt_suffix: appended to each question; allocation_round: k,
    the first round of the compute-optimal allocation across problems evaluated against
    self_consistency's uniform n (`allocation.py`; None: not evaluated; it changes no stored unit).
    code_prompt: how code problems are asked, "auto" | "chat" | "completion" (`code_prompts.py`);
    code_timeout, code_memory_mb: the sandbox's limits per graded reply (`code_grading.py`).
    The three enter the set-up only when there are code problems (`code_setup`)."""

    strategies: tuple[str, ...]
    ns: tuple[int, ...] = (1, 2, 4, 8, 16)
    params: SamplingParams = SamplingParams(temperature=0.8, max_tokens=256)
    seed: int = 0
    subsets: int = 16
    options: StrategyOptions = StrategyOptions()
    prompt_suffix: str = ""
    allocation_round: int | None = None
    code_prompt: str = "auto"
    code_timeout: float = TIMEOUT
    code_memory_mb: int = MEMORY_MB

    def __post_init__(self) -> None:
        from metagen.eval.code_prompts import MODES

        if self.code_prompt not in MODES:
            raise ValueError(f"code_prompt={self.code_prompt!r} must be one of {MODES}")
        if isinstance(self.code_timeout, bool) or not isinstance(self.code_timeout, (int, float)) or \
                not 0 < self.code_timeout <= 3600:
            raise ValueError(f"code_timeout={self.code_timeout!r} is out of range: must be seconds in (0, 3600]")
        memory = self.code_memory_mb
        if isinstance(memory, bool) or not isinstance(memory, int) or memory < 64:
            raise ValueError(f"code_memory_mb={self.code_memory_mb!r} is out of range: must be an int >= 64")
        if not self.strategies:
            raise ValueError("strategies is empty: name at least one strategy")
        for name in self.strategies:
            get_strategy(name)
        if not self.ns or any(n < 1 for n in self.ns):
            raise ValueError(f"ns={self.ns} is out of range: give budgets >= 1")
        if self.subsets < 1:
            raise ValueError(f"subsets={self.subsets} is out of range: must be >= 1")
        check_options(self.strategies, self.options)
        if self.allocation_round is not None:
            if "self_consistency" not in self.strategies:
                raise ValueError(f"allocation_round={self.allocation_round} needs self_consistency among the "
                                 "strategies (the uniform-n baseline, and the pool the allocation reads)")
            if not 1 <= self.allocation_round <= max(self.ns):
                raise ValueError(f"allocation_round={self.allocation_round} is out of range: must be in "
                                 f"[1, {max(self.ns)}] (the largest n)")

    @property
    def pool_size(self) -> int:
        return max(self.ns) if any(get_strategy(s).is_pooled(self.options) for s in self.strategies) else 0

    def setup(self) -> dict:
        """What stored units depend on besides the problem and the model: every sampling field
        the harness does not set itself, the seed, the prompt suffix and the strategy options."""
        params = {k: v for k, v in asdict(self.params).items()
                  if k not in ("n", "seed") and not (k in ADDED_LATER and v == ADDED_LATER[k])}
        options = asdict(self.options)
        if options["answer_field"] is None:  # absent as in set-ups stored before the field existed
            del options["answer_field"]
        return {"params": params, "seed": self.seed, "prompt_suffix": self.prompt_suffix, "options": options}


@dataclass
class EvalReport:
    points: list[CurvePoint] = field(default_factory=list)

    def configurations(self) -> list[CurvePoint]:
        """The points one can run: all but the oracle coverage pass@k (which needs the answer)."""
        return [point for point in self.points if point.strategy != ORACLE]

    def to_dict(self) -> dict:
        """{"results": [rows], "frontier", "per_budget", "unplaced"} (`frontier.compute_optimal`
        over the configurations, at budgets log-spaced from the cheapest to the dearest)."""
        from metagen.eval.frontier import compute_optimal

        return {"results": [point.to_dict() for point in self.points], **compute_optimal(self.configurations())}


# ----------------------------------------------------------------------------- set-up


def run_setup(config: EvalConfig, generator, model: dict | None = None) -> dict:
    """Everything but the problem that stored units depend on (see `fingerprint.py`). `model`:
    the model's identity (`model_identity`); None takes it from `generator.source_model()` when
    there is one (a local model), else from `generator.served_identity()` (a remote server's
    model id, engine and base URLs), else leaves it empty."""
    if model is None:
        source = generator.source_model()
        model = model_identity(source) if source is not None else (generator.served_identity() or {})
    return {"model": dict(model), "generator": generator_identity(generator), **shared_setup(config)}


def check_generator(generator, problems: Sequence[Problem], config: EvalConfig) -> None:
    """ValueError before anything is generated when `generator` cannot run a chosen strategy
    (naming the strategy and the capability it lacks) or a problem's prompt leaves no room to
    generate in its context (checked only when the generator can tell both lengths)."""
    for name in config.strategies:  # a pool stores what the generator returns: its strategies need no more
        get_strategy(name).check(generator, config.options, config.params)
    _check_prompts_fit(generator, problems, config)


def check_pool(pool: Pool, generator, config: EvalConfig) -> None:
    """ValueError naming each pooled strategy of `config` and what it needs (its `needs`,
    `StrategySpec.required`) that the samples `generator` returned do not all carry (a generator
    declaring token ids or logprobs that returned none), before the pool is stored."""
    stored = PoolGenerator(pool, range(len(pool.samples)))
    stored.described_as = f"the samples {described(generator)} returned"
    for name in config.strategies:
        spec = get_strategy(name)
        if spec.is_pooled(config.options):
            require(spec.required(config.options), stored, f"evaluating strategy {name!r} from a stored sample pool")


def _check_prompts_fit(generator, problems: Sequence[Problem], config: EvalConfig) -> None:
    """ValueError naming every problem whose prompt leaves no room to generate in the
    generator's context (`max_context` and `count_tokens`; skipped when either is unknown)."""
    context = generator.max_context
    if context is None:
        return
    too_long = []
    mode = code_mode(problems, config, generator)
    for problem in problems:
        length = generator.count_tokens(_request(problem, config, mode)[0])
        if length is None:
            return
        if length >= context:
            too_long.append(f"{problem.id!r} ({length} tokens)")
    if too_long:
        shown = ", ".join(too_long[:5]) + (f" and {len(too_long) - 5} more" if len(too_long) > 5 else "")
        raise ValueError(f"problem {shown} does not fit the model's context of {context} tokens "
                         "with room to generate; shorten or drop it (stopped before generating anything)")


# ----------------------------------------------------------------------------- running


def _rng(*parts):
    import torch

    generator = torch.Generator()
    generator.manual_seed(stable_seed(*parts))
    return generator


def _correct(answer: str | None, problem: Problem, options: StrategyOptions) -> bool:
    return answers_match(answer, problem.answer, options.math)


def code_mode(problems: Sequence[Problem], config: EvalConfig, generator) -> str | None:
    """The code prompt mode of this run ("chat" or "completion", `code_prompts.resolve_mode`),
    or None when no problem is a code problem."""
    return resolve_mode(config.code_prompt, generator) if any(p.is_code for p in problems) else None


def _request(problem: Problem, config: EvalConfig, mode: str | None) -> tuple[str, SamplingParams]:
    """The prompt a strategy is given for `problem` and the sampling params of its samples: the
    question and `config.params`, or for a code problem its prompt and params in `mode`."""
    if not problem.is_code:
        return problem.question + config.prompt_suffix, config.params
    return code_prompt(problem.question, mode) + config.prompt_suffix, code_params(config.params, mode)


def _stored_mode(results: ResultsFile) -> str | None:
    return results.setup.get("code", {}).get("prompt")


def _grade(text: str, problem: Problem, config: EvalConfig, known: dict[str, Grade] | None = None) -> Grade:
    """The grade of a reply to a code problem: the stored one when `known` holds its text (a pool
    sample), else a sandbox run (remembered in `known`)."""
    if known is not None and text in known:
        return known[text]
    graded = grade(problem, text, timeout=config.code_timeout, memory_mb=config.code_memory_mb)
    if known is not None:
        known[text] = graded
    return graded


def _known_grades(pool: Pool | None) -> dict[str, Grade]:
    """The stored grades of a code problem's pool samples, by text."""
    if pool is None:
        return {}
    return {s.text: Grade(s.correct, s.reason or "", s.program, s.sandbox_seconds or 0.0) for s in pool.samples}


def _sample_pool(generator, prompt: str, problem: Problem, config: EvalConfig,
                 params: SamplingParams | None = None) -> Pool:
    """max(n) samples of `prompt` (sampled under `params`, default `config.params`), each
    graded: its answer checked, or a code problem's program run against its tests (`grade_all`,
    a few sandbox runs at once)."""
    from dataclasses import replace

    size = config.pool_size
    start = time.perf_counter()
    result = generator.generate(prompt, replace(params or config.params, n=size, seed=None),
                                generator=_rng(config.seed, problem.id, "pool"))
    wall = time.perf_counter() - start
    prompt_tokens = result.prompt_tokens
    counts = _token_counts(result)
    prompt_flops, decode_flops = _split_flops(result, prompt_tokens, counts)
    grades = [None] * len(result.completions)
    if problem.is_code:
        grades = grade_all(problem, [c.text for c in result.completions], timeout=config.code_timeout,
                           memory_mb=config.code_memory_mb)
    samples = []
    for completion, flops, count, graded in zip(result.completions, decode_flops, counts, grades):
        ids = completion.token_ids
        if graded is None:
            answer = extract_answer(completion.text, config.options.pattern, config.options.answer_field)
            correct, code = _correct(answer, problem, config.options), {}
        else:
            answer, correct = None, graded.passed
            code = {"program": graded.program, "reason": graded.reason, "sandbox_seconds": round(graded.seconds, 4)}
        samples.append(Sample(completion.text, list(ids or ()), [round(x, 5) for x in completion.logprobs],
                              [round(x, 5) for x in completion.certainties], completion.finish_reason, flops,
                              answer, correct, completion.complete,
                              token_count=None if ids is not None else count, **code))
    reported = None
    if result.cost is not None:
        reported = {"prompt_tokens_computed": result.cost.prompt_tokens_computed,
                    "prompt_tokens_reused": result.cost.prompt_tokens_reused, "model_calls": result.cost.model_calls}
    pool = Pool(prompt_tokens, prompt_flops, result.prefill_seconds, wall - result.prefill_seconds, samples, reported)
    check_pool(pool, generator, config)
    return pool


def _token_counts(result) -> list[int]:
    """Generated tokens of each completion: len(token_ids) where the ids are known; else one per
    logprob where it has logprobs (or no text); the rest share what the generator reported
    generating beyond those (`cost.generated_tokens`; a server answering n in one request
    reports only the total) in proportion to their text length, rounded to integers that sum
    to it (largest remainder) — an estimate, used only without ids and logprobs."""
    counts: list[int | None] = []
    for completion in result.completions:
        if completion.token_ids is not None:
            counts.append(len(completion.token_ids))
        elif completion.logprobs or not completion.text:
            counts.append(len(completion.logprobs))
        else:
            counts.append(None)
    unknown = [i for i, count in enumerate(counts) if count is None]
    if unknown:
        total = result.cost.generated_tokens if result.cost is not None else 0
        left = max(total - sum(count for count in counts if count is not None), 0)
        chars = [len(result.completions[i].text) for i in unknown]
        shares = [left * c / sum(chars) for c in chars]
        floors = [math.floor(share) for share in shares]
        by_remainder = sorted(range(len(unknown)), key=lambda j: floors[j] - shares[j])
        for j in by_remainder[:left - sum(floors)]:
            floors[j] += 1
        for i, count in zip(unknown, floors):
            counts[i] = count
    return counts


def _split_flops(result, prompt_tokens: int, counts: list[int]) -> tuple[float | None, list[float | None]]:
    """The generator's reported FLOPs F (`result.cost.flops`) split into the prompt's share and
    each completion's, in proportion to the tokens each runs through the model: the prompt's
    P tokens and, for a completion of L tokens (`counts`), L − 1 (its last token is never fed back):

        prompt = F · P / T,   completion_i = F · (L_i − 1) / T,   T = P + Σ_i (L_i − 1)

    (exact up to the attention term, which grows with position). All None when F is unknown."""
    flops = result.cost.flops if result.cost is not None else None
    fed = [max(count - 1, 0) for count in counts]
    if flops is None:
        return None, [None] * len(fed)
    total = prompt_tokens + sum(fed)
    if total == 0:
        return flops, [0.0] * len(fed)
    return flops * prompt_tokens / total, [flops * tokens / total for tokens in fed]


def _score(result, problem: Problem, config: EvalConfig, known: dict[str, Grade] | None = None) -> bool:
    """Whether a strategy's chosen output is right: its answer, or a code problem's program run
    against the tests (a pool sample's stored grade when `known` holds its text)."""
    if problem.is_code:
        return _grade(result.chosen.text, problem, config, known).passed
    answer = result.chosen.answer
    if answer is None:
        answer = extract_answer(result.chosen.text, config.options.pattern, config.options.answer_field)
    return _correct(answer, problem, config.options)


@dataclass(frozen=True)
class ModelRun:
    """One model of a sweep. label: its short display name, unique in the sweep (the points'
    `CurvePoint.model`, and what its set-up is filed under in results.jsonl); open(): a context
    manager yielding (generator, identity) — identity as `run_setup`'s `model` (None: from the
    generator) — that frees the model on exit (called once, when the model's turn comes);
    concurrency: problems run at once on this model (None: the sweep's)."""

    label: str
    open: Callable[[], AbstractContextManager]
    concurrency: int | None = None


def evaluate(
    generator,
    problems: Sequence[Problem],
    config: EvalConfig,
    out_dir: str | Path | None = None,
    *,
    model: dict | None = None,
    label: str | None = None,
    progress: Callable[[int, int], None] | None = None,
    concurrency: int = 1,
) -> EvalReport:
    """Run (or resume) the evaluation of one model and summarize it. `generator` is any
    `Generator`; `model` the identity of the model behind it (`model_identity(model)`; see
    `run_setup`); `label` its name in the report and results file (None: the identity's name);
    `concurrency`: problems run at once, on threads (> 1 needs `generator.concurrent`);
    `progress(done, total)` is called from one thread at a time.

    Stored units are reused only when their fingerprint matches (see `results.py`): a
    directory holding units of another set-up or other problems under the same ids is
    refused, naming the file, line and field, before anything is generated. The results do
    not depend on `concurrency`: each unit draws from its own rng (seed, problem id, unit)."""
    if label is None:
        label = run_setup(config, generator, model)["model"].get("name") or type(generator).__name__
    run = ModelRun(label, lambda: nullcontext((generator, model)))
    return evaluate_models([run], problems, config, out_dir, progress=progress, concurrency=concurrency)


def evaluate_models(
    models: Sequence[ModelRun],
    problems: Sequence[Problem],
    config: EvalConfig,
    out_dir: str | Path | None = None,
    *,
    progress: Callable[[int, int], None] | None = None,
    concurrency: int = 1,
) -> EvalReport:
    """Run (or resume) the evaluation of every model of `models` into one directory, one model
    after another (each opened, run on every problem, summarized and closed before the next is
    opened), and return one report of all their points. Checked before any model is opened: the
    labels (non-empty, distinct), and the stored units' shared set-up and problems; checked when
    a model is opened, before it generates: its generator and set-up against its stored units
    (`ResultsFile.bind`). A model whose remote requests finally fail does not stop the others:
    `UnfinishedProblemsError` names each unfinished (model, problem) at the end.
    progress(done, total) counts problems over all models."""
    labels = [run.label for run in models]
    if not labels:
        raise ValueError("models is empty: give at least one model")
    for label in labels:
        if not isinstance(label, str) or not label:
            raise ValueError(f"model label {label!r} must be a non-empty string")
    repeated = sorted({label for label in labels if labels.count(label) > 1})
    if repeated:
        raise ValueError(f"model label(s) {', '.join(map(repr, repeated))} given more than once: each model of a "
                         "sweep needs its own name")
    out = Path(out_dir) if out_dir is not None else None
    results = ResultsFile(out / "results.jsonl" if out is not None else None)
    results.check_shared(shared_setup(config), problems)
    live = [(name, n) for name in config.strategies if not get_strategy(name).is_pooled(config.options)
            for n in (sorted(set(config.ns)) if get_strategy(name).budget != "none" else [1])]
    report, setups, unfinished = EvalReport(), {}, {}
    for index, run in enumerate(models):
        def counted(done: int, total: int, before: int = index * len(problems)) -> None:
            progress(before + done, len(models) * total)

        try:
            report.points += _run_model(run, problems, config, results, live, out, setups,
                                        None if progress is None else counted,
                                        concurrency if run.concurrency is None else run.concurrency)
        except UnfinishedProblemsError as error:
            unfinished.update({(f"{run.label}: {problem}" if len(models) > 1 else problem): failure
                               for problem, failure in error.failures.items()})
    if unfinished:
        raise UnfinishedProblemsError(unfinished, len(problems) * len(models), str(out) if out is not None else None)
    return report


def _run_model(run: ModelRun, problems: Sequence[Problem], config: EvalConfig, results: ResultsFile, live,
               out: Path | None, setups: dict, progress, concurrency: int) -> list[CurvePoint]:
    """Open one model, check it, run its missing units, summarize them and close it (a function
    of its own so that nothing refers to the model once it returns)."""
    with run.open() as (generator, identity):
        check_concurrency(generator, concurrency)
        check_generator(generator, problems, config)  # before the directory is even created
        mode = code_mode(problems, config, generator)
        if mode == "completion" and config.prompt_suffix:
            raise ValueError(f"prompt_suffix={config.prompt_suffix!r} would stand between a code problem's function "
                             "header and the body the model writes in completion-style prompting: leave it empty, "
                             "or use chat-style prompting")
        setup = run_setup(config, generator, identity)
        if mode is not None:  # only with code problems: set-ups of other runs stay as they were
            setup["code"] = code_setup(mode, config.code_timeout, config.code_memory_mb)
        units = results.bind(run.label, setup, config.pool_size)
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            setups[run.label] = {**units.setup, "fingerprint": units.fingerprint}
            _write_run_json(out, setups)
        _run_problems(generator, problems, config, units, live, progress, concurrency)
        return summarize(units, problems, config, decode=generator.decode, flops_estimate=generator.flops_estimate,
                         keeps_prompt=generator.keeps_prompt, chat=chat_applies(generator)).points


def shared_setup(config: EvalConfig) -> dict:
    """The set-up fields every model of a sweep shares (`run_setup` without `MODEL_FIELDS`)."""
    setup = config.setup()
    if value_is_head(config.options):  # a value-head file: its content counts
        setup["value_weights"] = weights_digest(config.options.value)
    else:
        from metagen.scoring.step_prm import parse_prm_spec

        prm = parse_prm_spec(config.options.value)
        if prm is not None and prm[0] == "local":  # a process reward model checkpoint: so does its content
            setup["value_weights"] = weights_digest(prm[2])
    return setup


def _write_run_json(out: Path, setups: dict[str, dict]) -> None:
    """run.json, a readable copy of the set-ups (results.jsonl carries each unit's own): the one
    model's set-up with its fingerprint, or {"models": {label: that}} for a sweep."""
    copy = next(iter(setups.values())) if len(setups) == 1 else {"models": setups}
    (out / "run.json").write_text(json.dumps(copy, indent=1) + "\n")


def check_concurrency(generator, concurrency: int) -> None:
    """ValueError for a concurrency below 1, or above 1 with a generator that may not be called
    from several threads at once (a local model: one process computes one batch at a time)."""
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise ValueError(f"concurrency={concurrency!r} is out of range: must be an integer >= 1")
    if concurrency > 1 and not generator.concurrent:
        raise ValueError(f"concurrency={concurrency} needs a generator that may be called concurrently; "
                         f"{type(generator).__name__} may not (a local model runs one batch at a time: "
                         "use concurrency 1, or a remote backend)")


class UnfinishedProblemsError(RuntimeError):
    """Problems left unfinished because their remote requests failed; the others are done."""

    def __init__(self, failures: dict[str, BaseException], total: int, where: str | None) -> None:
        self.failures = failures
        listed = "; ".join(f"{problem}: {error}" for problem, error in failures.items())
        resume = f"rerun with the same directory ({where}) to resume them" if where else \
            "give an output directory to resume them"
        super().__init__(f"{len(failures)} of {total} problems unfinished, their remote requests failed "
                         f"({resume}): {listed}")


def request_failed(error: BaseException) -> bool:
    """Whether `error` is a remote request that finally failed (the server's fault, not the
    problem's: a server refusing the request as invalid is a ValueError, and stops the run). The
    remote modules are looked up only if loaded: importing the harness imports no httpx."""
    kinds = []
    for module, name in (("metagen.remote.transport", "ServerError"), ("metagen.remote.pool", "FleetUnavailableError")):
        if module in sys.modules:
            kinds.append(getattr(sys.modules[module], name))
    return bool(kinds) and isinstance(error, tuple(kinds)) and not isinstance(error, ValueError)


def _run_problems(generator, problems: Sequence[Problem], config: EvalConfig, results: ModelUnits, live,
                  progress, concurrency: int) -> None:
    """Run every problem's missing units, `concurrency` problems at a time on threads. Each unit
    is appended whole under the results file's lock, so a kill loses at most the units in
    flight; the first failure stops the problems not yet started and is raised, except a remote
    request that finally failed (`request_failed`): the other problems run on, and
    `UnfinishedProblemsError` names the unfinished ones at the end."""
    from threading import Lock

    lock, done = Lock(), [0]
    unfinished: dict[str, BaseException] = {}

    def run(problem: Problem) -> None:
        try:
            _run_problem(generator, problem, config, results, live)
        except ValueError as error:
            raise ValueError(f"problem {problem.id!r}: {error}") from error
        except Exception as error:  # noqa: BLE001 - sorted below: a failed request, or raised
            if not request_failed(error):
                raise
            with lock:
                unfinished[str(problem.id)] = error
            return
        with lock:
            done[0] += 1
            if progress is not None:
                progress(done[0], len(problems))

    if concurrency == 1:
        for problem in problems:
            run(problem)
    else:
        _run_threads(run, problems, concurrency)
    if unfinished:
        raise UnfinishedProblemsError(unfinished, len(problems), str(results.path.parent) if results.path else None)


def _run_threads(run, problems: Sequence[Problem], concurrency: int) -> None:
    """`run(problem)` for every problem, `concurrency` at a time; the first exception raised stops
    the problems not yet started and is raised."""
    from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait

    with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="metagen-eval") as pool:
        futures = [pool.submit(run, problem) for problem in problems]
        try:
            finished, _ = wait(futures, return_when=FIRST_EXCEPTION)
        except BaseException:  # KeyboardInterrupt: start nothing more, let the running ones end
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        failed = [future for future in futures if future in finished and future.exception() is not None]
        if failed:
            pool.shutdown(wait=True, cancel_futures=True)
            raise failed[0].exception()


def _run_problem(generator, problem: Problem, config: EvalConfig, results: ModelUnits, live) -> None:
    """Generate the units of `problem` not yet in `results`: its pool, then each live (strategy, n)."""
    prompt, params = _request(problem, config, _stored_mode(results))
    if config.pool_size and results.pool(problem) is None:
        generator.reset_prefix_cache()  # each unit from a cold cache: its cost is its own
        results.add_pool(problem, _sample_pool(generator, prompt, problem, config, params))
    for name, n in live:
        if results.live(problem, name, n) is None:
            generator.reset_prefix_cache()
            result = get_strategy(name).run(generator, prompt, n, params, config.options,
                                            _rng(config.seed, problem.id, name, n))
            if problem.is_code:
                graded = _grade(result.chosen.text, problem, config)
                fields = {"correct": graded.passed, "answer": None, "text": result.chosen.text,
                          "program": graded.program, "reason": graded.reason,
                          "sandbox_seconds": round(graded.seconds, 4)}
            else:
                fields = {"correct": _score(result, problem, config), "answer": result.chosen.answer,
                          "text": result.chosen.text}
            results.add_live(problem, name, n, {**fields, "cost": result.cost.to_dict()})


# ----------------------------------------------------------------------------- summary


def _subsets(size: int, n: int, count: int, *seed_parts) -> list[list[int]]:
    if n == size:
        return [list(range(size))]
    rng = random.Random(stable_seed(*seed_parts))
    if math.comb(size, n) <= count:
        from itertools import combinations

        return [list(c) for c in combinations(range(size), n)]
    return [sorted(rng.sample(range(size), n)) for _ in range(count)]


def summarize(results: ModelUnits, problems: Sequence[Problem], config: EvalConfig, decode=None,
              flops_estimate: str | None = None, keeps_prompt: bool = False, chat: bool | None = None) -> EvalReport:
    """Accuracy and mean cost per (strategy, n) of one model's units, plus the oracle coverage
    pass@k of its pools; every point named by the model's label and marked with how its FLOPs
    were estimated (`flops_estimate`, None: exact or unknown) and whether its text prompts went
    through a chat template (`chat`, `CurvePoint.chat`; None: not recorded). `keeps_prompt`: the
    generator reuses a repeated prompt (`Generator.keeps_prompt`), so a strategy sampling in
    rounds pays for the prompt in its first round only."""
    report = EvalReport()
    model = results.label
    pools = {problem.id: results.pool(problem) for problem in problems} if config.pool_size else {}
    mode = _stored_mode(results)
    known = {problem.id: _known_grades(pools.get(problem.id)) for problem in problems if problem.is_code}
    for name in config.strategies:
        spec = get_strategy(name)
        budgets = sorted(set(config.ns)) if spec.budget != "none" else [1]
        for n in budgets:
            scores, costs, drawn = [], [], []
            for problem in problems:
                if spec.is_pooled(config.options):
                    pool = pools[problem.id]
                    hits, subset_costs = [], []
                    prompt, params = _request(problem, config, mode)
                    for indices in _subsets(len(pool.samples), n, config.subsets, config.seed, problem.id, n):
                        served = PoolGenerator(pool, indices, decode, sequential=spec.sequential,
                                               keeps_prompt=keeps_prompt)
                        result = spec.run(served, prompt, n, params, config.options, None)
                        hits.append(float(_score(result, problem, config, known.get(problem.id))))
                        subset_costs.append(result.cost)
                        drawn.append(served.served)
                    scores.append(sum(hits) / len(hits))
                    costs.append(mean_cost(subset_costs))
                else:
                    record = results.live(problem, name, n)
                    scores.append(float(record["correct"]))
                    costs.append(Cost(**record["cost"]))
            samples = sum(drawn) / len(drawn) if drawn else None
            report.points.append(curve_point(name, n, scores, mean_cost(costs), model, config.seed, samples))
    if config.pool_size:
        for k in sorted(set(config.ns)):
            scores, costs = [], []
            for problem in problems:
                pool = pools[problem.id]
                correct = sum(sample.correct for sample in pool.samples)
                scores.append(pass_at_k(len(pool.samples), correct, k))
                costs.append(mean_cost([pool.subset_cost(i) for i in
                                        _subsets(len(pool.samples), k, config.subsets, config.seed, problem.id, k)]))
            report.points.append(curve_point(ORACLE, k, scores, mean_cost(costs), model, config.seed))
    if config.allocation_round is not None:
        from metagen.eval.allocation import allocation_points

        report.points += allocation_points(pools, problems, config, model,
                                           lambda result, problem: _score(result, problem, config,
                                                                          known.get(problem.id)), decode)
    for point in report.points:
        point.chat = chat
        if flops_estimate is not None:
            point.flops_estimate = flops_estimate if point.cost.flops is not None else None
    return report


def format_table(report: EvalReport) -> str:
    """A plain-text table: model (when the report holds several), strategy, n, accuracy [95%
    bootstrap interval], generated tokens, TFLOPs ("unknown" when the generator could not count
    them; "~" before an estimate, explained under the table), seconds per problem. When its
    models got their prompts differently (`mixed_prompts_note`), a "prompts" column says "chat"
    or "raw" per row and the note under the table flags it."""
    models = list(dict.fromkeys(point.model for point in report.points))
    width = max([len("model"), *map(len, models)]) if len(models) > 1 else 0
    column = f"{'model':<{width}}  " if width else ""
    mixed = mixed_prompts_note(report.points)
    prompts = f"{'prompts':<7}  " if mixed else ""
    header = (f"{column}{prompts}{'strategy':<20} {'n':>3}  {'accuracy [95% interval]':>23}  {'gen tokens':>10}  "
              f"{'TFLOPs':>9}  {'s/problem':>9}")
    lines = [header, "-" * len(header)]
    for p in report.points:
        interval = "" if p.interval is None else f"[{p.interval[0]:.3f}, {p.interval[1]:.3f}]"
        flops = ("~" if p.flops_estimate is not None else "") + _tflops(p.cost.flops)
        model = f"{p.model:<{width}}  " if width else ""
        shown = {True: "chat", False: "raw", None: "?"}[p.chat]
        prompt = f"{shown:<7}  " if mixed else ""
        lines.append(f"{model}{prompt}{p.strategy:<20} {p.n:>3}  {p.accuracy:>7.3f} {interval:>15}  "
                     f"{p.cost.generated_tokens:>10.1f}  {flops:>9}  {p.cost.wall_seconds:>9.2f}")
    estimates = dict.fromkeys((p.model, p.flops_estimate) for p in report.points if p.flops_estimate is not None)
    for model, estimate in estimates:
        lines.append(f"~ {model or 'model'}: FLOPs estimated as {estimate}")
    if mixed:
        lines.append(mixed)
    return "\n".join(lines)


def _tflops(flops: float | None) -> str:
    return "unknown" if flops is None else f"{flops / 1e12:.3f}"
