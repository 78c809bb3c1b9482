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
argmax_z log π_ref(z) + Q̂(z)/β (token_choice "argmax", the paper's) or drawn from the softmax
of the same over the k (token_choice "sample"). β = inf is the reference alone.

Q̂ is `scoring.rollout_q.RolloutQ` (the baseline's cache, kept across steps). Cost per decoded
token, B rows: the reference's B·k candidate rows (tokenwise CD), 1 + L baseline forwards over
at most B·k·m rows, and one reward call over at most B·k·m sequences, all in the one `Cost`
(model calls and FLOPs; the baseline's and the reward's FLOPs in `scorer_flops` too). The
reward reads whole sequences (a `Scorer`, or --value steps / judge / prm:PATH / reward:URL): a
value head, which reads hidden states, is refused. The request's processors and constraint shape
π_ref's candidates only: the rollouts are the baseline's own (Q̂ is a value under π_BL).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import TYPE_CHECKING

from metagen.decoding import capabilities as caps
from metagen.sampling import SamplingParams
from metagen.scoring.answers import check_answer_field
from metagen.strategies.options import check_options, configure, option
from metagen.strategies.spec import StrategySpec, register, shared

if TYPE_CHECKING:
    import torch

    from metagen.decoding.prompts import Prompt


@dataclass(frozen=True)
class TransferQConfig:
    """n: samples drawn; top_k: k; kl_beta: β; rollouts: m; rollout_tokens: L; rollout: how the
    baseline continues; token_choice: argmax or sample over the k; baseline / baseline_value: the
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
    token_choice: str = option("argmax", str, "draw each token from π_ref · exp(Q̂ / β) over the k (sample) or "
                               "take its mode (argmax)", choices=("sample", "argmax"))
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
        from metagen.decoding.companion_models import early_exit_layers

        check_options(self)
        check_answer_field(self.pattern, self.answer_field)
        if self.baseline is not None:
            early_exit_layers(self.baseline, "baseline")  # the spelling, before any load
        if (self.baseline_value is None) != (self.baseline_alpha is None):
            raise ValueError(f"baseline_value={self.baseline_value!r}, baseline_alpha={self.baseline_alpha!r}: "
                             "indirect transfer needs both (r_BL and the baseline's α), direct transfer neither")


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
    from metagen.scoring.rollout_q import RolloutQ
    from metagen.strategies.tokenwise_cd import TokenwiseCDConfig, tokenwise_cd

    config = config or TransferQConfig()
    baseline = model if baseline is None else baseline
    check_same_vocabulary(model, baseline)
    k = min(config.top_k, model.vocab_size)
    check_batch_fits(baseline, config.n * k * config.rollouts, config.params.max_tokens,
                     what="n·top_k·rollouts")  # the rollout rows of one step
    rng = rng if rng is not None else config.params.make_generator()
    stop_ids = set(config.params.stop_token_ids or ())
    if not config.params.ignore_eos:
        stop_ids |= set(model.eos_token_ids)
    value = RolloutQ(baseline, _as_value(reward, prompt, model), rollouts=config.rollouts,
                     rollout_tokens=config.rollout_tokens, sample=config.rollout == "sample",
                     max_tokens=config.params.max_tokens, stop_ids=stop_ids, generator=rng,
                     baseline_reward=None if baseline_reward is None else _as_value(baseline_reward, prompt, model),
                     alpha=config.baseline_alpha)
    strength = 0.0 if math.isinf(config.kl_beta) else 1.0 / config.kl_beta
    decoding = TokenwiseCDConfig(n=config.n, top_k=config.top_k, strength=strength,
                                 token_choice=config.token_choice,
                                 params=config.params, pattern=config.pattern, answer_field=config.answer_field)
    try:
        with torch.no_grad():
            return tokenwise_cd(model, prompt, value, decoding, chat=chat, rng=rng)
    finally:
        value.close()


def _as_value(reward, prompt, model):
    """`reward` as a PrefixValue: itself, or a Scorer / scoring function read on the decoded text."""
    from metagen.scoring.process_reward import PrefixValue, ScorerValue

    return reward if isinstance(reward, PrefixValue) else ScorerValue(reward, prompt, model.tokenizer)


@lru_cache(maxsize=2)
def _load_baseline(spec: str, model):
    from metagen.decoding.companion_models import load_companion

    return load_companion(spec, model, kv_dtype=getattr(model, "kv_dtype", None),
                          activations=getattr(model, "activations", None), where="baseline")


def _runner(generator, prompt, n, params, options, rng, overrides):
    from metagen.strategies.tree.runner import make_value

    config = configure(TransferQConfig(n=1, top_k=n, params=replace(params, n=1), pattern=options.pattern,
                                       answer_field=options.answer_field), overrides)
    local = generator.local_model()
    model = local.model
    reward = make_value(options.value, model, prompt, options.step_delimiter,  # refused values fail before a load
                        parameters=options.value_parameters)
    baseline_reward = (None if config.baseline_value is None
                       else make_value(config.baseline_value, model, prompt, options.step_delimiter))
    baseline = model if config.baseline is None else _load_baseline(config.baseline, model)
    return transfer_q(model, prompt, reward, config, baseline=baseline, baseline_reward=baseline_reward,
                      chat=local.chat, rng=rng)

register(StrategySpec("transfer_q", "Transfer Q*: the top n tokens tilted by exp(Q̂/β), Q̂ from rollouts of "
                      "--baseline (--value: the reward)", _runner, pooled=False, uses_value=True,
                      needs=frozenset({caps.LOCAL_CACHE}),
                      why="it values the top-k next tokens by baseline rollouts at every position, which needs a "
                          "local model", config=TransferQConfig, set_by_run=frozenset({"n", "top_k", "params"})),
         __name__)
