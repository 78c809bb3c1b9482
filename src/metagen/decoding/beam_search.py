"""Beam search with length normalization, and stochastic beam search (Gumbel-top-k).

Beam search keeps the `width` highest-scoring prefixes. Each step every live beam is extended
by every token, the 2·width best candidates by cumulative log-probability are scanned in order:
a candidate ending in EOS becomes a finished hypothesis scored
    score = logp / len^α      (length normalization, Wu et al. 2016)
and the others fill the next `width` beams. The search ends when `width` hypotheses are
finished and no live beam can still beat the worst of them, or at `max_tokens`. A live beam's
best possible normalized score is bounded over every length it can still reach
(`_best_reachable`): for α > 0 at `max_tokens` (logp / L^α grows with L for logp < 0), for α ≤ 0
at its current length.
Cost per step: one batched forward of `width` rows plus O(width·V) for the top-k. The result's
`Cost` counts the prefill (`RowBatch.prefill_cost`: one model call, the prompt computed once, its
FLOPs, one target step for its one row), each search step's forward (`cost.forward_cost`: one
model call, its FLOPs, one target step per live beam — each beam's next token is drawn from it,
see `Cost.target_steps`) and the tokens generated. The set-up is every loop's
(`RowBatch.start`: stop rules, sampler chain, the prompt's `Row`, and the memory check of the
2·width candidates a step ranks, naming `width`).

Diverse beam search (Vijayakumar et al. 2018; `groups` G > 1): the width is split into G
groups of width/G beams that advance in turn each step, group g ranking its candidates by
    log p(y) − λ · Δ(y, beams kept this step by groups 0..g−1)
(Δ: `beam_diversity`, Hamming or n-gram), each group otherwise an ordinary beam search; the
hypotheses of every group are ranked together by the model's own normalized score. The same
step serves all groups (one forward of every live beam), so a step costs as plain beam search.

Stochastic beam search (Kool, van Hoof & Welling 2019) replaces the top-k by the Gumbel-top-k
of perturbed log-probabilities: children's Gumbels are conditioned so their max equals the
parent's perturbed score, which makes the `width` final beams a sample *without replacement*
from the model's sequence distribution (at `temperature`). A finished sequence keeps its slot
among the `width` best keys like a live beam (its key no longer changes); the search ends when
every slot is finished. Hypotheses come ordered by key: the first is distributed as one
ancestral sample, the second as a draw from the rest, and so on. Length normalization does not
apply (it would bias the sample).

Beams are forked with `cache.select(parents)`: children share their parent's cached prefix.
What ends a beam is the shared per-row bookkeeping (`decoding.rows`): EOS (unless `ignore_eos`),
`stop_token_ids`, stop strings (the beam is finished, its text cut before the string), a
processor that ends the row, and `max_tokens` / the context (finished=False).

Processors (`processors=`, and the constraint of `config.structured_outputs`) act as masks: a
token a processor sets to -inf never extends a beam; EOS extends one only where the constraint
accepts. Deterministic search then ranks the allowed sequences by the model's own
log-probabilities (log p(y) over valid y, not renormalised per step); stochastic search samples
without replacement from the masked distribution renormalised per step (what the sampling loop
draws from, so its keys stay consistent). A processor that changes finite logits (bias,
penalties) would not be honoured by either and raises. Their state follows the beams: the
candidates fork the parents' rows and accept their token, the kept beams are selected from them.

Several models (`combiner=`, a `decoding.combine.LogitsCombiner`; contrastive decoding as Li et
al. 2023 search it): the combiner's companions run on the beams' rows (`RowBatch`: their caches
forked with the beams', their forwards in the step's `Cost`), and a beam accumulates the
combined score of each token it takes — for `ContrastiveConfig`, Σ_t (log p_exp − log p_ama)
over the α-plausible tokens — instead of the model's log-probability (the records keep the
model's own log-probs). Such a score can grow with length, so the early stop bound above does not
hold: a search with a combiner runs until its beams end or reach `max_tokens`. Stochastic
search samples from softmax(combined scores / temperature) per step.

Completeness: a hypothesis cut by `max_tokens` / the context (or left alive when the search
ended) where a processor does not accept it has `complete=False` (a JSON object not yet closed).
Hypotheses are ranked by (complete first, then score): an incomplete one never comes before a
complete one, whatever its score, and only complete hypotheses count towards the `width`
finished ones that end the deterministic search early.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch

from metagen.decoding.batch import RowBatch
from metagen.decoding.beam_diversity import DIVERSITY_KINDS, StepSelections
from metagen.decoding.combine import LogitsCombiner
from metagen.decoding.cost import Cost
from metagen.decoding.prompts import Prompt, encode_prompt
from metagen.decoding.records import TokenRecord
from metagen.decoding.result import Completion, GenerationResult
from metagen.decoding.rows import Row
from metagen.sampling import LogitsProcessor, SamplerChain, SamplingParams

if TYPE_CHECKING:
    from metagen.structured.spec import StructuredOutputs


@dataclass(frozen=True)
class BeamSearchConfig:
    """width: beams kept per step; length_penalty: α in logp / len^α (0 = raw sum);
    max_tokens: new tokens at most; n_best: hypotheses returned (≤ width);
    stochastic: Gumbel-top-k instead of top-k (sampling without replacement);
    temperature: divides logits before the Gumbel perturbation (stochastic only);
    stop, stop_token_ids, ignore_eos: what ends a beam besides EOS, as in `SamplingParams`;
    structured_outputs / response_format: a constraint every hypothesis must satisfy, as in
    `SamplingParams` (vLLM's and OpenAI's names; checked and compiled on construction);
    groups: diverse beam search's G, dividing `width` (1 = plain beam search; deterministic only);
    diversity_penalty: λ ≥ 0 of the diversity term (needs groups > 1); diversity: "hamming" or
    "ngram"; diversity_ngram: n of the n-gram diversity (see `beam_diversity`)."""

    width: int = 4
    length_penalty: float = 1.0
    max_tokens: int = 64
    n_best: int = 1
    stochastic: bool = False
    temperature: float = 1.0
    stop: str | Sequence[str] = ()
    stop_token_ids: Sequence[int] = ()
    ignore_eos: bool = False
    structured_outputs: StructuredOutputs | Mapping[str, object] | None = None
    response_format: Mapping[str, object] | None = None
    groups: int = 1
    diversity_penalty: float = 0.0
    diversity: str = "hamming"
    diversity_ngram: int = 2

    def __post_init__(self) -> None:
        if self.width < 1:
            raise ValueError(f"width={self.width} is out of range: must be >= 1")
        self._check_groups()
        if not 1 <= self.n_best <= self.width:
            raise ValueError(f"n_best={self.n_best} is out of range: must be in [1, width={self.width}]")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens={self.max_tokens} is out of range: must be >= 1")
        if self.temperature <= 0:
            raise ValueError(f"temperature={self.temperature} is out of range: must be > 0")
        # The same checks (and normal forms) as SamplingParams' fields of these names.
        checked = self.sampling_params()
        for name in ("stop", "stop_token_ids", "structured_outputs", "response_format"):
            object.__setattr__(self, name, getattr(checked, name))

    def _check_groups(self) -> None:
        """ValueError naming the field for a diverse beam search setting out of range."""
        if not 1 <= self.groups <= self.width or self.width % self.groups:
            raise ValueError(f"groups={self.groups} is out of range: must divide width={self.width}")
        if self.diversity_penalty < 0 or not math.isfinite(self.diversity_penalty):
            raise ValueError(f"diversity_penalty={self.diversity_penalty} is out of range: must be finite and >= 0")
        if self.diversity not in DIVERSITY_KINDS:
            raise ValueError(f"diversity={self.diversity!r} is out of range: must be one of "
                             f"{', '.join(DIVERSITY_KINDS)}")
        if self.diversity_ngram < 1:
            raise ValueError(f"diversity_ngram={self.diversity_ngram} is out of range: must be >= 1")
        if self.diversity_ngram != 2 and self.diversity != "ngram":
            raise ValueError(f"diversity_ngram={self.diversity_ngram} applies to diversity='ngram' only "
                             f"(diversity={self.diversity!r})")
        if self.diversity_penalty > 0 and self.groups == 1:
            raise ValueError(f"diversity_penalty={self.diversity_penalty} needs groups > 1 (groups=1): "
                             "the penalty acts between groups")
        if self.stochastic and self.groups > 1:
            raise ValueError(f"groups={self.groups} is out of range for stochastic=True: must be 1 "
                             "(diverse beam search is deterministic)")

    def sampling_params(self) -> SamplingParams:
        """The `SamplingParams` of the fields beam search shares with sampling (their checks, the
        constraint compiled once; ValueError names the field): one row of `max_tokens`."""
        return SamplingParams(max_tokens=self.max_tokens, stop=self.stop, stop_token_ids=self.stop_token_ids, ignore_eos=self.ignore_eos,
                              structured_outputs=self.structured_outputs, response_format=self.response_format)


def _normalized(logprob: float, length: int, alpha: float) -> float:
    return logprob / (max(length, 1) ** alpha)


def _gumbel_children(parent_perturbed: torch.Tensor, logprobs: torch.Tensor, generator) -> torch.Tensor:
    """Perturbed scores of children conditioned on max = the parent's (Kool et al. 2019, eq. 23).

    parent_perturbed: (B,); logprobs: (B, V) cumulative log-probs of the children. Returns (B, V).
    """
    uniform = torch.rand(logprobs.shape, generator=generator).clamp_(1e-12, 1 - 1e-12)
    gumbel = logprobs - torch.log(-torch.log(uniform))  # G_φ ~ Gumbel(φ)
    top = gumbel.max(dim=-1, keepdim=True).values
    target = parent_perturbed[:, None]
    # shifted = −log(exp(−T) − exp(−Z) + exp(−G)), computed stably
    v = target - gumbel + torch.log1p(-torch.exp(gumbel - top))
    return target - torch.clamp(v, min=0) - torch.log1p(torch.exp(-v.abs()))


def beam_search(
    model,
    prompt: Prompt,
    config: BeamSearchConfig | None = None,
    *,
    chat: bool | None = None,
    generator: torch.Generator | None = None,
    processors: Sequence[LogitsProcessor] = (),
    combiner: LogitsCombiner | None = None,
) -> GenerationResult:
    """Run (stochastic) beam search; returns `config.n_best` hypotheses as completions, best first
    (complete ones before incomplete ones), with the search's `Cost`. `processors`: masks (constraints) with their state after the prompt
    for one row; `config.structured_outputs` adds the constraint's processor before them.
    `combiner`: beams ranked by the combined scores of the model and its companions (module
    docstring; `ContrastiveConfig`: contrastive decoding's beam search)."""
    started = time.perf_counter()
    config = config or BeamSearchConfig()
    prompt_ids = encode_prompt(model.tokenizer, prompt, chat, vocab_size=model.vocab_size)
    # The prompt's one row, set up as every loop's; 2·width candidates per step in the memory check.
    batch = RowBatch.start(model, prompt_ids, config.sampling_params(), processors, generator=generator,
                           forward_rows=2 * config.width, what="width", combiner=combiner)
    beams = _Beams(model, config, batch.rows[0], batch.chain)
    _, out = batch.prefill()
    cost = batch.prefill_cost()
    prefill_seconds = time.perf_counter() - started
    if config.stochastic:  # without a generator, fresh OS entropy (`RowBatch.start`)
        ranked = _stochastic_search(batch, out.logits, config, beams, batch.generator, cost, len(prompt_ids))
    else:
        ranked = _search(batch, out.logits, config, beams, cost, len(prompt_ids))
    cost.wall_seconds = time.perf_counter() - started
    return GenerationResult(ranked, prompt_ids, cost, prefill_seconds=prefill_seconds,
                            decode_seconds=cost.wall_seconds - prefill_seconds)


class _Beams:
    """The live beams' rows (text, stops) and processor state, and how candidates extend them."""

    def __init__(self, model, config: BeamSearchConfig, row: Row, chain: SamplerChain) -> None:
        self.model, self.config = model, config
        self.rows, self.chain = [row], chain
        self.log_vocab = math.log(model.vocab_size)
        self.pending: list[SamplerChain] = []  # this step's candidates' processor state, per `extend`
        self.accepts: list[bool | None] = []  # this step's candidates: the processors' verdict (complete)

    def scores(self, logits: torch.Tensor, combined: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(model log-probs, masked scores) of the live beams' next tokens, both (B, V): the
        scores are the model's log-probs, or `combined` (a combiner's scores, (B, V)) when given,
        -inf where a processor removed the token."""
        logprobs = torch.log_softmax(logits, dim=-1)
        ranked = logprobs if combined is None else combined
        if not self.chain.processors:
            return logprobs, ranked
        processed = self.chain.process(logits if combined is None else combined)
        changed = torch.isfinite(processed) & (processed != (logits if combined is None else combined))
        if bool(changed.any()):
            raise ValueError(f"beam search takes processors as masks (scores stay the model's log-probabilities): "
                             f"{', '.join(self.chain.names)} changed finite logits")
        return logprobs, ranked.masked_fill(processed == float("-inf"), float("-inf"))

    def extend(self, logprobs: torch.Tensor, parents: list[int], tokens: list[int]) -> list[Row]:
        """The candidates' rows: each parent's row forked and pushed its token, with the verdict
        of the processors after it. Several calls in one step (one per group) add to the step's
        candidates; `keep` then chooses among all of them, numbered in the order extended."""
        chain = self.chain
        if self.chain.stateful:
            chain = self.chain.fork(torch.tensor(parents, dtype=torch.long))
            chain.accept(torch.tensor(tokens, dtype=torch.long))
            self.pending.append(chain)
        certainties = (-self.log_vocab - logprobs.mean(dim=-1)).tolist()
        chosen = logprobs[parents, tokens].tolist() if parents else []
        rows = []
        for i, (parent, token) in enumerate(zip(parents, tokens)):
            row = self.rows[parent].fork()
            verdict = chain.stop_verdict(i)
            row.push(token, TokenRecord(chosen[i], 0.0, certainties[parent], None), verdict)
            self.accepts.append(verdict[0])
            rows.append(row)
        return rows

    def verdict(self, beam: int) -> bool | None:
        """Whether the processors accept live beam `beam` as it stands (None: no opinion)."""
        return self.chain.stop_verdict(beam)[0]

    def keep(self, candidates: list[int], rows: list[Row]) -> None:
        """The next live beams are these candidates (indices into this step's `extend`s)."""
        self.rows = rows
        if self.chain.stateful:
            chain = self.pending[0] if len(self.pending) == 1 else SamplerChain.concat(self.pending)
            chain.select(torch.tensor(candidates, dtype=torch.long))
            self.chain = chain
        self.pending, self.accepts = [], []


def _ended(row: Row) -> bool:
    """Ended for good (EOS, a stop token or string, a processor) rather than cut by length."""
    return row.completion.finish_reason == "stop"


def _hypothesis(row: Row, score: float, complete: bool | None = None) -> Completion:
    """The hypothesis of `row` with its `score`; `complete`: the processors' verdict for a row
    still alive (a row that ended carries its own). A copy: the row's lists are not shared."""
    completion = row.completion
    return replace(completion, text=completion.text if row.finished else row.full_text,
                   token_ids=list(completion.token_ids), logprobs=list(completion.logprobs),
                   sampling_logprobs=list(completion.sampling_logprobs), certainties=list(completion.certainties),
                   complete=completion.complete if row.finished else complete, score=score)


def _ranked(hypotheses: list[Completion], n_best: int) -> list[Completion]:
    """The n_best hypotheses, complete ones first, each group by score (best first)."""
    return sorted(hypotheses, key=lambda h: (h.complete is not False, h.score), reverse=True)[:n_best]


def _best_reachable(logprob: float, length: int, longest: int, alpha: float) -> float:
    """An upper bound on logp(y′) / |y′|^α over every hypothesis y′ a live beam can still give:
    the beam (`length` tokens, cumulative `logprob` ≤ 0) itself or any extension of it up to
    `longest` tokens. Each token adds log p ≤ 0, so logp(y′) ≤ logprob and, with L = |y′| in
    [length, longest]:
        α > 0:  logp(y′) / L^α ≤ logprob / L^α ≤ logprob / longest^α   (grows with L when < 0)
        α = 0:  logp(y′) ≤ logprob
        α < 0:  logp(y′) · L^|α| ≤ logprob · L^|α| ≤ logprob · length^|α|   (shrinks with L)
    Taking it at the current length when α > 0 is no bound: the search stopped before a longer
    hypothesis that would have won."""
    return _normalized(logprob, longest if alpha > 0 else length, alpha)


def _done(finished: list[Completion], width: int, live_bound: float) -> bool:
    """A search of `width` beams is over when `width` complete hypotheses are finished and the
    worst of the best `width` beats every live beam's `_best_reachable` score (`live_bound`)."""
    complete = sorted(h.score for h in finished if h.complete is not False)
    return len(complete) >= width and live_bound < complete[-width]


def _scan(rows: list[Row], totals: list[float], width: int, finished: list[Completion], alpha: float,
          cost: Cost) -> list[int]:
    """The ranks of the candidates (best first) that become the next `width` beams; a candidate
    that ended among the first `width` is a finished hypothesis, appended to `finished`."""
    chosen = []
    for rank, (row, total) in enumerate(zip(rows, totals)):
        if not _ended(row):
            chosen.append(rank)
            if len(chosen) == width:
                break
        elif rank < width:  # an ending below the top `width` would not have been a beam
            finished.append(_hypothesis(row, _normalized(total, len(row.completion.token_ids), alpha)))
            cost.generated_tokens += 1
    cost.generated_tokens += len(chosen)
    return chosen


def _search(batch: RowBatch, logits: torch.Tensor, config: BeamSearchConfig, beams: _Beams, cost: Cost,
            position: int) -> list[Completion]:
    """Deterministic (diverse) beam search from the prefilled `batch` (`logits` (1, V): the
    prompt's `position` tokens); the n_best hypotheses, its forwards and tokens added to `cost`.

    G = `config.groups` groups of width/G beams, all starting from the prompt, advance in turn
    each step on one batched forward of every live beam; group g ranks its candidates by
    log p − λ·Δ (`beam_diversity`), Δ against the beams groups 0..g−1 kept this step. Each
    group is otherwise a plain beam search: it finishes its hypotheses and stops on its own (its
    width/G complete hypotheses all beat `_best_reachable` of its live beams). Hypotheses of all
    groups are ranked together by the model's score. G = 1 is plain beam search.
    With a combiner there is no early stop (module docstring).
    """
    alpha, per_group = config.length_penalty, config.width // config.groups
    longest = beams.rows[0].rules.max_new_tokens
    penalty = config.diversity_penalty
    sums = torch.zeros(1)  # (B,) cumulative log-probs of live beams
    members = [[0] for _ in range(config.groups)]  # each group's live beams (indices into `sums`)
    finished: list[list[Completion]] = [[] for _ in members]  # each group's hypotheses
    step = 0
    while any(members):
        step += 1
        logprobs, allowed = beams.scores(logits, batch.scores(logits) if batch.combiner else None)  # (B, V)
        vocab = allowed.shape[1]
        selections = StepSelections(config.diversity, config.diversity_ngram, vocab) if penalty else None
        next_members: list[list[int]] = [[] for _ in members]
        kept, next_rows, next_sums, parents, tokens = [], [], [], [], []
        extended = 0  # candidates of this step so far (every group's)
        for group, beams_of_group in enumerate(members):
            if not beams_of_group:
                continue
            candidates = sums[beams_of_group, None] + allowed[beams_of_group]  # (B/G, V) model scores
            ranked = candidates
            if selections is not None:
                delta = selections.penalty([beams.rows[b].completion.token_ids for b in beams_of_group])
                ranked = candidates if delta is None else candidates - penalty * delta  # (B/G, V)
            top = torch.topk(ranked.reshape(-1), min(2 * per_group, ranked.numel()))
            flat = [index for value, index in zip(top.values.tolist(), top.indices.tolist()) if value > float("-inf")]
            group_parents = [beams_of_group[index // vocab] for index in flat]
            group_tokens = [index % vocab for index in flat]
            totals = candidates.reshape(-1)[flat].tolist()
            rows = beams.extend(logprobs, group_parents, group_tokens)
            chosen = _scan(rows, totals, per_group, finished[group], alpha, cost)  # ranks of its next beams
            live_bound = max((_best_reachable(totals[r], step, longest, alpha) for r in chosen), default=None)
            if live_bound is not None and batch.combiner is None and _done(finished[group], per_group, live_bound):
                finished[group] += [_hypothesis(rows[r], _normalized(totals[r], step, alpha),
                                         complete=beams.accepts[extended + r]) for r in chosen]
                chosen = []
            for rank in chosen:
                next_members[group].append(len(next_rows))
                kept.append(extended + rank)
                next_rows.append(rows[rank])
                next_sums.append(totals[rank])
                parents.append(group_parents[rank])
                tokens.append(group_tokens[rank])
                if selections is not None:
                    selections.add(beams.rows[group_parents[rank]].completion.token_ids, group_tokens[rank])
            extended += len(rows)
        if not kept:  # every group ended
            beams.rows = []
            break
        beams.keep(kept, next_rows)
        sums, members = torch.tensor(next_sums), next_members
        if next_rows[0].finished:  # max_tokens / the context: every live beam has as many tokens
            break
        batch.select_rows(parents)
        logits, step_cost = batch.forward(torch.tensor(tokens)[:, None], [position + step - 1] * len(kept))
        cost += step_cost  # one target step per live beam
    hypotheses = [hypothesis for group in finished for hypothesis in group]
    for b, (row, total) in enumerate(zip(beams.rows, sums.tolist())):
        hypotheses.append(_hypothesis(row, _normalized(total, len(row.completion.token_ids), alpha),
                                      complete=beams.verdict(b)))
    return _ranked(hypotheses, config.n_best)


def _stochastic_search(
    batch: RowBatch, logits: torch.Tensor, config: BeamSearchConfig, beams: _Beams, generator: torch.Generator,
    cost: Cost, position: int
) -> list[Completion]:
    """Stochastic beam search (Kool et al. 2019) from the prefilled `batch` (`logits` (1, V): the
    prompt's `position` tokens); the n_best hypotheses by key, its forwards and tokens added to `cost`.

    φ(y) = log q(y), q the model at `temperature` (masked and renormalised per step when
    processors remove tokens; q ∝ exp(combined scores / temperature) with a combiner); a beam's key is its perturbed G_φ(y). Each step the `width`
    largest keys among the children of live beams and the finished sequences keep a slot. Cost
    per step: one forward of ≤ width rows plus O(width·V).
    """
    width = config.width
    phis = torch.zeros(1)  # (B,) tempered log-probs φ of live beams
    keys = torch.zeros(1)  # (B,) perturbed scores G_φ of live beams
    finished: list[Completion] = []  # score = key
    while beams.rows:
        combined = batch.scores(logits) if batch.combiner else None
        logprobs, allowed = beams.scores(logits, combined)  # (B, V)
        step = torch.log_softmax((logits if combined is None else combined) / config.temperature, dim=-1)
        if allowed is not logprobs:  # renormalise over the allowed tokens (a combiner's -inf included)
            step = torch.log_softmax(step.masked_fill(allowed == float("-inf"), float("-inf")), dim=-1)
        tempered = phis[:, None] + step  # (B, V)
        child_keys = _gumbel_children(keys, tempered, generator)  # (B, V)
        vocab = child_keys.shape[1]
        top = torch.topk(child_keys.reshape(-1), min(width, child_keys.numel()))
        # The `width` best of finished sequences and children, by key.
        children = [(key, index) for key, index in zip(top.values.tolist(), top.indices.tolist())
                    if key > float("-inf")]
        entries = sorted([(h.score, h) for h in finished] + children, key=lambda entry: entry[0], reverse=True)[:width]
        chosen = [(key, divmod(entry, vocab)) for key, entry in entries if not isinstance(entry, Completion)]
        finished = [entry for _, entry in entries if isinstance(entry, Completion)]
        parents = [parent for _, (parent, _) in chosen]
        tokens = [token for _, (_, token) in chosen]
        rows = beams.extend(logprobs, parents, tokens)
        kept, next_rows, next_keys = [], [], []
        for i, (row, (key, _)) in enumerate(zip(rows, chosen)):
            if _ended(row):
                finished.append(_hypothesis(row, key))
            else:
                kept.append(i)
                next_rows.append(row)
                next_keys.append(key)
        cost.generated_tokens += len(rows)
        if not kept:
            break
        if next_rows[0].finished:  # max_tokens / the context
            finished += [_hypothesis(row, key) for row, key in zip(next_rows, next_keys)]
            break
        beams.keep(kept, next_rows)
        parent_index = torch.tensor([parents[i] for i in kept])
        token_index = torch.tensor([tokens[i] for i in kept])
        phis = tempered[parent_index, token_index]
        keys = torch.tensor(next_keys)
        batch.select_rows(parent_index.tolist())
        logits, step_cost = batch.forward(token_index[:, None], [position] * len(kept))
        cost += step_cost  # one target step per live beam
        position += 1
    return _ranked(finished, config.n_best)
