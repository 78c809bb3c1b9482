"""Tree searches and controlled decoding by name, with budget n, for the registry and the CLI.

What n means (every search samples about n next steps per depth, so n compares to the n of
best-of-N and voting at similar token cost):

| name | configuration |
|---|---|
| best_of_n_value | n complete samples in one batch (a one-step tree), the best by V |
| step_beam | keep max(1, n // 4) nodes, expand each into n // kept children |
| dvts | max(1, n // 4) subtrees, n // subtrees children each |
| rebase | width n |
| mcts | n iterations, 4 children per expansion |
| astar | n expansions of 4 children |
| particle_filter | n particles |
| blockwise_cd | n blocks of 16 tokens per kept block |
| tokenwise_cd | the top n tokens, strength λ = 4 |

The value (`StrategyOptions.value`): "steps" = the exact arithmetic step verifier, "judge" = the
model itself asked whether each step is correct (`JudgePRM`); both score a partial solution by
the min over its steps. Otherwise the path of a `ValueHead` file for this model.

The backend: a generator with LOCAL_CACHE runs the searches on its local model (KV snapshots);
else one with STEP_CONTINUATION runs them through its completions (`RemoteStepExpander`; the
judge is the same generator). A* here weighs no path logprobs (β = 0), so it needs none.
tokenwise_cd scores the top-k next tokens at every position: local only.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

from metagen.decoding import capabilities as caps
from metagen.scoring.base import prompt_text
from metagen.strategies.tree.expand import StepConfig

LAMBDA = 4.0
BLOCK_TOKENS = 16


@lru_cache(maxsize=4)
def _load_head(path: str, model):
    from metagen.scoring.value_head import ValueHead

    return ValueHead.load(path, model)


def make_value(spec: str | None, model, prompt, delimiter: str, generator=None):
    """The PrefixValue named by `spec` (see the module docstring). model: the local model, or
    None on a remote `generator` (its tokenizer, if any; the judge asks that generator)."""
    from metagen.scoring.process_reward import ArithmeticStepVerifier, HeadValue, StepRewardValue

    if spec is None:
        raise ValueError("this strategy needs a value: --value steps (arithmetic step verifier), "
                         "--value judge (the model judges each step) or --value PATH (a trained value head)")
    tokenizer = model.tokenizer if model is not None else getattr(generator, "tokenizer", None)
    if spec == "steps":
        return StepRewardValue(ArithmeticStepVerifier(), tokenizer, prompt_text(prompt), delimiter, how="min")
    if spec == "judge":
        from metagen.decoding.generator import LocalGenerator
        from metagen.scoring.judge_prm import JudgePRM

        judge = LocalGenerator(model) if model is not None else generator
        return StepRewardValue(JudgePRM(judge), tokenizer, prompt_text(prompt), delimiter, how="min")
    if model is None:
        raise ValueError(f"value={spec!r} is a trained value head, which reads a local model's hidden states: "
                         "a remote generator has none; use --value steps or --value judge")
    return HeadValue(_load_head(spec, model))


def run_search(name: str, generator, prompt, n: int, params, options, rng):
    """Run search `name` with budget n on a generator with LOCAL_CACHE (its model, through
    `generator.local_model()`) or STEP_CONTINUATION (its completions); returns its
    StrategyResult. ValueError naming the capability when the generator lacks one it needs."""
    from metagen.strategies.tokenwise_cd import TokenwiseCDConfig, tokenwise_cd
    from metagen.strategies.registry import STRATEGIES
    from metagen.strategies.tree import astar, blockwise_cd, dvts, mcts, particle_filter, rebase, step_beam_search

    if name in STRATEGIES:  # LOCAL_CACHE or STEP_CONTINUATION, + HIDDEN_STATES for a value head
        STRATEGIES[name].check(generator, options, params)
    if caps.LOCAL_CACHE in generator.capabilities:
        local = generator.local_model()
        backend, model, chat = local.model, local.model, local.chat
    else:  # the registry checked STEP_CONTINUATION (tokenwise_cd: LOCAL_CACHE)
        backend, model, chat = generator, None, None
    value = make_value(options.value, model, prompt, options.step_delimiter, generator)
    params = replace(params, n=1)
    common = {"params": params, "step": StepConfig(options.step_delimiter, 64), "pattern": options.pattern,
              "answer_field": options.answer_field,
              "math": options.math, "aggregation": options.aggregation}
    kept = max(1, n // 4)
    if name == "tokenwise_cd":
        config = TokenwiseCDConfig(n=1, top_k=n, strength=LAMBDA, params=params, pattern=options.pattern,
                                   answer_field=options.answer_field)
        return tokenwise_cd(model, prompt, value, config, chat=chat, rng=rng)
    searches = {
        "best_of_n_value": lambda: step_beam_search.step_beam_search(backend, prompt, value, step_beam_search.StepBeamConfig(
            **{**common, "step": StepConfig(None, params.max_tokens)}, beam_width=1, expansions=n, max_steps=1),
            chat=chat, rng=rng),
        "step_beam": lambda: step_beam_search.step_beam_search(backend, prompt, value, step_beam_search.StepBeamConfig(
            **common, beam_width=kept, expansions=n // kept), chat=chat, rng=rng),
        "dvts": lambda: dvts.dvts(backend, prompt, value, dvts.DVTSConfig(**common, subtrees=kept, expansions=n // kept),
                                  chat=chat, rng=rng),
        "rebase": lambda: rebase.rebase(backend, prompt, value, rebase.RebaseConfig(**common, width=n), chat=chat, rng=rng),
        "mcts": lambda: mcts.mcts(backend, prompt, value, mcts.MCTSConfig(**common, iterations=n, expansions=4),
                                  chat=chat, rng=rng),
        "astar": lambda: astar.astar(backend, prompt, value, astar.AStarConfig(**common, max_expansions=n, expansions=4),
                                     chat=chat, rng=rng),
        "particle_filter": lambda: particle_filter.particle_filter(
            backend, prompt, value, particle_filter.ParticleFilterConfig(**common, particles=n), chat=chat, rng=rng),
        "blockwise_cd": lambda: blockwise_cd.blockwise_cd(backend, prompt, value, blockwise_cd.BlockwiseCDConfig(
            **{k: v for k, v in common.items() if k != "step"}, blocks=n, block_tokens=BLOCK_TOKENS),
            chat=chat, rng=rng),
    }
    if name not in searches:
        raise ValueError(f"search {name!r} is not known; choose from {', '.join([*searches, 'tokenwise_cd'])}")
    return searches[name]()
