"""Running an evaluation: strategies × n on a set of problems, resumable, on threads, with cost.

    report = evaluate(generator, problems, EvalConfig(("greedy", "self_consistency"), (1, 4, 16)), out_dir)

For every problem the harness stores, in `out_dir/results.jsonl`, one line per unit of work as
soon as it is done:
  - a pool of max(n) samples when any pooled strategy is asked for (`pool.sample_pool`): pooled
    strategies at every n are then evaluated on random n-subsets of it, without new generation
    (`summary.summarize`);
  - one record per (strategy, n) for strategies that are not pooled (greedy, self-refine).
Code problems (`Problem.is_code`, HumanEval's form) are put to the model completion- or
chat-style (`code_prompts.py`; the mode used is part of the set-up) and graded by running their
hidden tests in the sandbox (`code_grading.py`), here only: every pool sample once when the pool
is stored, and the chosen reply of each live run; a pooled strategy's choice is graded by the
stored grade of the sample whose text it is (or run when it built a new text, `judging.py`).
Their samples and live records keep the raw reply (`text`), the `program` run, the `reason` it
failed and the sandbox's `sandbox_seconds` (grading time, not the strategy's compute: not in
`cost`).

Every line carries the fingerprint of what produced it (problem, model, generation set-up; see
`fingerprint.py` and `config.run_setup`). A rerun with the same directory skips every unit
already on disk whose fingerprint matches (a torn last line from a killed run is dropped and
redone) and refuses a directory holding units of another set-up or of other problems under the
same ids, naming the file, line and field, before generating anything (see `results.py`).

`evaluate_models(models, ...)` runs a sweep of several models into one directory, one model
after another (opened, every problem run, closed: one local model in memory at a time); each
model's units are keyed by its own set-up fingerprint and its points named by its label, so
one report, frontier and plot span them all (`ModelRun`; `evaluate` is the one-model case).

`evaluate(..., concurrency=k)` runs k problems at once on threads, for generators that allow it
(`Generator.concurrent`, e.g. a remote server): each unit is appended whole under one lock, so a
kill loses at most the units in flight, and every unit draws from its own rng, so the results
equal those of a sequential run. A problem whose remote request finally fails
(`RequestFailedError`: a server that stays down or busy past the transport's retries and
deadline) does not stop the others: they run to the end, then `UnfinishedProblemsError` names
each unfinished problem and its failure (the finished ones are on disk, and a rerun with the
same directory resumes the rest).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from contextlib import nullcontext
from pathlib import Path
from threading import Lock

from metagen.decoding.errors import RequestFailedError
from metagen.eval.cascade import cascade_points, check_cascades
from metagen.eval.code_prompts import chat_applies, code_mode, code_setup, request, stored_mode
from metagen.eval.config import EvalConfig, EvalReport, ModelRun, run_setup, shared_setup
from metagen.eval.difficulty import difficulty_policy, probe_round, split_halves
from metagen.eval.frontier import budget_ladder
from metagen.eval.judging import grade_reply, score
from metagen.eval.points import CurvePoint, stable_seed
from metagen.eval.pool import known_grades, sample_pool
from metagen.eval.results import ModelUnits, ResultsFile
from metagen.eval.summary import summarize
from metagen.eval.tasks import Problem
from metagen.scoring.run_cache import stored_runs
from metagen.strategies.registry import get_strategy

# ----------------------------------------------------------------------------- checks


def check_generator(generator, problems: Sequence[Problem], config: EvalConfig) -> None:
    """ValueError before anything is generated when `generator` cannot run a chosen strategy
    (naming the strategy and the capability it lacks) or a problem's prompt leaves no room to
    generate in its context (checked only when the generator can tell both lengths)."""
    for name in config.strategies:  # a pool stores what the generator returns: its strategies need no more
        get_strategy(name).check(generator, config.options, config.params)
    _check_prompts_fit(generator, problems, config)


def check_code_strategies(problems: Sequence[Problem], config: EvalConfig) -> None:
    """ValueError, before any model is opened, for a vote over extracted answers (`StrategySpec.votes`)
    or the allocation (it votes too) when any problem is a code problem: the answers would be
    numbers read out of program text (`return sorted(l)[len(l) // 2]` votes "2"). Code problems
    are voted on by clustering programs by what they compute (code_cluster, adaptive_code_cluster)."""
    code = next((problem for problem in problems if problem.is_code), None)
    if code is None:
        return
    use = "use code_cluster or adaptive_code_cluster, which cluster programs by their outputs on the examples"
    if config.allocation_round is not None:
        raise ValueError(f"allocation_round={config.allocation_round} allocates by a vote over extracted answers, and "
                         f"problem {code.id!r} is a code problem: leave it out ({use})")
    for name in config.strategies:
        if get_strategy(name).votes:
            raise ValueError(f"strategy {name!r} votes over answers extracted from the text, and problem {code.id!r} "
                             f"is a code problem (the votes would be numbers read out of its programs): {use}")


def _check_prompts_fit(generator, problems: Sequence[Problem], config: EvalConfig) -> None:
    """ValueError naming every problem whose prompt leaves no room to generate in the
    generator's context (`max_context` and `count_tokens`; skipped when either is unknown)."""
    context = generator.max_context
    if context is None:
        return
    too_long = []
    mode = code_mode(problems, config, generator)
    for problem in problems:
        length = generator.count_tokens(request(problem, config, mode)[0])
        if length is None:
            return
        if length >= context:
            too_long.append(f"{problem.id!r} ({length} tokens)")
    if too_long:
        shown = ", ".join(too_long[:5]) + (f" and {len(too_long) - 5} more" if len(too_long) > 5 else "")
        raise ValueError(f"problem {shown} does not fit the model's context of {context} tokens "
                         "with room to generate; shorten or drop it (stopped before generating anything)")


