"""AdaDec on the real embedded SmolLM2-135M-Instruct (short generations)."""

from __future__ import annotations

import math

import pytest

from metagen.decoding import AdaDecConfig, generate
from metagen.decoding.cost import forward_flops
from metagen.sampling import SamplingParams

pytestmark = pytest.mark.slow

PROMPT = "def fibonacci(n):\n"
GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


def test_infinite_threshold_is_greedy_token_for_token(model):
    plain = generate(model, PROMPT, GREEDY, chat=False)
    never = generate(model, PROMPT, GREEDY, chat=False, rerank=AdaDecConfig(threshold=math.inf))
    assert never.completions[0].token_ids == plain.completions[0].token_ids
    assert never.completions[0].logprobs == plain.completions[0].logprobs
    assert never.lookahead_steps == 0
    assert (never.cost.model_calls, never.cost.flops) == (plain.cost.model_calls, plain.cost.flops)


def test_pausing_at_every_step_pays_its_lookahead_forwards(model):
    plain = generate(model, PROMPT, GREEDY, chat=False)
    config = AdaDecConfig(threshold=0.0, candidates=2, lookahead=2)
    paused = generate(model, PROMPT, GREEDY, chat=False, rerank=config)
    steps = len(paused.completions[0].token_ids)
    assert paused.lookahead_steps == steps == 12
    # every step: 2 forwards of the 2 candidates (ignore_eos: no lookahead ends early; the last step's
    # candidates end their rows at max_tokens and need none), at positions p and p + 1
    start = len(paused.prompt_token_ids)
    extra_flops = sum(2 * (forward_flops(model, start + t, 1) + forward_flops(model, start + t + 1, 1))
                      for t in range(steps - 2))
    extra_flops += 2 * forward_flops(model, start + steps - 2, 1)  # the step before last: one lookahead token
    assert paused.cost.model_calls == plain.cost.model_calls + 2 * (steps - 2) + 1
    assert paused.cost.flops == pytest.approx(plain.cost.flops + extra_flops, rel=1e-9)
    assert paused.cost.target_steps == plain.cost.target_steps
