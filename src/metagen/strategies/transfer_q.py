"""Transfer Q* (Chakraborty et al. 2024, "Transfer Q Star: Principled Decoding for LLM Alignment").

The aligned policy of the KL-regularised objective max E[r] − β·KL(π ‖ π_ref) is, token by token,

    π*(z | x, y) ∝ π_ref(z | x, y) · exp(Q*(x, y∘z) / β)

and Transfer Q* estimates Q* with an aligned baseline model π_BL (a different model sharing the
tokenizer) instead of training a value: from the state [x, y, z] the baseline continues m times
for at most L tokens (greedy or sampled) and the reward reads each whole sequence,

    Q̂(x, y∘z) = (1/m) Σ_i r(x, y∘z∘τ_i),            τ_i ~ π_BL(· | x, y∘z)      (direct transfer)
    Q̂(x, y∘z) = Σ_i w_i r(x, y∘z∘τ_i) / Σ_i w_i,     w_i = exp((r − r_BL)(x, y∘z∘τ_i) / α)

The second line is indirect transfer, for a baseline aligned to another reward r_BL: if π_BL is
the KL(·‖π_ref)-optimum for r_BL with weight α, the continuation ratio π*_r / π_BL is
∝ exp((r − r_BL)/α), and self-normalising over the m rollouts removes its unknown constant
(Chakraborty et al.'s importance-weighted estimate). It needs r_BL and α; without them the
transfer is direct.

Decoding is tokenwise controlled decoding (`tokenwise_cd`) with this value: at every position
the top-k tokens of π_ref (after the request's processors) are valued by Q̂, and the token is
argmax_z log π_ref(z) + Q̂(z)/β (choice "argmax", the paper's) or drawn from softmax of the same
over the k (choice "sample"). β = inf is the reference alone.

The baseline keeps its own cache: the prompt once, then per step one ragged forward that feeds
each candidate state's new tokens from the state it continues (the previous step's chosen
candidate, held as a snapshot: a page-table hold, no K/V copy), the m·k·B rollout rows forked
from them, and one forward per rollout token. Cost per decoded token, B rows: the reference's
B·k candidate rows (tokenwise CD), plus 1 + L baseline forwards over up to B·k·m rows and one
reward call over B·k·m sequences; all of them land in the one `Cost` (model calls, FLOPs; the
baseline's and the reward's FLOPs also in `scorer_flops`). Rollouts end at an EOS / stop token
or at max_tokens; stop strings are not looked for inside them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import TYPE_CHECKING

from metagen.decoding import capabilities as caps
from metagen.sampling import SamplingParams
from metagen.scoring.answers import check_answer_field
from metagen.scoring.process_reward import PrefixValue, Values
from metagen.strategies.options import check_options, configure, option
from metagen.strategies.spec import StrategySpec, register, shared

if TYPE_CHECKING:
    import torch

    from metagen.decoding.prompts import Prompt


@dataclass(frozen=True)
class TransferQConfig:
    """n: samples drawn; top_k: k; kl_beta: β; rollouts: m; rollout_tokens: L; rollout: how the
    baseline continues; choice: argmax or sample over the k; baseline / baseline_value: the
    spellings the registry's runner loads (the Python call takes the objects);
    baseline_alpha: α of indirect transfer; params: max_tokens, stop tokens and the processors
    forming π_ref."""

    n: int = option(1, int, "samples drawn (rows decoded together)", low=1, sizes_work=True)
    top_k: int = option(10, int, "k, tokens of the reference valued by Q̂ at each position", low=1, sizes_work=True)
    kl_beta: float = option(1.0, float, "β of π_ref · exp(Q̂ / β) (inf: the reference alone)", above=0)
    rollouts: int = option(1, int, "m, baseline rollouts averaged into Q̂ per candidate token", low=1,
                           sizes_work=True)
    rollout_tokens: int = option(16, int, "L, tokens per baseline rollout (0: the reward of the prefix)", low=0)
    rollout: str = option("greedy", str, "how the baseline continues a candidate: greedy, or sample at "
                          "temperature 1", choices=("greedy", "sample"))
    choice: str = option("argmax", str, "take the mode of π_ref · exp(Q̂ / β) over the k (argmax) or draw "
                         "from it (sample)", choices=("argmax", "sample"))
    baseline: str | None = option(None, str, "the aligned baseline model: early-exit:L, a model as --model "
                                  "takes it, or 'embedded' (default: the model itself)", optional=True)
    baseline_value: str | None = option(None, str, "indirect transfer: r_BL, the reward the baseline was "
                                        "aligned to, spelled as --value (with baseline_alpha)", optional=True)
    baseline_alpha: float | None = option(None, float, "indirect transfer: α, the baseline's KL weight "
                                          "(with baseline_value)", optional=True, above=0)
    params: SamplingParams = SamplingParams(temperature=1.0, max_tokens=256)
    pattern: str | None = shared("pattern")
    answer_field: str | None = shared("answer_field")

    def __post_init__(self) -> None:
        check_options(self)
        check_answer_field(self.pattern, self.answer_field)
        if (self.baseline_value is None) != (self.baseline_alpha is None):
            raise ValueError(f"baseline_value={self.baseline_value!r}, baseline_alpha={self.baseline_alpha!r}: "
                             "indirect transfer needs both (r_BL and the baseline's α), direct transfer neither")


class RolloutQ(PrefixValue):
    """Q̂(x, y∘z) of the module docstring as a `PrefixValue`: `values(prompt_ids, continuations)`
    with continuations y∘z, in a batch of N; each costs up to m·L baseline tokens and m rewards.

    baseline: the LanguageModel rolling out; reward: a PrefixValue of whole sequences (text or
    ids; not one reading hidden states); baseline_reward, alpha: indirect transfer (None: direct);
    max_tokens: no rollout runs past this many completion tokens; stop_ids: the tokens ending one.
    Call `close` when done (it releases the cached states)."""

    def __init__(self, baseline, reward: PrefixValue, config: TransferQConfig, *, stop_ids=frozenset(),
                 baseline_reward: PrefixValue | None = None, generator: torch.Generator | None = None) -> None:
        for value in (reward, baseline_reward):
            if value is not None and value.needs_hidden:
                raise ValueError(f"{type(value).__name__} reads hidden states, but Transfer Q*'s reward scores "
                                 "finished rollouts: give a reward of the sequences (a Scorer, --value steps, "
                                 "judge, prm:PATH or reward:URL)")
        if (baseline_reward is None) != (config.baseline_alpha is None):
            raise ValueError("indirect transfer needs baseline_reward and config.baseline_alpha together")
        self.baseline, self.reward, self.baseline_reward = baseline, reward, baseline_reward
        self.config, self.stop_ids, self.generator = config, frozenset(stop_ids), generator
        self.cache = None
        self._states: dict[tuple[int, ...], tuple[object, torch.Tensor]] = {}  # prefix → (snapshot, logits (V,))

    def values(self, prompt_ids, continuations, hidden=None) -> Values:
        import torch

        from metagen.decoding.cost import Cost, prefill_cost

        cost = Cost()
        if self.cache is None:  # the prompt, once
            self.cache, out = self.baseline.prefill(list(prompt_ids), batch_size=1)
            self._states[()] = (self.cache.snapshot(0), out.logits[0])
            cost += prefill_cost(self.baseline, len(prompt_ids), produced=False)
        unique = list(dict.fromkeys(tuple(c) for c in continuations))
        logits, forward_cost = self._advance(len(prompt_ids), unique)  # (U, V): each state's next token
        cost += forward_cost
        row_of = {key: u for u, key in enumerate(unique)}
        sequences, owners = self._rollouts(len(prompt_ids), unique, [row_of[tuple(c)] for c in continuations],
                                           logits, cost)
        rewards = self._score(prompt_ids, sequences, self.reward, cost)
        weights = [1.0] * len(sequences)
        if self.baseline_reward is not None:  # indirect transfer: w = exp((r − r_BL) / α), self-normalised
            baseline_rewards = self._score(prompt_ids, sequences, self.baseline_reward, cost)
            weights = [(r - b) / self.config.baseline_alpha for r, b in zip(rewards, baseline_rewards)]  # log w
        groups: list[list[int]] = [[] for _ in continuations]  # the sequences of each continuation
        for i, owner in enumerate(owners):
            groups[owner].append(i)
        estimates = []
        for mine in groups:
            r = torch.tensor([rewards[i] for i in mine], dtype=torch.float64)
            if self.baseline_reward is None:
                estimates.append(float(r.mean()))
            else:
                w = torch.softmax(torch.tensor([weights[i] for i in mine], dtype=torch.float64), 0)
                estimates.append(float(w @ r))
        cost.scorer_flops = cost.flops
        return Values(estimates, cost)

    def _advance(self, prompt_length: int, unique: list[tuple[int, ...]]):
        """Bring the cache to the U states `unique` (each from its longest cached prefix, one
        ragged forward), keep them as the new cached states; their next-token logits (U, V)."""
        from metagen.decoding.cost import Cost, forward_cost

        bases = []
        for key in unique:
            cut = len(key) - 1
            while key[:cut] not in self._states:  # the previous step's candidate, else a shorter prefix
                cut -= 1
            bases.append(key[:cut])
        self.cache.restore([self._states[base][0] for base in bases])
        cost = Cost(prompt_tokens_reused=sum(prompt_length + len(base) for base in bases))
        out = self.baseline.forward(self.cache, [list(key[len(base):]) for key, base in zip(unique, bases)])
        cost += forward_cost(self.baseline, [prompt_length + len(base) for base in bases],
                             [len(key) - len(base) for key, base in zip(unique, bases)], produced=False)
        old, prompt_state = self._states, self._states.pop(())
        self._states = {(): prompt_state}
        for u, key in enumerate(unique):
            self._states[key] = (self.cache.snapshot(u), out.logits[u])
        for snapshot, _ in old.values():
            self.cache.release(snapshot)
        return out.logits, cost

    def _rollouts(self, prompt_length: int, unique, rows: list[int], logits, cost):
        """m continuations of at most L tokens from each continuation's state (row `rows[j]` of
        the cache): (the sequences y∘z∘τ, the continuation each belongs to). A continuation that
        already ended (a stop token, max_tokens) is its own single sequence. Adds the forwards to
        `cost`."""
        import torch

        from metagen.decoding.cost import forward_cost

        m, max_tokens = self.config.rollouts, self.config.params.max_tokens
        sequences, owners, sources = [], [], []
        for j, u in enumerate(rows):
            key = unique[u]
            room = min(self.config.rollout_tokens, max_tokens - len(key),
                       self.baseline.max_context - prompt_length - len(key))
            ended = key[-1] in self.stop_ids or room <= 0
            for _ in range(1 if ended else m):
                sequences.append(list(key))
                owners.append(j)
                if not ended:
                    sources.append((len(sequences) - 1, u, room))
        if not sources:
            return sequences, owners
        self.cache.select([u for _, u, _ in sources])
        live = [(index, room) for index, _, room in sources]  # (sequence, tokens it may still take)
        logits = logits[[u for _, u, _ in sources]]  # (R, V)
        while live:
            if self.config.rollout == "greedy":
                tokens = torch.argmax(logits, dim=-1)  # (R,)
            else:
                probs = torch.softmax(logits.double(), dim=-1)
                tokens = torch.multinomial(probs, 1, generator=self.generator).squeeze(1)
            going = []
            for r, ((index, room), token) in enumerate(zip(live, tokens.tolist())):
                sequences[index].append(token)
                if token not in self.stop_ids and room > 1:
                    going.append(r)
            if not going:
                break
            self.cache.select(going)  # ended rollouts leave; the rest take their token
            starts = [prompt_length + len(sequences[live[r][0]]) - 1 for r in going]
            out = self.baseline.forward(self.cache, tokens[going].reshape(-1, 1))
            cost += forward_cost(self.baseline, starts, produced=False)
            live = [(live[r][0], live[r][1] - 1) for r in going]
            logits = out.logits
        return sequences, owners

    @staticmethod
    def _score(prompt_ids, sequences, reward: PrefixValue, cost) -> list[float]:
        scored = reward.values(prompt_ids, sequences)
        cost += scored.cost
        return list(scored.values)

    def close(self) -> None:
        """Release every cached state (the value can be used again: it prefills anew)."""
        for snapshot, _ in self._states.values():
            self.cache.release(snapshot)
        self._states, self.cache = {}, None


def transfer_q(model, prompt: Prompt, reward, config: TransferQConfig | None = None, *, baseline=None,
               baseline_reward=None, chat: bool | None = None, rng: torch.Generator | None = None):
    """Decode `config.n` sequences with Transfer Q* (module docstring). model: π_ref; reward: r,
    a `PrefixValue` of whole sequences or a `Scorer` (or a function (prompt_text, candidate) ->
    float); baseline: π_BL, a LanguageModel with `model`'s tokenizer (None: `model` itself);
    baseline_reward: r_BL of indirect transfer (with config.baseline_alpha), as `reward`.
    Returns tokenwise CD's GenerationResult, each candidate's score its last chosen Q̂."""
    import torch

    from metagen.decoding.combine import check_same_vocabulary
    from metagen.decoding.memory import check_batch_fits
    from metagen.strategies.tokenwise_cd import TokenwiseCDConfig, tokenwise_cd

    config = config or TransferQConfig()
    baseline = model if baseline is None else baseline
    check_same_vocabulary(model, baseline)
    k = min(config.top_k, model.vocab_size)
    check_batch_fits(baseline, config.n * k * config.rollouts, config.params.max_tokens,
                     what="n·top_k·rollouts")  # the rollout rows of one step
    rng = rng if rng is not None else config.params.make_generator()
    stop_ids = set(config.params.stop_token_ids or ()) | (set() if config.params.ignore_eos else set(model.eos_token_ids))
    value = RolloutQ(baseline, _as_value(reward, prompt, model), config, stop_ids=stop_ids, generator=rng,
                     baseline_reward=None if baseline_reward is None else _as_value(baseline_reward, prompt, model))
    strength = 0.0 if math.isinf(config.kl_beta) else 1.0 / config.kl_beta
    decoding = TokenwiseCDConfig(n=config.n, top_k=config.top_k, strength=strength, choice=config.choice,
                                 params=config.params, pattern=config.pattern, answer_field=config.answer_field)
    try:
        with torch.no_grad():
            return tokenwise_cd(model, prompt, value, decoding, chat=chat, rng=rng)
    finally:
        value.close()


def _as_value(reward, prompt, model) -> PrefixValue:
    """`reward` as a PrefixValue: itself, or a Scorer / scoring function read on the decoded text."""
    from metagen.scoring.process_reward import ScorerValue

    return reward if isinstance(reward, PrefixValue) else ScorerValue(reward, prompt, model.tokenizer)


@lru_cache(maxsize=2)
def _load_baseline(spec: str, model):
    from metagen.decoding.companion_models import load_companion

    return load_companion(spec, model, kv_dtype=getattr(model, "kv_dtype", None), where="baseline")


def _runner(generator, prompt, n, params, options, rng, overrides):
    from metagen.strategies.tree.runner import make_value

    config = configure(TransferQConfig(n=1, top_k=n, params=replace(params, n=1), pattern=options.pattern,
                                       answer_field=options.answer_field), overrides)
    local = generator.local_model()
    model = local.model
    baseline = model if config.baseline is None else _load_baseline(config.baseline, model)
    reward = make_value(options.value, model, prompt, options.step_delimiter)
    baseline_reward = (None if config.baseline_value is None
                       else make_value(config.baseline_value, model, prompt, options.step_delimiter))
    return transfer_q(model, prompt, reward, config, baseline=baseline, baseline_reward=baseline_reward,
                      chat=local.chat, rng=rng)

register(StrategySpec("transfer_q", "Transfer Q*: the top n tokens tilted by exp(Q̂/β), Q̂ from rollouts of "
                      "--baseline (--value: the reward)", _runner, pooled=False, uses_value=True,
                      needs=frozenset({caps.LOCAL_CACHE}),
                      why="it values the top-k next tokens by baseline rollouts at every position, which needs a "
                          "local model", config=TransferQConfig, set_by_run=frozenset({"n", "top_k", "params"})),
         __name__)
