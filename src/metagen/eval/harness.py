"""The evaluation harness: strategies × n on a set of problems, resumable, with cost.

    report = evaluate(generator, problems, EvalConfig(("greedy", "self_consistency"), (1, 4, 16)), out_dir)

For every problem the harness stores, in `out_dir/results.jsonl`, one line per unit of work as
soon as it is done:
  - a pool of max(n) samples when any pooled strategy is asked for (see `pool.py`): pooled
    strategies at every n are then evaluated on random n-subsets of it, without new generation;
  - one record per (strategy, n) for strategies that are not pooled (greedy, self-refine).
A rerun with the same directory skips every unit already on disk (a torn last line from a
killed run is dropped and redone) and refuses a different sampling set-up, naming the field.
"""

from __future__ import annotations

import json
import math
import os
import random
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from metagen.decoding.cost import Cost, forward_flops
from metagen.eval.metrics import mean_and_stderr, pass_at_k
from metagen.eval.pool import Pool, PoolGenerator, Sample
from metagen.eval.tasks import Problem
from metagen.sampling import SamplingParams
from metagen.scoring.answers import answers_match, extract_answer
from metagen.strategies.registry import StrategyOptions, check_options, get_strategy

ORACLE = "pass@k"


@dataclass(frozen=True)
class EvalConfig:
    """strategies: registry names; ns: budgets to evaluate; params: sampling of every sample
    (its n is ignored); seed: seeds pools, subsets and live runs; subsets: random n-subsets of
    a pool averaged per problem for n < pool size; prompt_suffix: appended to each question."""

    strategies: tuple[str, ...]
    ns: tuple[int, ...] = (1, 2, 4, 8, 16)
    params: SamplingParams = SamplingParams(temperature=0.8, max_tokens=256)
    seed: int = 0
    subsets: int = 16
    options: StrategyOptions = StrategyOptions()
    prompt_suffix: str = ""

    def __post_init__(self) -> None:
        if not self.strategies:
            raise ValueError("strategies is empty: name at least one strategy")
        for name in self.strategies:
            get_strategy(name)
        if not self.ns or any(n < 1 for n in self.ns):
            raise ValueError(f"ns={self.ns} is out of range: give budgets >= 1")
        if self.subsets < 1:
            raise ValueError(f"subsets={self.subsets} is out of range: must be >= 1")
        check_options(self.strategies, self.options)

    @property
    def pool_size(self) -> int:
        return max(self.ns) if any(get_strategy(s).pooled for s in self.strategies) else 0

    def setup(self) -> dict:
        """What samples depend on: a resumed run must match it."""
        params = {k: v for k, v in asdict(self.params).items() if k not in ("n", "seed")}
        return {"params": params, "seed": self.seed, "prompt_suffix": self.prompt_suffix,
                "options": asdict(self.options)}


@dataclass
class CurvePoint:
    """One (strategy, n) point: accuracy over problems and the mean cost per problem."""

    strategy: str
    n: int
    accuracy: float
    stderr: float
    problems: int
    cost: Cost

    def to_dict(self) -> dict:
        return {"strategy": self.strategy, "n": self.n, "accuracy": self.accuracy, "stderr": self.stderr,
                "problems": self.problems, "cost": self.cost.to_dict()}


@dataclass
class EvalReport:
    points: list[CurvePoint] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"results": [point.to_dict() for point in self.points]}


# ----------------------------------------------------------------------------- storage


