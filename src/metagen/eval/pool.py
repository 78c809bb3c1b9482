"""Sample pools: N completions of a problem, stored once and re-used for every strategy and n.

A pooled strategy (one that picks or builds its output from n i.i.d. samples of the prompt:
best-of-N, voting, MBR) run with n samples has the same output distribution as the strategy
run on a uniformly random n-subset of N ≥ n stored i.i.d. samples. So its expected accuracy at
every n ≤ N is estimated without bias by averaging over subsets of one pool (search-and-learn
does the same), and a whole curve costs one N-sample generation per problem. The stored
samples are exchangeable, so a subset read in order is an i.i.d. sequence: a strategy that
samples in rounds and stops early (adaptive self-consistency) is evaluated on its prefix.

`sample_pool` draws a pool in one `generate` call of max(n) samples and grades each sample
once (its answer checked, or a code problem's program run in the sandbox); the call's reported
cost is split after the fact into the prompt's share and each sample's (`token_counts`,
`split_flops`), so a subset is charged what generating it alone would have cost.
`PoolGenerator` is a `Generator` that serves a chosen subset of a pool, so the evaluation runs
the library's own strategy code on it, with the cost the subset would have had.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace

from metagen.decoding import capabilities as caps
from metagen.decoding.capabilities import described, require
from metagen.decoding.cost import Cost
from metagen.decoding.generator import Generator
from metagen.decoding.result import Completion, GenerationResult
from metagen.eval.code_grading import Grade, grade_all
from metagen.eval.config import EvalConfig
from metagen.eval.judging import correct
from metagen.eval.tasks import Problem
from metagen.sampling import SamplingParams
from metagen.scoring.answers import extract_answer
from metagen.strategies.registry import get_strategy


@dataclass
class Sample:
    """One stored completion. flops: its decode FLOPs (the shared prompt's are in the pool);
    None when the generator could not know them; complete: `Completion.complete` (False: cut
    before the run's constraint accepted it; optional in the file, None when absent).

    token_count: its generated tokens when the ids are not stored (a server that returns none,
    such as OpenAI's or llama.cpp's, and no tokenizer given: `token_ids` is then []); None when
    they are, and the count is len(token_ids). Absent from the file when None.

    A code problem's sample (`code_grading`): answer None, correct = its program passed the
    tests, program = what was run (None: the reply holds no code), reason = "passed" or why not,
    sandbox_seconds = the grading run's wall time. All None (absent from the file) for others."""

    text: str
    token_ids: list[int]
    logprobs: list[float]
    certainties: list[float]
    finish_reason: str | None
    flops: float | None
    answer: str | None = None
    correct: bool = False
    complete: bool | None = None
    token_count: int | None = None
    program: str | None = None
    reason: str | None = None
    sandbox_seconds: float | None = None

    @property
    def length(self) -> int:
        """Its generated tokens (from the ids, else `token_count`)."""
        return len(self.token_ids) if self.token_count is None else self.token_count

    def to_dict(self) -> dict:
        data = dict(self.__dict__)
        for name in _LATER_FIELDS:  # absent when None: such samples are written as before the field existed
            if data[name] is None:
                del data[name]
        return data

    @classmethod
    def from_dict(cls, data, where: str = "sample") -> Sample:
        """The inverse of `to_dict`; ValueError naming the field (as `where.field`) that is
        missing, unknown or of the wrong type."""
        _check_fields(cls, data, where, optional=("answer", "correct", "complete", *_LATER_FIELDS))
        for name in ("token_ids", "logprobs", "certainties"):
            kind = int if name == "token_ids" else (int, float)
            if not all(isinstance(x, kind) and not isinstance(x, bool) for x in data[name]):
                raise ValueError(f"field '{where}.{name}' must be a list of numbers")
        count = data.get("token_count")
        if count is not None and (count < 0 or data["token_ids"]):
            raise ValueError(f"field '{where}.token_count'={count} must be >= 0, and only given when "
                             f"'{where}.token_ids' is empty")
        return cls(**data)

    def completion(self) -> Completion:
        """The stored completion (token_ids None when they were not stored: unknown)."""
        ids = None if self.token_count is not None else list(self.token_ids)
        return Completion(self.text, ids, list(self.logprobs), certainties=list(self.certainties),
                          finish_reason=self.finish_reason, complete=self.complete)


@dataclass
class Pool:
    """N samples of one prompt plus what the shared prompt cost (prefill FLOPs, None when
    unknown, and time; the FLOPs of every prefill of the call when it paid the prompt per
    sample, see `split_flops`).

    reported: the generator's own account of the whole N-sample call — {"prompt_tokens_computed",
    "prompt_tokens_reused", "model_calls"} — or None (not recorded). When
    the generator computed the prompt once for all rows (a local batch), a subset of n costs one
    prefill; when it paid per sample (a server answering n separate requests, some prompt tokens
    served from its prefix cache), a subset costs n/N of what was reported.
    """

    prompt_tokens: int
    prompt_flops: float | None
    prefill_seconds: float
    decode_seconds: float
    samples: list[Sample] = field(default_factory=list)
    reported: dict | None = None

    def to_dict(self) -> dict:
        data = {k: v for k, v in self.__dict__.items() if k != "samples"}
        data["samples"] = [sample.to_dict() for sample in self.samples]
        return data

    @classmethod
    def from_dict(cls, data, where: str = "pool") -> Pool:
        """The inverse of `to_dict`; ValueError naming the field that is missing, unknown or of
        the wrong type (a pool needs at least one sample)."""
        _check_fields(cls, data, where, optional=("reported",))
        reported = data.get("reported")
        if reported is not None and (not isinstance(reported, dict) or set(reported) != set(_REPORTED) or not all(
                isinstance(reported[k], (int, float)) and not isinstance(reported[k], bool) for k in _REPORTED)):
            raise ValueError(f"field '{where}.reported' must be an object with the numbers {', '.join(_REPORTED)}")
        if not data["samples"]:
            raise ValueError(f"field '{where}.samples' is empty: a pool holds at least one sample")
        samples = [Sample.from_dict(sample, f"{where}.samples[{i}]") for i, sample in enumerate(data["samples"])]
        return _resplit(cls(**{**data, "samples": samples}))

    @property
    def models(self) -> int:
        """The models every row's prompt went through (2 for a contrastive pair; `prompt_runs`), 1 unknown."""
        if self.reported is None or not self.prompt_tokens:
            return 1
        rows = self.reported["prompt_tokens_computed"] + self.reported["prompt_tokens_reused"]
        return max(round(rows / (self.prompt_tokens * len(self.samples))), 1)

    @property
    def per_sample(self) -> bool:
        """Whether the generator paid the prompt per sample (or per chunk of samples): it
        computed more prompt tokens per model than one prompt (`prompt_runs`)."""
        if self.reported is None:
            return False
        runs = prompt_runs(self.reported["prompt_tokens_computed"], self.reported["prompt_tokens_reused"],
                           self.prompt_tokens, len(self.samples))
        return runs > self.prompt_tokens

    def subset_cost(self, indices: Sequence[int], prompt_cached: bool = False) -> Cost:
        """The cost of generating exactly these samples in one batched call: one prefill, the
        prompt reused by the other rows, one forward per decode step; or, when the generator paid
        the prompt per sample (`reported` computed more prompt tokens than one prompt), n/N of
        the reported prompt tokens, calls and prompt FLOPs (`prompt_flops` is then the whole
        call's, see `split_flops`): what the n samples cost run alone. Wall time is the pool's
        prefill plus its decode time in proportion to the tokens kept (an estimate). FLOPs are
        unknown (None) when the prompt's or any chosen sample's are.
        prompt_cached: the call repeats a prompt its generator kept (`Generator.keeps_prompt`),
        so every row reuses it: no prefill call, FLOPs or time (pools computed once only; a
        prompt paid per sample is charged as below)."""
        chosen = [self.samples[i] for i in indices]
        per_sample = self.per_sample
        cached = prompt_cached and not per_sample
        share = len(chosen) / len(self.samples)  # a prompt paid per sample: n/N of it (tokens and FLOPs)
        prompt_flops = None if self.prompt_flops is None else self.prompt_flops * (share if per_sample else 1.0)
        parts = [0.0 if cached else prompt_flops, *(s.flops for s in chosen)]
        tokens = sum(s.length for s in chosen)
        pool_tokens = sum(s.length for s in self.samples) or 1
        longest = max((s.length for s in chosen), default=0)
        cost = Cost(
            model_calls=max(longest - 1, 0) if cached else longest,
            prompt_tokens_computed=0 if cached else self.prompt_tokens * self.models,
            prompt_tokens_reused=self.prompt_tokens * self.models * (len(chosen) - (0 if cached else 1)),
            generated_tokens=tokens,
            flops=None if None in parts else sum(parts),
            wall_seconds=(0.0 if cached else self.prefill_seconds) + self.decode_seconds * tokens / pool_tokens,
        )
        if per_sample:
            cost.model_calls = self.reported["model_calls"] * share
            cost.prompt_tokens_computed = self.reported["prompt_tokens_computed"] * share
            cost.prompt_tokens_reused = self.reported["prompt_tokens_reused"] * share
        return cost


def prompt_runs(computed: float, reused: float, prompt_tokens: int, samples: int) -> float:
    """C, the prompt tokens a call of `samples` rows computed per model: `computed` over the
    number of models every row's prompt went through, (computed + reused) / (P · N) rounded
    (each row's prompt is either computed or reused, once per model: 1 for one model, 2 for a
    contrastive pair). P for one prefill shared by the rows, up to N·P for a prompt paid per
    sample. P when nothing was counted."""
    if not computed or not prompt_tokens or not samples:
        return float(prompt_tokens)
    models = max(round((computed + reused) / (prompt_tokens * samples)), 1)
    return computed / models


def _resplit(pool: Pool) -> Pool:
    """`pool` with its FLOPs split again by `split_flops` from their total, when it paid the
    prompt per sample: pools stored before the split counted the prompt's computed tokens C
    (not one prompt's P) kept too much for the prompt; the total is unchanged, and a pool split
    the current way comes back as it was. O(N)."""
    parts = [pool.prompt_flops, *(s.flops for s in pool.samples)]
    if not pool.per_sample or None in parts:
        return pool
    reported = pool.reported
    computed = prompt_runs(reported["prompt_tokens_computed"], reported["prompt_tokens_reused"], pool.prompt_tokens,
                           len(pool.samples))
    fed = [max(s.length - 1, 0) for s in pool.samples]
    total, tokens = sum(parts), computed + sum(fed)
    once = pool.prompt_tokens / (pool.prompt_tokens + sum(fed))  # the old split's prompt share
    if not total or abs(pool.prompt_flops / total - once) > 1e-9 * max(once, 1e-300):
        return pool  # split the current way (or nothing to split): kept exactly as stored
    pool.prompt_flops = total * computed / tokens
    for sample, count in zip(pool.samples, fed):
        sample.flops = total * count / tokens
    return pool


_LATER_FIELDS = ("token_count", "program", "reason", "sandbox_seconds")
_REPORTED = ("prompt_tokens_computed", "prompt_tokens_reused", "model_calls")
_TYPES = {"str": (str,), "int": (int,), "int | None": (int, type(None)), "float": (int, float), "bool": (bool,), "str | None": (str, type(None)),
          "bool | None": (bool, type(None)),
          "float | None": (int, float, type(None)),
          "list[int]": (list,), "list[float]": (list,), "list[Sample]": (list,), "dict | None": (dict, type(None))}


def _check_fields(cls, data, where: str, optional: Sequence[str] = ()) -> None:
    """ValueError unless `data` is an object with exactly the dataclass's fields (those in
    `optional` may be absent), each of its annotated JSON type."""
    if not isinstance(data, dict):
        raise ValueError(f"field '{where}' must be an object, got {type(data).__name__}")
    names = {f.name: f.type for f in fields(cls)}
    unknown = sorted(set(data) - set(names))
    if unknown:
        raise ValueError(f"field '{where}.{unknown[0]}' is not a field of a {cls.__name__.lower()}")
    for name, annotation in names.items():
        if name not in data:
            if name in optional:
                continue
            raise ValueError(f"field '{where}.{name}' is missing")
        kinds = _TYPES[annotation]
        value = data[name]
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            raise ValueError(f"field '{where}.{name}' must be {annotation}, got {type(value).__name__}")


class PoolGenerator(Generator):
    """Serves `pool.samples[indices]` as the completions of the next `generate` call.

    It checks that the strategy asks for exactly len(indices) samples, so a strategy that
    samples more (or twice) is caught instead of silently served stale data. sequential: the
    strategy draws in several calls (adaptive self-consistency, in rounds): each call is served
    the next params.n of `indices`, in order, with that chunk's cost (a prefill per call, or
    only the first call's with `keeps_prompt`: the generator that made the pool kept the
    prompt between calls, `Generator.keeps_prompt`), and one that asks for more than remain is caught; `served` counts the samples handed out. Its capabilities
    are what the pool stores (`stored_capabilities`): token ids, logprobs and certainties
    (FULL_DISTRIBUTIONS), each only when every sample carries it, and STRUCTURED_OUTPUT: the samples were drawn under the
    run's params, constraint included, by the run's generator (checked for it before sampling).
    """

    def __init__(self, pool: Pool, indices: Sequence[int], decode=None, *, sequential: bool = False,
                 keeps_prompt: bool = False) -> None:
        self.pool = pool
        self.indices = list(indices)
        self._decode = decode
        self.sequential = sequential
        self.keeps_prompt = keeps_prompt
        self.calls = 0
        self.served = 0
        self.capabilities = stored_capabilities(pool) | {caps.STRUCTURED_OUTPUT}

    def generate(self, prompt, params, *, generator=None) -> GenerationResult:
        left = len(self.indices) - self.served
        if self.sequential:
            if params.n > left:
                raise RuntimeError(f"strategy asked for n={params.n} more samples, the pool subset has {left} left "
                                   f"of {len(self.indices)}")
        elif self.calls:
            raise RuntimeError("a pooled strategy must sample its candidates in one generate call")
        elif params.n != len(self.indices):
            raise RuntimeError(f"strategy asked for n={params.n} samples, the pool subset has {len(self.indices)}")
        chunk = self.indices[self.served:self.served + params.n]
        cost = self.pool.subset_cost(chunk, prompt_cached=self.keeps_prompt and self.calls > 0)
        self.calls += 1
        self.served += len(chunk)
        completions = [self.pool.samples[i].completion() for i in chunk]
        return GenerationResult(completions, [], cost)

    def decode(self, token_ids: list[int]) -> str:
        if self._decode is None:
            return super().decode(token_ids)
        return self._decode(token_ids)


def stored_capabilities(pool: Pool) -> frozenset[str]:
    """What the samples store, each only when every sample has it: TOKEN_IDS (ids stored for
    every sample with text); LOGPROBS (one logprob per generated token, ids stored or not: a
    server without ids still returns logprobs); FULL_DISTRIBUTIONS (one certainty per token
    id: self-certainty reads both)."""
    samples = pool.samples
    have = set()
    if all(s.length == len(s.logprobs) and (s.length or not s.text) for s in samples):
        have.add(caps.LOGPROBS)
    if all((s.token_ids and s.token_count is None) or not s.text for s in samples):
        have.add(caps.TOKEN_IDS)
        if all(len(s.certainties) == len(s.token_ids) for s in samples):
            have.add(caps.FULL_DISTRIBUTIONS)
    return frozenset(have)


def known_grades(pool: Pool | None) -> dict[str, Grade]:
    """The stored grades of a code problem's pool samples, by text (none without a pool)."""
    if pool is None:
        return {}
    return {s.text: Grade(s.correct, s.reason or "", s.program, s.sandbox_seconds or 0.0) for s in pool.samples}


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


def sample_pool(generator, prompt: str, params: SamplingParams, problem: Problem, config: EvalConfig,
                rng) -> Pool:
    """`config.pool_size` samples of `prompt` in one call (sampled under `params` from the
    torch rng `rng`), each graded: its answer checked, or a code problem's program run against
    its tests (`grade_all`, a few sandbox runs at once); `check_pool` before it is returned."""
    size = config.pool_size
    start = time.perf_counter()
    result = generator.generate(prompt, replace(params, n=size, seed=None), generator=rng)
    wall = time.perf_counter() - start
    prompt_tokens = result.prompt_tokens
    counts = token_counts(result)
    prompt_flops, decode_flops = split_flops(result, prompt_tokens, counts)
    grades = [None] * len(result.completions)
    if problem.is_code:
        grades = grade_all(problem, [c.text for c in result.completions], timeout=config.code_timeout,
                           memory_mb=config.code_memory_mb)
    samples = []
    for completion, flops, count, graded in zip(result.completions, decode_flops, counts, grades):
        ids = completion.token_ids
        if graded is None:
            answer = extract_answer(completion.text, config.options.pattern, config.options.answer_field)
            right, code = correct(answer, problem, config.options), {}
        else:
            answer, right = None, graded.passed
            code = {"program": graded.program, "reason": graded.reason, "sandbox_seconds": round(graded.seconds, 4)}
        samples.append(Sample(completion.text, list(ids or ()), [round(x, 5) for x in completion.logprobs],
                              [round(x, 5) for x in completion.certainties], completion.finish_reason, flops,
                              answer, right, completion.complete,
                              token_count=None if ids is not None else count, **code))
    reported = None
    if result.cost is not None:
        reported = {"prompt_tokens_computed": result.cost.prompt_tokens_computed,
                    "prompt_tokens_reused": result.cost.prompt_tokens_reused, "model_calls": result.cost.model_calls}
    pool = Pool(prompt_tokens, prompt_flops, result.prefill_seconds, wall - result.prefill_seconds, samples, reported)
    check_pool(pool, generator, config)
    return pool


def token_counts(result: GenerationResult) -> list[int]:
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


def split_flops(result: GenerationResult, prompt_tokens: int,
                counts: list[int]) -> tuple[float | None, list[float | None]]:
    """The generator's reported FLOPs F (`result.cost.flops`) split into the prompt's share and
    each completion's, in proportion to the tokens each runs through the model: the C prompt
    tokens the call computed (`cost.prompt_tokens_computed`: P for one prefill, about N·P for a
    server that runs the prompt per sample or per chunk of n) and, for a completion of L tokens
    (`counts`), L − 1 (its last token is never fed back):

        prompt = F · C / T,   completion_i = F · (L_i − 1) / T,   T = C + Σ_i (L_i − 1)

    (exact up to the attention term, which grows with position). C is counted per model
    (`prompt_runs`: a contrastive decoder runs prompt and tokens through two models, so its
    computed prompt tokens are 2·P, but so is every decode token). The prompt's share is that
    of the whole call: `Pool.subset_cost` charges a subset n/N of it when C > P, like its
    tokens. All None when F is unknown."""
    flops = result.cost.flops if result.cost is not None else None
    fed = [max(count - 1, 0) for count in counts]
    if flops is None:
        return None, [None] * len(fed)
    cost = result.cost
    computed = prompt_runs(cost.prompt_tokens_computed, cost.prompt_tokens_reused, prompt_tokens, len(fed))
    total = computed + sum(fed)
    if total == 0:
        return flops, [0.0] * len(fed)
    return flops * computed / total, [flops * tokens / total for tokens in fed]
