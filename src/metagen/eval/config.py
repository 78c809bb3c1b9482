"""What an evaluation run is asked to do and what it reports: `EvalConfig` (strategies, budgets,
sampling, seed, options, code-problem limits), `ModelRun` (one model of a sweep), `EvalReport`
(its curve points), and the set-up derived from them that every stored unit depends on
(`run_setup`, `shared_setup`; see `fingerprint.py`).

    report = evaluate(generator, problems, EvalConfig(("greedy", "self_consistency"), (1, 4, 16)), out_dir)

`evaluate` and `evaluate_models` (`running.py`) run a config; `summarize` and `format_table`
(`summary.py`) turn its stored units into the report and its table.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field

from metagen.eval.code_grading import MEMORY_MB, TIMEOUT
from metagen.eval.code_prompts import MODES
from metagen.eval.fingerprint import generator_identity, model_identity, weights_digest
from metagen.eval.points import ORACLE, CurvePoint
from metagen.sampling import SamplingParams
from metagen.strategies.registry import StrategyOptions, check_options, get_strategy, value_is_head



@dataclass(frozen=True)
class Cascade:
    """A two-model cascade evaluated from the stored pools (`cascade.py`): vote on n samples of
    `small`; when the vote is not settled (the top answer's share of the n samples below
    `threshold` τ, or a code problem whose chosen program fails its docstring examples), vote
    on n samples of `large` instead. small, large: model labels of the sweep (`ModelRun.label`);
    threshold τ in (0, 1] (1: escalate unless the small model is unanimous)."""

    small: str
    large: str
    threshold: float = 0.6

    def __post_init__(self) -> None:
        for name in ("small", "large"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise ValueError(f"cascade {name}={value!r} must be a model label (a non-empty string)")
        if self.small == self.large:
            raise ValueError(f"cascade small={self.small!r} and large={self.large!r} are one model: a cascade "
                             "escalates from one model to another")
        if isinstance(self.threshold, bool) or not isinstance(self.threshold, (int, float)) or \
                not 0.0 < self.threshold <= 1.0:
            raise ValueError(f"cascade threshold={self.threshold!r} is out of range: must be in (0, 1]")

    @property
    def label(self) -> str:
        """Its name as a strategy of the report: 'cascade(small→large, τ 0.6)'."""
        return f"cascade({self.small}→{self.large}, τ {self.threshold:g})"


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
    The three enter the set-up only when there are code problems (`code_setup`).
    difficulty_round: k, the probe round of the per-difficulty policy (`difficulty.py`: the probe
    model's first k pool samples estimate each problem's difficulty; None: not evaluated);
    difficulty_bins: its number of bins B; difficulty_probe: the probe model's label (None: the
    sweep's first model). None of them changes a stored unit.
    cascades: `Cascade`s evaluated from the pools of a sweep's models (they change no stored
    unit; each needs a pooled strategy, so that the pools exist).
    overrides: (name, value) pairs of strategy config fields, each given to every strategy of
    the run that declares it (`StrategySpec.fields`), e.g. (("retriever", "bm25:corpus.jsonl"),);
    each must be declared by one of the strategies, and an option a strategy requires
    (`required_options`) must be among them. They enter the set-up when given."""

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
    cascades: tuple[Cascade, ...] = ()
    difficulty_round: int | None = None
    difficulty_bins: int = 3
    difficulty_probe: str | None = None
    overrides: tuple[tuple[str, object], ...] = ()

    def __post_init__(self) -> None:
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
        self._check_overrides()
        if self.allocation_round is not None:
            if "self_consistency" not in self.strategies:
                raise ValueError(f"allocation_round={self.allocation_round} needs self_consistency among the "
                                 "strategies (the uniform-n baseline, and the pool the allocation reads)")
            if not 2 <= self.allocation_round <= max(self.ns):
                raise ValueError(f"allocation_round={self.allocation_round} (--allocation-round) is out of range: "
                                 f"must be in [2, {max(self.ns)}] (the largest n): a first round of one sample "
                                 "gives every answered problem the same vote, so it estimates no difficulty")

        if self.cascades and not self.pool_size:
            raise ValueError(f"cascades={[c.label for c in self.cascades]} are evaluated from sample pools, and "
                             f"no strategy of {self.strategies} is pooled: add self_consistency (or code_cluster)")
        bins = self.difficulty_bins
        if isinstance(bins, bool) or not isinstance(bins, int) or not 1 <= bins <= 20:
            raise ValueError(f"difficulty_bins={bins!r} (--difficulty-bins) is out of range: "
                             "must be an integer in [1, 20]")
        if self.difficulty_round is not None:
            if not self.pool_size:
                raise ValueError(f"difficulty_round={self.difficulty_round} (--difficulty-round) reads the sample "
                                 f"pools, and no strategy of {self.strategies} is pooled: add self_consistency")
            if isinstance(self.difficulty_round, bool) or not isinstance(self.difficulty_round, int) or \
                    not 2 <= self.difficulty_round <= max(self.ns):
                raise ValueError(f"difficulty_round={self.difficulty_round!r} (--difficulty-round) is out of range: "
                                 f"must be an integer in [2, {max(self.ns)}] (the largest n)")
        if self.difficulty_probe is not None and self.difficulty_round is None:
            raise ValueError(f"difficulty_probe={self.difficulty_probe!r} (--difficulty-probe) applies with "
                             "difficulty_round (--difficulty-round K)")
        labels = [cascade.label for cascade in self.cascades]
        repeated = sorted({label for label in labels if labels.count(label) > 1})
        if repeated:
            raise ValueError(f"cascade {repeated[0]} is given more than once")

    def _check_overrides(self) -> None:
        """ValueError naming an override no strategy declares, a value its declaration refuses,
        or an option a strategy requires that is not given."""
        given = dict(self.overrides)
        if len(given) != len(self.overrides):
            raise ValueError(f"overrides={self.overrides!r} name an option twice")
        for name in given:
            if not any(name in get_strategy(strategy).fields() for strategy in self.strategies):
                raise ValueError(f"{name} is an option of none of the strategies {', '.join(self.strategies)}")
        for strategy in self.strategies:
            get_strategy(strategy).parse(self.overrides_for(strategy))  # kinds, ranges, required options

    def overrides_for(self, strategy: str) -> dict:
        """The overrides `strategy` declares, by name."""
        accepted = get_strategy(strategy).fields()
        return {name: value for name, value in self.overrides if name in accepted}

    @property
    def pool_size(self) -> int:
        return max(self.ns) if any(get_strategy(s).is_pooled(self.options) for s in self.strategies) else 0

    def setup(self) -> dict:
        """What stored units depend on besides the problem and the model: every sampling field
        the harness does not set itself, the seed, the prompt suffix, the strategy options and
        the overrides of strategy config fields."""
        params = {k: v for k, v in asdict(self.params).items()
                  if k not in ("n", "seed") and not (k in ADDED_LATER and v == ADDED_LATER[k])}
        options = asdict(self.options)
        for name in ("answer_field", "value_parameters"):  # absent as in set-ups stored before the fields existed
            if options[name] is None:
                del options[name]
        setup = {"params": params, "seed": self.seed, "prompt_suffix": self.prompt_suffix, "options": options}
        if self.overrides:  # absent as in set-ups stored before overrides existed
            setup["overrides"] = {name: value for name, value in self.overrides}
        return setup


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