def check_concurrency(generator, concurrency: int) -> None:
    """ValueError for a concurrency below 1, or above 1 with a generator that may not be called
    from several threads at once (a local model: one process computes one batch at a time)."""
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise ValueError(f"concurrency={concurrency!r} is out of range: must be an integer >= 1")
    if concurrency > 1 and not generator.concurrent:
        raise ValueError(f"concurrency={concurrency} needs a generator that may be called concurrently; "
                         f"{type(generator).__name__} may not (a local model runs one batch at a time: "
                         "use concurrency 1, or a remote backend)")


# ----------------------------------------------------------------------------- models


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
    check_code_strategies(problems, config)
    check_cascades(config.cascades, labels)
    if config.difficulty_probe is not None and config.difficulty_probe not in labels:
        raise ValueError(f"difficulty probe {config.difficulty_probe!r} is not a model of this sweep: give one of "
                         f"{', '.join(map(repr, labels))} (--difficulty-probe)")
    out = Path(out_dir) if out_dir is not None else None
    results = ResultsFile(out / "results.jsonl" if out is not None else None)
    results.check_shared(shared_setup(config), problems)
    live = [(name, n) for name in config.strategies if not get_strategy(name).is_pooled(config.options)
            for n in (sorted(set(config.ns)) if get_strategy(name).budget != "none" else [1])]
    with stored_runs(out / "sandbox_runs.jsonl" if out is not None else None):
        return _evaluate_models(models, problems, config, out, results, live, progress, concurrency)


def _evaluate_models(models, problems, config, out, results, live, progress, concurrency) -> EvalReport:
    """`evaluate_models`' runs, after its checks, with the sandbox's runs kept in --out."""
    labels = [run.label for run in models]
    probe = None if config.difficulty_round is None else config.difficulty_probe or labels[0]
    report, setups, unfinished, bound = EvalReport(), {}, {}, {}
    for index, run in enumerate(models):
        def counted(done: int, total: int, before: int = index * len(problems)) -> None:
            progress(before + done, len(models) * total)

        try:
            done = _run_model(run, problems, config, results, live, out, setups,
                              None if progress is None else counted,
                              concurrency if run.concurrency is None else run.concurrency, bound,
                              config.difficulty_round if run.label == probe else None)
            report.points += done.points
            report.per_problem.update(done.per_problem)
        except UnfinishedProblemsError as error:
            unfinished.update({(f"{run.label}: {problem}" if len(models) > 1 else problem): failure
                               for problem, failure in error.failures.items()})
    if unfinished:
        raise UnfinishedProblemsError(unfinished, len(problems) * len(models), str(out) if out is not None else None)
    if config.cascades:
        report.points += _cascade_points(bound, problems, config, report.points)
    if config.difficulty_round is not None:
        report.difficulty = _difficulty(bound[probe], problems, config, report)
    return report


def _difficulty(probe: ModelUnits, problems: Sequence[Problem], config: EvalConfig, report: EvalReport) -> dict:
    """The per-difficulty policy (`difficulty.py`) over the evaluated configurations of known
    FLOPs, the probe model (`config.difficulty_probe`, else the sweep's first) estimating difficulty with its first
    `config.difficulty_round` pool samples, at the budgets of `budget_ladder`; the probe's
    continuations (summarized with its other configurations) join the per-bin choices."""
    pools = {problem.id: probe.pool(problem) for problem in problems}
    k = config.difficulty_round
    shares, flops = probe_round(pools, problems, config, k, stored_mode(probe))
    table = {key: value for key, value in report.per_problem.items() if None not in value[1]}
    if None in flops:
        table = {}  # the probe's FLOPs unknown: no budget can be kept
    placed = [point for point in report.configurations() if point.key in table]
    choices = difficulty_policy(table, shares, flops, config.difficulty_bins, budget_ladder(placed), config.seed) \
        if table else []
    held_out = len(split_halves(len(problems), config.seed)[1])
    return {"model": probe.label, "round": k, "bins": config.difficulty_bins, "held_out": held_out,
            "choices": choices}


