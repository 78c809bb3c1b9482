"""Adaptive self-consistency and the compute-optimal allocation, evaluated from stored pools."""

import pytest

from metagen.decoding import Cost, Generator
from metagen.decoding.result import Completion, GenerationResult
from metagen.eval import EvalConfig, Problem, evaluate
from metagen.sampling import SamplingParams
from tests.eval.dice import PROBLEMS, DiceGenerator

# each question's samples, in the order drawn (the last repeats): a certain problem; a hard one
# whose first four lean wrong (9, 2, 9, 9) but whose later samples say 2; a hopeless even split
SCRIPTS = {"certain": ["1"], "hard": ["9", "2", "9", "9", "2"], "hopeless": ["7", "8"] * 32}
KINDS = [Problem("c0", "certain", "1"), Problem("c1", "certain", "1"), Problem("hard", "hard", "2"),
         Problem("hopeless", "hopeless", "3")]


class Scripted(Generator):
    """Answers each question from its script, in order; 3 tokens and 10 FLOPs a sample."""

    def generate(self, prompt, params, *, generator=None):
        script = SCRIPTS[prompt]
        answers = [script[min(i, len(script) - 1)] for i in range(params.n)]
        completions = [Completion(f"The answer is {a}", [1, 2, 3], [-0.1] * 3, finish_reason="stop") for a in answers]
        return GenerationResult(completions, [5, 6], cost=Cost(model_calls=3, prompt_tokens_computed=2,
                                                               generated_tokens=3 * params.n, flops=10.0 * params.n))


def test_adaptive_consistency_stops_early_from_the_pool(tmp_path):
    # temperature 0: every sample answers 0, so the vote stops after four samples at every n >= 4
    config = EvalConfig(("self_consistency", "adaptive_consistency"), ns=(2, 8, 16), params=SamplingParams(temperature=0.0))
    report = evaluate(DiceGenerator(), PROBLEMS, config, tmp_path)
    points = {(p.strategy, p.n): p for p in report.points}
    for n, drawn in ((2, 2), (8, 4), (16, 4)):
        adaptive, uniform = points[("adaptive_consistency", n)], points[("self_consistency", n)]
        assert adaptive.samples == drawn and uniform.samples == n
        assert adaptive.accuracy == uniform.accuracy
        assert adaptive.cost.generated_tokens < uniform.cost.generated_tokens or n == 2
    assert points[("adaptive_consistency", 8)].to_dict()["samples"] == 4
    assert "samples" not in points[("pass@k", 8)].to_dict()


def test_allocation_from_the_pool_in_order_is_known_exactly(tmp_path):
    # subsets=1: each pool is read in its stored order. n = 6 for 4 problems: B = 24, the first round
    # (k = 4) takes 16. Under the posterior no first round is certain or hopeless: the 8 extra samples
    # go to all four (the tie 7-8-7-8 and the hard 9-2-9-9 more than the agreeing ones), so each pays a
    # second call. The hard one's first 7 say 2 four times against 9's three: right; the hopeless
    # one's answer (3) never appears.
    config = EvalConfig(("self_consistency",), ns=(4, 6, 32), subsets=1, params=SamplingParams(temperature=1.0),
                        allocation_round=4)
    report = evaluate(Scripted(), KINDS, config, tmp_path)
    points = {(p.strategy, p.n): p for p in report.points}
    allocated = points[("self_consistency_allocated", 6)]
    assert allocated.samples == 6 and allocated.accuracy == 3 / 4
    assert allocated.cost.generated_tokens == 3 * allocated.samples
    assert allocated.cost.model_calls == (4 * 3 + 4 * 3) / 4  # a second call for every problem
    # uniform n = 4 from the prefix would vote 9 on the hard problem; with nothing to allocate at
    # n = k the allocated point is exactly that
    at_k = points[("self_consistency_allocated", 4)]
    assert at_k.samples == 4 and at_k.accuracy == 2 / 4 and at_k.cost.model_calls == 3


