"""`prefill_plan`: how one engine step's prompt-token budget is split among waiting prompts
(exact values by hand)."""

from __future__ import annotations

import pytest

from metagen.serve.scheduler import prefill_plan


@pytest.mark.parametrize("remaining, budget, plan", [
    ([], 256, []),
    ([3000], 256, [256]),  # alone: as first come, first served
    ([100], 256, [100]),
    ([3000, 40, 10], 256, [206, 40, 10]),  # half to the oldest, the short ones whole, the rest back to it
    ([3000, 200], 256, [256, 0]),  # 200 does not fit in the 128 left: what is left goes in order
    ([3000, 3000], 256, [256, 0]),
    ([50, 3000, 20], 256, [50, 186, 20]),  # the oldest fits: whole; then 20 fits; the rest to 3000
    ([10, 10, 10], 16, [10, 6, 0]),  # 8 to the oldest, its last 2 fit, 10 does not fit in 6: in order
    ([1, 1], 1, [1, 0]),
    ([5, 0], 4, [4, 0]),  # a prompt with nothing left takes nothing
])
def test_prefill_plan_by_hand(remaining, budget, plan):
    assert prefill_plan(remaining, budget) == plan
    assert sum(plan) <= budget and all(0 <= p <= r for p, r in zip(plan, remaining))


def test_the_budget_is_used_whenever_prompts_have_tokens_left():
    for remaining in ([7, 300, 2, 90], [1000, 1000, 1000], [3, 3, 3, 3]):
        for budget in (1, 2, 5, 64, 256):
            assert sum(prefill_plan(remaining, budget)) == min(budget, sum(remaining))