@dataclass
class EvalReport:
    """points: every evaluated configuration; per_problem: (model, strategy, n) -> (per-problem
    scores, per-problem FLOPs) in the problems' order (what the per-difficulty policy reads; not
    written out); difficulty: the policy's result (`difficulty.py`: {"model", "round", "bins",
    "held_out", "choices"}) or None."""

    points: list[CurvePoint] = field(default_factory=list)
    per_problem: dict = field(default_factory=dict, repr=False)
    difficulty: dict | None = None
    _answer: tuple | None = field(default=None, repr=False, compare=False)

    def answer(self):
        """`frontier.answer` over the configurations, the pass@k rows as coverage: computed once
        (its paired bootstrap is the summary's dearest part) and again only if the points change."""
        from metagen.eval.frontier import answer

        key = tuple(map(id, self.points))
        if self._answer is None or self._answer[0] != key:
            self._answer = (key, answer(self.configurations(), coverage=self.coverage()))
        return self._answer[1]

    def configurations(self) -> list[CurvePoint]:
        """The points one can run: all but the oracle coverage pass@k (which needs the answer)."""
        return [point for point in self.points if point.strategy != ORACLE]

    def to_dict(self) -> dict:
        """{"results": [rows], "frontier", "per_budget", "unplaced", "scaling_fits",
        "predicted_per_budget"} (`frontier.compute_optimal` over the configurations, at budgets
        log-spaced from the cheapest to the dearest, the pass@k rows fitted as coverage), and
        "difficulty_policy" when it was evaluated."""
        from metagen.eval.frontier import answer_dict

        data = {"results": [point.to_dict() for point in self.points], **answer_dict(self.answer())}
        if self.difficulty is not None:
            data["difficulty_policy"] = {**self.difficulty,
                                         "choices": [choice.to_dict() for choice in self.difficulty["choices"]]}
        return data

    def coverage(self) -> list[CurvePoint]:
        """The oracle coverage pass@k rows."""
        return [point for point in self.points if point.strategy == ORACLE]


def run_setup(config: EvalConfig, generator, model: dict | None = None) -> dict:
    """Everything but the problem that stored units depend on (see `fingerprint.py`). `model`:
    the model's identity (`model_identity`); None takes it from `generator.source_model()` when
    there is one (a local model), else from `generator.served_identity()` (a remote server's
    model id, engine and base URLs), else leaves it empty."""
    if model is None:
        source = generator.source_model()
        model = model_identity(source) if source is not None else (generator.served_identity() or {})
    return {"model": dict(model), "generator": generator_identity(generator), **shared_setup(config)}


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
