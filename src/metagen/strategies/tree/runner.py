"""Tree searches and controlled decoding on a generator: the backend they decode on and their value.

The registry (`metagen.strategies.registry`) names each search, its config dataclass and what
its budget n sets (every search samples about n next steps per depth, so n compares to the n of
best-of-N and voting at similar token cost); `run_search` runs a built config:

| name | n sets |
|---|---|
| best_of_n_value | n complete samples in one batch (a one-step tree), the best by V |
| step_beam | keep max(1, n // 4) nodes, expand each into n // kept children |
| dvts | max(1, n // 4) subtrees, n // subtrees children each |
| rebase | width n |
| mcts | n iterations (4 children per expansion by default) |
| astar | n expansions (of 4 children by default) |
| particle_filter | n particles |
| blockwise_cd | n blocks (of 16 tokens by default) per kept block |
| tokenwise_cd | the top n tokens (strength λ = 4 by default) |

The value (`StrategyOptions.value`): "steps" = the exact arithmetic step verifier, "judge" = the
model itself asked whether each step is correct (`JudgePRM`); both score a partial solution by
the min over its steps. "prm:PATH" / "prm-shepherd:PATH" / "prm-qwen:PATH": a process reward
model checkpoint, "reward:URL" / "reward-shepherd:URL": one served by vLLM (`scoring/step_prm.py`;
min over steps too). Otherwise the path of a `ValueHead` file for this model. "tests" (the
share of a code prompt's docstring examples a program passes) scores whole answers only: no
search here takes it. best_of_n_value with a value that reads the text alone (tests, steps, a
PRM) is no search: it runs pooled (`best_of_n.best_by_text_value`).

The backend: a generator with LOCAL_CACHE runs the searches on its local model (KV snapshots);
else one with STEP_CONTINUATION runs them through its completions (`RemoteStepExpander`; the
judge is the same generator). A* here weighs no path logprobs (β = 0 by default), so it needs none.
tokenwise_cd scores the top-k next tokens at every position: local only.
"""

from __future__ import annotations

from functools import lru_cache

from metagen.decoding import capabilities as caps
from metagen.scoring.base import prompt_text
from metagen.strategies.spec import WHOLE_ANSWER_VALUES

@lru_cache(maxsize=4)
def _load_head(path: str, model):
    from metagen.scoring.value_head import ValueHead

    return ValueHead.load(path, model)


def make_value(spec: str | None, model, prompt, delimiter: str, generator=None, parameters: float | None = None):
    """The PrefixValue named by `spec` (see the module docstring). model: the local model, or
    None on a remote `generator` (its tokenizer, if any; the judge asks that generator);
    parameters: a served PRM's parameter count, for its FLOPs (`StrategyOptions.value_parameters`)."""
    from metagen.scoring.process_reward import HeadValue, StepRewardValue

    if spec is None:
        raise ValueError("this strategy needs a value: --value steps (arithmetic step verifier), "
                         "--value judge (the model judges each step), --value prm:PATH (a process reward model), "
                         "--value reward:URL (one served by vLLM) or --value PATH (a trained value head)")
    if spec in WHOLE_ANSWER_VALUES:
        raise ValueError(f"value={spec!r} scores whole answers only, not the partial solutions a search values; "
                         "use it with best_of_n_value")
    tokenizer = model.tokenizer if model is not None else generator.tokenizer
    if spec == "judge":
        from metagen.decoding.generator import LocalGenerator
        from metagen.scoring.judge_prm import JudgePRM

        judge = LocalGenerator(model) if model is not None else generator
        return StepRewardValue(JudgePRM(judge), tokenizer, prompt_text(prompt), delimiter, how="min")
    from metagen.scoring.step_prm import is_prm_spec, text_value

    if spec == "steps" or is_prm_spec(spec):  # the step verifier, or a process reward model (local or served)
        return text_value(spec, tokenizer, prompt_text(prompt), delimiter, parameters)
    if model is None:
        raise ValueError(f"value={spec!r} is a trained value head, which reads a local model's hidden states: "
                         "a remote generator has none; use --value steps or --value judge")
    return HeadValue(_load_head(spec, model))


def run_search(search, config, generator, prompt, options, rng, *, local_only: bool = False):
    """search(backend, prompt, value, config, chat=, rng=) on a generator with LOCAL_CACHE (its
    model, through `generator.local_model()`) or STEP_CONTINUATION (its completions; not when
    `local_only`); `options` names the value and step delimiter. Returns its GenerationResult.
    The registry's `StrategySpec.run` checks the generator's capabilities before this."""
    if local_only:
        caps.require({caps.LOCAL_CACHE}, generator, f"{search.__name__}")
    if caps.LOCAL_CACHE in generator.capabilities:
        local = generator.local_model()
        backend, model, chat = local.model, local.model, local.chat
    else:
        caps.require({caps.STEP_CONTINUATION}, generator, f"{search.__name__}")
        backend, model, chat = generator, None, None
    value = make_value(options.value, model, prompt, options.step_delimiter, generator, options.value_parameters)
    return search(model if local_only else backend, prompt, value, config, chat=chat, rng=rng)