def test_allocation_round_needs_self_consistency_and_fits_the_pool():
    with pytest.raises(ValueError, match="allocation_round=2 needs self_consistency among the strategies"):
        EvalConfig(("best_of_n",), ns=(4,), allocation_round=2)
    for k in (9, 1, 0):  # one sample per problem tells no problem from another: nothing to estimate
        with pytest.raises(ValueError, match=rf"allocation_round={k} \(--allocation-round\) is out of range: "
                                             r"must be in \[2, 8\]"):
            EvalConfig(("self_consistency",), ns=(4, 8), allocation_round=k)


def test_eval_command_passes_the_allocation_round(capsys):
    from metagen.cli import main

    # refused by EvalConfig before any model is loaded: the flag reaches it
    code = main(["eval", "--task", "arithmetic", "--allocation-round", "9", "--strategy", "self_consistency",
                 "--n", "4,8"])
    assert code == 2 and "allocation_round=9 (--allocation-round) is out of range" in capsys.readouterr().err


@pytest.mark.parametrize("keeps_prompt", [False, True])
def test_rounds_served_from_a_pool_pay_for_the_prompt_as_their_generator_would(keeps_prompt):
    """Three rounds of 1, 2 and 1 samples: a generator that keeps nothing computes the prompt
    (5 tokens, 100 FLOPs, 1 s) in each round; one that keeps the last prompt (LocalGenerator's
    PromptCache) in the first round only, the later rounds reusing it in every row."""
    from metagen.eval.pool import Pool, PoolGenerator, Sample

    lengths = [3, 2, 4, 1]
    samples = [Sample(f"s{i}", list(range(k)), [-0.1] * k, [], "stop", flops=10.0 * k) for i, k in enumerate(lengths)]
    pool = Pool(prompt_tokens=5, prompt_flops=100.0, prefill_seconds=1.0, decode_seconds=10.0, samples=samples)
    served = PoolGenerator(pool, [0, 1, 2, 3], sequential=True, keeps_prompt=keeps_prompt)
    costs = [served.generate("q", SamplingParams(n=size)).cost for size in (1, 2, 1)]
    later = 0 if keeps_prompt else 1
    assert [c.prompt_tokens_computed for c in costs] == [5, 5 * later, 5 * later]
    assert [c.prompt_tokens_reused for c in costs] == [0, 10 - 5 * later, 5 - 5 * later]
    assert [c.flops for c in costs] == [130.0, 60.0 + 100.0 * later, 10.0 + 100.0 * later]
    assert [c.model_calls for c in costs] == [3, 4 - 1 + later, 1 - 1 + later]
    assert [c.wall_seconds for c in costs] == pytest.approx([1 + 3, later + 6, later + 1])


@pytest.mark.parametrize("keeps_prompt", [False, True])
def test_the_allocations_second_round_pays_for_the_prompt_as_adaptive_consistency_does(tmp_path, keeps_prompt):
    """The second round repeats the first round's prompt: a generator that keeps it (a
    LocalGenerator) reuses it, as adaptive consistency's later rounds are charged; one that
    keeps nothing computes it again."""

    class Keeping(Scripted):
        pass

    Keeping.keeps_prompt = keeps_prompt
    config = EvalConfig(("self_consistency", "adaptive_consistency"), ns=(4, 6, 32), subsets=1,
                        params=SamplingParams(temperature=1.0), allocation_round=4)
    report = evaluate(Keeping(), KINDS, config, tmp_path)
    points = {(p.strategy, p.n): p for p in report.points}
    allocated = points[("self_consistency_allocated", 6)]  # every problem draws a second round (above)
    assert allocated.cost.prompt_tokens_computed == (2 if keeps_prompt else 4)
    # a pool of 32 costs 320 FLOPs over 2 prompt tokens and 32 × 2 fed back: 320 · 2 / 66 each share
    share = 320 * 2 / 66
    assert allocated.cost.flops == pytest.approx(share * (1 if keeps_prompt else 2) + 6 * share)
    adaptive = points[("adaptive_consistency", 6)]
    assert adaptive.cost.prompt_tokens_computed == (2 if keeps_prompt else 2 * adaptive.samples)