class ResultsFile:
    """Append-only JSONL of finished units, keyed by (kind, problem id, strategy, n)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.records: dict[tuple, dict] = {}
        if path is None or not path.exists():
            return
        raw = path.read_bytes()
        keep = raw[: raw.rfind(b"\n") + 1]  # a torn last line (killed mid-write) is redone
        if len(keep) != len(raw):
            with open(path, "r+b") as handle:
                handle.truncate(len(keep))
        for number, line in enumerate(keep.decode("utf-8").splitlines(), start=1):
            if line.strip():
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    raise ValueError(f"{path}:{number} is not valid JSON; move the file away to start over") from None
                self.records[self.key(record)] = record

    @staticmethod
    def key(record: dict) -> tuple:
        return record["kind"], record["id"], record.get("strategy"), record.get("n")

    def get(self, kind: str, problem_id: str, strategy: str | None = None, n: int | None = None) -> dict | None:
        return self.records.get((kind, problem_id, strategy, n))

    def add(self, record: dict) -> None:
        self.records[self.key(record)] = record
        if self.path is None:
            return
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record, separators=(",", ":")) + "\n")
            handle.flush()
            os.fsync(handle.fileno())


def _flatten(tree: dict, prefix: str = "") -> dict:
    flat = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[prefix + key] = value
    return flat


def _check_setup(out_dir: Path, config: EvalConfig, model_name: str) -> None:
    setup = {"model": model_name, **config.setup()}
    path = out_dir / "run.json"
    if path.exists():
        stored = _flatten(json.loads(path.read_text()))
        for name, value in _flatten(json.loads(json.dumps(setup))).items():
            if stored.get(name) != value:
                raise ValueError(
                    f"{out_dir} holds a run with {name}={stored.get(name)!r}, this run has {name}={value!r}; "
                    "use another --out directory (finished results are kept)"
                )
        return
    path.write_text(json.dumps(setup, indent=1) + "\n")


# ----------------------------------------------------------------------------- running


def _seed(*parts) -> int:
    return zlib.crc32("/".join(map(str, parts)).encode())


def _rng(*parts):
    import torch

    generator = torch.Generator()
    generator.manual_seed(_seed(*parts))
    return generator


def _correct(answer: str | None, problem: Problem, options: StrategyOptions) -> bool:
    return answers_match(answer, problem.answer, options.math)


def _sample_pool(generator, prompt: str, problem: Problem, config: EvalConfig) -> Pool:
    from dataclasses import replace

    size = config.pool_size
    start = time.perf_counter()
    result = generator.generate(prompt, replace(config.params, n=size, seed=None),
                                generator=_rng(config.seed, problem.id, "pool"))
    wall = time.perf_counter() - start
    model = getattr(generator, "model", None)
    prompt_tokens = len(result.prompt_token_ids) or (result.cost.prompt_tokens_computed if result.cost else 0)
    samples = []
    for completion in result.completions:
        decode_flops = (forward_flops(model, prompt_tokens, max(len(completion.token_ids) - 1, 0))
                        if model is not None else 0.0)
        answer = extract_answer(completion.text, config.options.pattern)
        samples.append(Sample(completion.text, completion.token_ids, [round(x, 5) for x in completion.logprobs],
                              [round(x, 5) for x in completion.certainties], completion.finish_reason, decode_flops,
                              answer, _correct(answer, problem, config.options)))
    prompt_flops = forward_flops(model, 0, prompt_tokens) if model is not None else 0.0
    return Pool(prompt_tokens, prompt_flops, result.prefill_seconds, wall - result.prefill_seconds, samples)


def _score(result, problem: Problem, options: StrategyOptions) -> bool:
    answer = result.chosen.answer
    if answer is None:
        answer = extract_answer(result.chosen.text, options.pattern)
    return _correct(answer, problem, options)


def evaluate(
    generator,
    problems: Sequence[Problem],
    config: EvalConfig,
    out_dir: str | Path | None = None,
    *,
    model_name: str = "",
    progress: Callable[[int, int], None] | None = None,
) -> EvalReport:
    """Run (or resume) the evaluation and summarize it. `generator` is any `Generator`."""
    out = Path(out_dir) if out_dir is not None else None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        _check_setup(out, config, model_name)
    results = ResultsFile(out / "results.jsonl" if out is not None else None)
    live = [(name, n) for name in config.strategies if not get_strategy(name).pooled
            for n in (sorted(set(config.ns)) if get_strategy(name).budget != "none" else [1])]
    for done, problem in enumerate(problems):
        prompt = problem.question + config.prompt_suffix
        if config.pool_size:
            stored = results.get("pool", problem.id)
            if stored is not None and len(stored["pool"]["samples"]) < config.pool_size:
                raise ValueError(
                    f"{out} holds pools of {len(stored['pool']['samples'])} samples, this run needs "
                    f"{config.pool_size} (the largest n); use another --out directory"
                )
            if stored is None:
                pool = _sample_pool(generator, prompt, problem, config)
                results.add({"kind": "pool", "id": problem.id, "pool": pool.to_dict()})
        for name, n in live:
            if results.get("live", problem.id, name, n) is None:
                spec = get_strategy(name)
                result = spec.run(generator, prompt, n, config.params, config.options,
                                  _rng(config.seed, problem.id, name, n))
                results.add({"kind": "live", "id": problem.id, "strategy": name, "n": n,
                             "correct": _score(result, problem, config.options), "answer": result.chosen.answer,
                             "text": result.chosen.text, "cost": result.cost.to_dict()})
        if progress is not None:
            progress(done + 1, len(problems))
    return summarize(results, problems, config, decode=getattr(generator, "decode", None))


# ----------------------------------------------------------------------------- summary


def _subsets(size: int, n: int, count: int, *seed_parts) -> list[list[int]]:
    if n == size:
        return [list(range(size))]
    rng = random.Random(_seed(*seed_parts))
    if math.comb(size, n) <= count:
        from itertools import combinations

        return [list(c) for c in combinations(range(size), n)]
    return [sorted(rng.sample(range(size), n)) for _ in range(count)]


def _mean_cost(costs: list[Cost]) -> Cost:
    total = Cost()
    for cost in costs:
        total += cost
    count = max(len(costs), 1)
    return Cost(**{name: value / count for name, value in total.to_dict().items()})


def summarize(results: ResultsFile, problems: Sequence[Problem], config: EvalConfig, decode=None) -> EvalReport:
    """Accuracy and mean cost per (strategy, n), plus the oracle coverage pass@k of the pools."""
    report = EvalReport()
    pools = ({problem.id: Pool.from_dict(results.get("pool", problem.id)["pool"]) for problem in problems}
             if config.pool_size else {})
    for name in config.strategies:
        spec = get_strategy(name)
        budgets = sorted(set(config.ns)) if spec.budget != "none" else [1]
        for n in budgets:
            scores, costs = [], []
            for problem in problems:
                if spec.pooled:
                    pool = pools[problem.id]
                    hits, subset_costs = [], []
                    for indices in _subsets(len(pool.samples), n, config.subsets, config.seed, problem.id, n):
                        result = spec.run(PoolGenerator(pool, indices, decode), problem.question + config.prompt_suffix,
                                          n, config.params, config.options, None)
                        hits.append(float(_score(result, problem, config.options)))
                        subset_costs.append(result.cost)
                    scores.append(sum(hits) / len(hits))
                    costs.append(_mean_cost(subset_costs))
                else:
                    record = results.get("live", problem.id, name, n)
                    scores.append(float(record["correct"]))
                    costs.append(Cost(**record["cost"]))
            accuracy, stderr = mean_and_stderr(scores)
            report.points.append(CurvePoint(name, n, accuracy, stderr, len(problems), _mean_cost(costs)))
    if config.pool_size:
        for k in sorted(set(config.ns)):
            scores, costs = [], []
            for problem in problems:
                pool = pools[problem.id]
                correct = sum(sample.correct for sample in pool.samples)
                scores.append(pass_at_k(len(pool.samples), correct, k))
                costs.append(_mean_cost([pool.subset_cost(i) for i in
                                         _subsets(len(pool.samples), k, config.subsets, config.seed, problem.id, k)]))
            accuracy, stderr = mean_and_stderr(scores)
            report.points.append(CurvePoint(ORACLE, k, accuracy, stderr, len(problems), _mean_cost(costs)))
    return report


def format_table(report: EvalReport) -> str:
    """A plain-text table: strategy, n, accuracy ± stderr, generated tokens, TFLOPs, seconds per problem."""
    header = f"{'strategy':<20} {'n':>3}  {'accuracy':>15}  {'gen tokens':>10}  {'TFLOPs':>8}  {'s/problem':>9}"
    lines = [header, "-" * len(header)]
    for p in report.points:
        lines.append(f"{p.strategy:<20} {p.n:>3}  {p.accuracy:>7.3f} ± {p.stderr:<5.3f}  "
                     f"{p.cost.generated_tokens:>10.1f}  {p.cost.flops / 1e12:>8.3f}  {p.cost.wall_seconds:>9.2f}")
    return "\n".join(lines)