def _cascade_points(bound: dict, problems: Sequence[Problem], config: EvalConfig,
                    points: Sequence[CurvePoint]) -> list[CurvePoint]:
    """The points of `config.cascades`, from the stored pools of the sweep's models (`bound`:
    label -> its `ModelUnits`); a cascade's FLOPs are marked estimated when either model's are."""
    pools = {label: {problem.id: units.pool(problem) for problem in problems} for label, units in bound.items()}
    known = {(label, problem.id): known_grades(pools[label][problem.id]) for label in pools for problem in problems
             if problem.is_code}
    modes = {label: stored_mode(units) for label, units in bound.items()}

    def graded(result, problem: Problem, model: str) -> bool:
        return score(result, problem, config, known.get((model, problem.id)))

    estimates = {point.model: point.flops_estimate for point in points if point.flops_estimate is not None}
    made = []
    for cascade in config.cascades:
        for point in cascade_points(cascade, pools, problems, config, graded, modes):
            estimate = estimates.get(cascade.small) or estimates.get(cascade.large)
            point.flops_estimate = estimate if point.cost.flops is not None else None
            made.append(point)
    return made


def _run_model(run: ModelRun, problems: Sequence[Problem], config: EvalConfig, results: ResultsFile, live,
               out: Path | None, setups: dict, progress, concurrency: int, bound: dict,
               continue_after: int | None = None) -> EvalReport:
    """Open one model, check it, run its missing units, summarize them and close it (a function
    of its own so that nothing refers to the model once it returns); its units go in `bound`
    under its label (the cascades read their pools once every model has run). continue_after:
    the difficulty probe's round k when this model is the probe (`summarize`)."""
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
        bound[run.label] = units
        return summarize(units, problems, config, decode=generator.decode, flops_estimate=generator.flops_estimate,
                         keeps_prompt=generator.keeps_prompt, chat=chat_applies(generator),
                         continue_after=continue_after)


def _write_run_json(out: Path, setups: dict[str, dict]) -> None:
    """run.json, a readable copy of the set-ups (results.jsonl carries each unit's own): the one
    model's set-up with its fingerprint, or {"models": {label: that}} for a sweep."""
    copy = next(iter(setups.values())) if len(setups) == 1 else {"models": setups}
    (out / "run.json").write_text(json.dumps(copy, indent=1) + "\n")


# ----------------------------------------------------------------------------- problems


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
    """Whether `error` is a remote request that finally failed (a `RequestFailedError`: the
    server's fault, not the problem's); a server refusing the request as invalid is also a
    ValueError, and stops the run."""
    return isinstance(error, RequestFailedError) and not isinstance(error, ValueError)


def _run_problems(generator, problems: Sequence[Problem], config: EvalConfig, results: ModelUnits, live,
                  progress, concurrency: int) -> None:
    """Run every problem's missing units, `concurrency` problems at a time on threads. Each unit
    is appended whole under the results file's lock, so a kill loses at most the units in
    flight; the first failure stops the problems not yet started and is raised, except a remote
    request that finally failed (`request_failed`): the other problems run on, and
    `UnfinishedProblemsError` names the unfinished ones at the end."""
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


def _rng(*parts):
    """The torch rng of one unit of work, seeded by its key (seed, problem id, unit): the same
    in every process and whatever order the units run in."""
    import torch

    generator = torch.Generator()
    generator.manual_seed(stable_seed(*parts))
    return generator


def _run_problem(generator, problem: Problem, config: EvalConfig, results: ModelUnits, live) -> None:
    """Generate the units of `problem` not yet in `results`: its pool, then each live (strategy, n)."""
    prompt, params = request(problem, config, stored_mode(results))
    if config.pool_size and results.pool(problem) is None:
        generator.reset_prefix_cache()  # each unit from a cold cache: its cost is its own
        results.add_pool(problem, sample_pool(generator, prompt, params, problem, config,
                                              _rng(config.seed, problem.id, "pool")))
    for name, n in live:
        if results.live(problem, name, n, get_strategy(name).uses_value) is None:
            generator.reset_prefix_cache()
            result = get_strategy(name).run(generator, prompt, n, params, config.options,
                                            _rng(config.seed, problem.id, name, n), config.overrides_for(name))
            if problem.is_code:
                graded = grade_reply(result.chosen.text, problem, config)
                fields = {"correct": graded.passed, "answer": None, "text": result.chosen.text,
                          "program": graded.program, "reason": graded.reason,
                          "sandbox_seconds": round(graded.seconds, 4)}
            else:
                fields = {"correct": score(result, problem, config), "answer": result.chosen.answer,
                          "text": result.chosen.text}
            results.add_live(problem, name, n, {**fields, "cost": result.cost.to_dict()})
