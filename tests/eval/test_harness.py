"""The harness: unbiased subsampled accuracies, resumability, set-up checks, plots, CLI."""

import json
from itertools import combinations

import pytest

from metagen.decoding import Cost
from metagen.eval import EvalConfig, Problem, evaluate, format_table
from metagen.sampling import SamplingParams
from tests.eval.dice import PROBLEMS, DiceGenerator


def _without_wall_time(report):
    results = report.to_dict()["results"]
    for result in results:
        result["cost"].pop("wall_seconds")
    return results


def _records(out):
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]


def _pools(out):
    return {record["id"]: record["pool"]["samples"] for record in _records(out) if record["kind"] == "pool"}


def test_pooled_accuracy_is_the_exact_mean_over_subsets(tmp_path):
    config = EvalConfig(("best_of_n_logprob", "self_consistency"), ns=(1, 2, 4), subsets=100, params=SamplingParams(temperature=1.0))
    report = evaluate(DiceGenerator(), PROBLEMS, config, tmp_path)
    pools = _pools(tmp_path)
    points = {(p.strategy, p.n): p for p in report.points}
    for n in (1, 2, 4):
        expected = []
        for problem in PROBLEMS:
            samples = pools[problem.id]
            hits = []
            for subset in combinations(range(4), n):  # C(4, n) <= 100 subsets: all of them are used
                means = [sum(samples[i]["logprobs"]) / len(samples[i]["logprobs"]) for i in subset]
                best = subset[max(range(n), key=lambda j: (means[j], -j))]
                hits.append(samples[best]["text"].endswith(problem.answer))
            expected.append(sum(hits) / len(hits))
        assert points[("best_of_n_logprob", n)].accuracy == pytest.approx(sum(expected) / len(expected))
    single = [sum(s["correct"] for s in pools[p.id]) / 4 for p in PROBLEMS]
    assert points[("self_consistency", 1)].accuracy == pytest.approx(sum(single) / len(single))
    assert points[("pass@k", 1)].accuracy == pytest.approx(sum(single) / len(single))
    full = points[("pass@k", 4)].accuracy
    assert full == pytest.approx(sum(any(s["correct"] for s in pools[p.id]) for p in PROBLEMS) / len(PROBLEMS))
    # cost of n samples: one prompt computed, n − 1 reused, the subset's tokens
    assert points[("self_consistency", 4)].cost.prompt_tokens_reused == 12
    assert points[("self_consistency", 2)].cost.prompt_tokens_reused == 4
    assert "best_of_n_logprob" in format_table(report)


def test_a_killed_run_resumes_without_redoing_or_losing_work(tmp_path):
    config = EvalConfig(("greedy", "weighted_voting"), ns=(1, 2), params=SamplingParams(temperature=1.0))
    reference = evaluate(DiceGenerator(), PROBLEMS, config, tmp_path / "whole")

    class Killed(Exception):
        pass

    def kill_after_two(done, total):
        if done == 2:
            raise Killed

    first = DiceGenerator()
    with pytest.raises(Killed):
        evaluate(first, PROBLEMS, config, tmp_path / "run", progress=kill_after_two)
    assert len(first.calls) == 4  # a pool and a greedy call per finished problem
    with open(tmp_path / "run" / "results.jsonl", "a") as handle:
        handle.write('{"kind": "pool", "id": "p2", "po')  # torn write of the third problem
    second = DiceGenerator()
    resumed = evaluate(second, PROBLEMS, config, tmp_path / "run")
    assert [prompt for prompt, _, _ in second.calls] == ["question 2", "question 2", "question 3", "question 3",
                                                          "question 4", "question 4"]
    assert _without_wall_time(resumed) == _without_wall_time(reference)
    lines = (tmp_path / "run" / "results.jsonl").read_text().splitlines()
    assert len(lines) == 11 and all(json.loads(line) for line in lines)  # the set-up, then 5 × (pool, greedy)
    assert json.loads(lines[0])["kind"] == "setup"
    third = DiceGenerator()
    assert _without_wall_time(evaluate(third, PROBLEMS, config, tmp_path / "run")) == _without_wall_time(reference)
    assert third.calls == []


def test_a_different_setup_in_the_same_directory_is_refused(tmp_path):
    config = EvalConfig(("self_consistency",), ns=(1, 2), params=SamplingParams(temperature=1.0))
    evaluate(DiceGenerator(), PROBLEMS, config, tmp_path)
    hotter = EvalConfig(("self_consistency",), ns=(1, 2), params=SamplingParams(temperature=1.5))
    with pytest.raises(ValueError, match="params.temperature=1.0, this run has params.temperature=1.5"):
        evaluate(DiceGenerator(), PROBLEMS, hotter, tmp_path)
    bigger = EvalConfig(("self_consistency",), ns=(1, 4), params=SamplingParams(temperature=1.0))
    with pytest.raises(ValueError, match=r"results.jsonl:2 holds a pool of 2 samples, this run needs 4"):
        evaluate(DiceGenerator(), PROBLEMS, bigger, tmp_path)
    more_strategies = EvalConfig(("self_consistency", "borda", "greedy"), ns=(1, 2), params=SamplingParams(temperature=1.0))
    generator = DiceGenerator()
    report = evaluate(generator, PROBLEMS, more_strategies, tmp_path)
    assert all(n == 1 and temperature == 0 for _, n, temperature in generator.calls)  # only greedy was new
    assert {p.strategy for p in report.points} == {"self_consistency", "borda", "greedy", "pass@k"}


def test_config_errors_name_the_field():
    with pytest.raises(ValueError, match="strategy='nope' is not known"):
        EvalConfig(("nope",))
    with pytest.raises(ValueError, match="ns=.0"):
        EvalConfig(("greedy",), ns=(0,))
    with pytest.raises(ValueError, match="subsets=0"):
        EvalConfig(("greedy",), subsets=0)
    from metagen.strategies.registry import StrategyOptions

    with pytest.raises(ValueError, match=r"pattern='\(' is not a valid regular expression \(missing \)"):
        StrategyOptions(pattern="(")  # at construction, not after generating


def test_plots_are_written(tmp_path):
    from metagen.eval.plots import plot_curves

    config = EvalConfig(("greedy", "self_consistency"), ns=(1, 2, 4), params=SamplingParams(temperature=1.0))
    report = evaluate(DiceGenerator(), PROBLEMS, config)
    for path in plot_curves(report, tmp_path, title="dice"):
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000


def test_each_plot_names_its_cost_axis(tmp_path, monkeypatch):
    """Regression: the x axis was labelled with the last curve's name ("pass@k (oracle)")."""
    from metagen.eval import plots

    config = EvalConfig(("greedy", "self_consistency"), ns=(1, 2, 4), params=SamplingParams(temperature=1.0))
    report = evaluate(DiceGenerator(), PROBLEMS, config)
    labels = []
    plt = plots.pyplot()
    close = plt.close
    monkeypatch.setattr(plt, "close", lambda figure: labels.append(figure.axes[0].get_xlabel()) or close(figure))
    plots.plot_curves(report, tmp_path)
    assert labels == [label for _, label, _ in plots.AXES]


@pytest.mark.slow
def test_eval_and_strategy_commands_on_the_real_model(tmp_path, capsys):
    from metagen.cli import main

    assert main(["task", "arithmetic", "--count", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [json.loads(line)["id"] for line in lines] == ["arithmetic-0-0", "arithmetic-0-1"]
    argv = ["eval", "--task", "arithmetic", "--count", "2", "--strategy", "greedy,self_consistency", "--n", "1,2",
            "--max-tokens", "12", "--out", str(tmp_path), "--json"]
    assert main(argv) == 0
    results = json.loads(capsys.readouterr().out)["results"]
    assert [(r["strategy"], r["n"]) for r in results] == [("greedy", 1), ("self_consistency", 1),
                                                          ("self_consistency", 2), ("pass@k", 1), ("pass@k", 2)]
    assert all(0 <= r["accuracy"] <= 1 and r["cost"]["flops"] > 0 for r in results)
    assert {p.name for p in tmp_path.iterdir()} >= {"results.jsonl", "run.json", "summary.txt", "accuracy_vs_flops.png"}
    assert main(argv) == 0  # resumed: nothing new to generate, same summary
    assert json.loads(capsys.readouterr().out)["results"] == results

    assert main(["generate", "What is 2 + 3?", "--strategy", "self_consistency", "--n", "3", "--max-tokens", "12",
                 "--seed", "0", "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["strategy"] == "self_consistency" and len(payload["candidates"]) == 3
    assert sum(c["chosen"] for c in payload["candidates"]) == 1
    assert payload["cost"]["prompt_tokens_reused"] == 2 * payload["cost"]["prompt_tokens_computed"]
    assert main(["generate", "hi", "--strategy", "greedy", "--n", "2"]) == 2
    assert "n=2 is out of range for strategy 'greedy'" in capsys.readouterr().err


def test_every_registered_strategy_runs_in_the_harness(tmp_path):
    from metagen.strategies.registry import STRATEGIES

    runnable = {name for name, spec in STRATEGIES.items() if spec.supported_by(DiceGenerator())}
    # searches: below, on a local model; chains continue a prefill until a stop string, which dice cannot;
    # mbr_judge reads the judge's top logprobs, which dice have not; pg_td expands a local model's cache
    assert set(STRATEGIES) - runnable == {name for name, spec in STRATEGIES.items() if spec.uses_value} | {
        "chain_of_thought", "s2a", "self_ask", "calculator", "search", "self_ask_search", "dsp", "mbr_judge", "pg_td"}
    names = tuple(name for name in STRATEGIES if name in runnable)
    config = EvalConfig(names, ns=(1, 2), params=SamplingParams(temperature=1.0, max_tokens=8))
    report = evaluate(DiceGenerator(), PROBLEMS[:2], config, tmp_path)
    seen = {(p.strategy, p.n) for p in report.points}
    for name in names:
        budgets = (1,) if STRATEGIES[name].budget == "none" else (1, 2)
        assert {(name, n) for n in budgets} <= seen, name
    assert all(0.0 <= p.accuracy <= 1.0 and p.cost.model_calls > 0 for p in report.points)


def test_every_search_runs_in_the_harness_on_a_local_model(tmp_path, one_thread):
    """Tree searches and controlled decoding need a model's cache: the toy model behind a
    LocalGenerator, valued by the step verifier (neutral on toy text)."""
    from metagen.decoding import LocalGenerator
    from metagen.strategies.registry import STRATEGIES, StrategyOptions
    from tests.decoding.toy_model import ToyModel

    names = tuple(name for name, spec in STRATEGIES.items() if spec.uses_value)
    problems = [Problem("t0", "a", "b"), Problem("t1", "ab", "c")]
    options = StrategyOptions(pattern="([abc])", math=False, value="steps", step_delimiter="b")
    config = EvalConfig(names, ns=(2, 4), params=SamplingParams(temperature=1.0, max_tokens=6), options=options)
    report = evaluate(LocalGenerator(ToyModel()), problems, config, tmp_path)
    # best_of_n_value with the step verifier runs from a pool of 4: the pool's oracle rows come with it
    assert {(p.strategy, p.n) for p in report.points} == {(name, n) for name in (*names, "pass@k") for n in (2, 4)}
    assert all(0.0 <= p.accuracy <= 1.0 and p.cost.generated_tokens > 0 for p in report.points)
    resumed = evaluate(LocalGenerator(ToyModel()), problems, config, tmp_path)  # everything is on disk
    assert [p.accuracy for p in resumed.points] == [p.accuracy for p in report.points]


def test_unknown_flops_are_reported_unknown_and_not_plotted(tmp_path):
    """A generator that cannot count FLOPs (Cost.flops None): every point's FLOPs are unknown,
    the table says so, and no FLOPs plot is drawn (a zero or partial curve would be wrong)."""
    from metagen.eval.plots import plot_curves

    config = EvalConfig(("greedy", "self_consistency", "best_of_n"), ns=(1, 2), params=SamplingParams(temperature=1.0))
    report = evaluate(DiceGenerator(flops=None), PROBLEMS[:2], config, tmp_path / "run")
    assert report.points and all(p.cost.flops is None for p in report.points)
    assert all(r["cost"]["flops"] is None for r in report.to_dict()["results"])
    rows = format_table(report).splitlines()[2:]
    assert all(row.split()[-2] == "unknown" for row in rows)
    written = plot_curves(report, tmp_path, title="dice")
    assert [path.name for path in written] == ["accuracy_vs_tokens.png"]
    assert not (tmp_path / "accuracy_vs_flops.png").exists()
    resumed = evaluate(DiceGenerator(flops=None), PROBLEMS[:2], config, tmp_path / "run")  # null read back
    assert [p.cost.flops for p in resumed.points] == [None] * len(report.points)


def test_pool_flops_are_the_generators_split_over_prompt_and_samples(tmp_path):
    config = EvalConfig(("self_consistency",), ns=(4,), params=SamplingParams(temperature=1.0))
    report = evaluate(DiceGenerator(flops=7.0), PROBLEMS[:1], config, tmp_path)
    pool = next(r["pool"] for r in _records(tmp_path) if r["kind"] == "pool")
    assert pool["prompt_flops"] + sum(s["flops"] for s in pool["samples"]) == pytest.approx(7.0)
    fed = [len(s["token_ids"]) - 1 for s in pool["samples"]]  # the last token is never fed back
    total = pool["prompt_tokens"] + sum(fed)
    assert pool["prompt_flops"] == pytest.approx(7.0 * pool["prompt_tokens"] / total)
    assert [s["flops"] for s in pool["samples"]] == pytest.approx([7.0 * f / total for f in fed])
    assert report.points[0].cost.flops == pytest.approx(7.0)  # the whole pool at n = pool size


def test_a_strategy_the_generator_cannot_run_is_refused_before_generating(tmp_path):
    generator = DiceGenerator()  # no ASSISTANT_CONTINUATION: cannot continue a prefill to a stop string
    config = EvalConfig(("self_consistency", "chain_of_thought"), ns=(1, 2))
    with pytest.raises(ValueError, match="strategy 'chain_of_thought' needs assistant_continuation, which DiceGenerator"):
        evaluate(generator, PROBLEMS, config, tmp_path / "out")
    assert generator.calls == [] and not (tmp_path / "out").exists()


def test_prompt_lengths_are_checked_where_the_generator_tells_its_context(tmp_path):
    class Bounded(DiceGenerator):
        max_context = 12

        def count_tokens(self, prompt):
            return len(prompt)

    long = [Problem("short", "q", "1"), Problem("long", "a much longer question", "1")]
    config = EvalConfig(("self_consistency",), ns=(1,))
    generator = Bounded()
    with pytest.raises(ValueError, match=r"problem 'long' \(22 tokens\) does not fit the model's context of 12"):
        evaluate(generator, long, config, tmp_path / "a")
    assert generator.calls == []
    evaluate(DiceGenerator(), long, config, tmp_path / "b")  # max_context None: nothing to check against


def test_a_pool_generator_provides_what_its_samples_store():
    from metagen.decoding import capabilities as caps
    from metagen.eval.pool import Pool, PoolGenerator, Sample

    full = Sample("x", [1, 2], [-0.1, -0.2], [0.3, 0.4], "stop", 1.0)
    no_certainty = Sample("y", [1], [-0.1], [], "stop", None)
    # structured output: the samples were drawn under the run's params, constraint included
    assert PoolGenerator(Pool(1, 1.0, 0, 0, [full]), [0]).capabilities == {
        caps.TOKEN_IDS, caps.LOGPROBS, caps.FULL_DISTRIBUTIONS, caps.STRUCTURED_OUTPUT}
    pool = Pool(1, None, 0, 0, [full, no_certainty])
    assert PoolGenerator(pool, [0]).capabilities == {caps.TOKEN_IDS, caps.LOGPROBS, caps.STRUCTURED_OUTPUT}
    assert pool.subset_cost([0]).flops is None  # the prompt's FLOPs are unknown
    assert Pool.from_dict(pool.to_dict()).samples[1].flops is None
    text_only = Pool(1, 1.0, 0, 0, [Sample("z", [], [], [], "stop", 0.0)])
    assert PoolGenerator(text_only, [0]).capabilities == {caps.STRUCTURED_OUTPUT}
def test_a_pool_demands_only_what_its_strategies_read(tmp_path):
    """A remote server that returns no ids (and no tokenizer given) leaves Completion.token_ids
    None: voting over the texts still runs, costed from the counted tokens; a strategy reading
    what the samples lack (self-certainty: ids and every distribution) is refused by name, before
    anything is stored when the generator declared it, before generating when it does not."""

    class NoIds(DiceGenerator):
        def generate(self, prompt, params, *, generator=None):
            result = super().generate(prompt, params, generator=generator)
            for completion in result.completions:
                completion.token_ids = None
            result.prompt_token_ids = None
            return result

    texts = EvalConfig(("self_consistency", "best_of_n_logprob"), (2,), params=SamplingParams(temperature=1.0, max_tokens=8))
    report = evaluate(NoIds(), PROBLEMS[:1], texts, tmp_path / "texts")
    reference = evaluate(DiceGenerator(), PROBLEMS[:1], texts, tmp_path / "ids")
    assert [(p.strategy, p.n, p.accuracy, p.cost.generated_tokens) for p in report.points] == [
        (p.strategy, p.n, p.accuracy, p.cost.generated_tokens) for p in reference.points]  # counted from the logprobs
    assert all(s["token_ids"] == [] and s["token_count"] == len(s["logprobs"]) > 0
               for s in _pools(tmp_path / "texts")["p0"])

    certainty = EvalConfig(("weighted_voting",), (2,), params=SamplingParams(temperature=1.0, max_tokens=8))
    with pytest.raises(ValueError, match="strategy 'weighted_voting' from a stored sample pool needs "
                                         "full_distributions, which the samples NoIds returned"):
        evaluate(NoIds(), PROBLEMS[:1], certainty, tmp_path / "out")  # declares them, returns no ids
    stored = tmp_path / "out" / "results.jsonl"
    assert not stored.exists() or not _pools(tmp_path / "out")  # the useless pool was not stored

    class Undeclared(NoIds):
        capabilities = NoIds.capabilities - {"full_distributions"}

        def generate(self, prompt, params, *, generator=None):
            raise AssertionError("generated although the capability is missing")

    with pytest.raises(ValueError, match="strategy 'weighted_voting' needs full_distributions, which Undeclared"):
        evaluate(Undeclared(), PROBLEMS[:1], certainty, tmp_path / "out2")


def test_a_pool_of_separate_requests_costs_each_subset_its_share(tmp_path):
    """A server answering n samples as n requests pays the prompt per request (some of it from
    its prefix cache); a subset of n of the N stored samples costs n/N of what was reported,
    not the one-prefill cost of a local batch."""

    class FanOut(DiceGenerator):
        def generate(self, prompt, params, *, generator=None):
            result = super().generate(prompt, params, generator=generator)
            result.prompt_token_ids = None  # a server that returns no prompt ids
            n = params.n
            result.cost = Cost(model_calls=n, prompt_tokens_computed=4 + 1 * (n - 1), prompt_tokens_reused=3 * (n - 1),
                               generated_tokens=result.cost.generated_tokens, flops=None)
            return result

    config = EvalConfig(("self_consistency",), ns=(2, 8), params=SamplingParams(temperature=1.0))
    report = evaluate(FanOut(), PROBLEMS[:1], config, tmp_path)
    pool = next(r["pool"] for r in _records(tmp_path) if r["kind"] == "pool")
    assert pool["prompt_tokens"] == 4  # (computed + cached) / requests
    assert pool["reported"] == {"prompt_tokens_computed": 11, "prompt_tokens_reused": 21, "model_calls": 8}
    at = {p.n: p.cost for p in report.points}
    assert at[8].model_calls == 8 and at[8].prompt_tokens_computed == 11 and at[8].prompt_tokens_reused == 21
    assert at[2].model_calls == 2 and at[2].prompt_tokens_computed == pytest.approx(11 / 4)
    local = evaluate(DiceGenerator(), PROBLEMS[:1], config, tmp_path / "local")  # one shared prefill
    assert {p.n: p.cost.prompt_tokens_computed for p in local.points} == {2: 4, 8: 4}


@pytest.mark.parametrize("engine", ["openai", "llama.cpp"])
def test_every_text_level_strategy_runs_over_a_server_without_token_ids(tmp_path, capsys, engine):
    """OpenAI's API and llama.cpp's server return token texts with logprobs but never ids; with no
    tokenizer given, every strategy that reads only text (and logprobs) must still evaluate from a
    pool, costed from the servers' usage. The fakes (tests/remote/fake_server.py) reproduce them:
    "openai" honours n in one request (usage: the total of the n samples); "llama.cpp" answers one
    choice per request (n fanned out, usage per sample)."""
    pytest.importorskip("httpx")
    from metagen.cli import main
    from metagen.remote import OpenAIGenerator
    from metagen.strategies.registry import STRATEGIES
    from tests.remote.fake_server import FakeServer

    with FakeServer(engine) as fake, OpenAIGenerator(fake.url, max_retries=0) as remote:
        assert "token_ids" not in remote.capabilities
        names = [name for name, spec in STRATEGIES.items() if not spec.uses_value and spec.supported_by(remote)]
        # what remains needs what these servers do not give: every next-token distribution
        # (self-certainty, which also reads ids), a continued assistant message, or the top logprobs a
        # judge reads, or a local model's cache (pg_td)
        assert {"greedy", "self_consistency", "best_of_n_logprob", "mbr_chrf", "self_refine"} <= set(names)
        assert {name for name, spec in STRATEGIES.items() if not spec.uses_value} - set(names) == {
            "best_of_n", "weighted_voting", "borda", "chain_of_thought", "s2a", "self_ask", "calculator", "search",
            "self_ask_search", "dsp", "mbr_judge", "pg_td"}
        config = EvalConfig(tuple(names), ns=(1, 2), params=SamplingParams(temperature=1.0, max_tokens=4))
        problems = [Problem("p0", "q0", "alpha"), Problem("p1", "q1", "beta")]
        report = evaluate(remote, problems, config, tmp_path / "api")
        code = main(["eval", "--backend", fake.url, "--task", "arithmetic", "--count", "2", "--strategy",
                     "self_consistency", "--n", "1,2", "--max-tokens", "4", "--out", str(tmp_path / "cli"), "--json"])
        captured = capsys.readouterr()
    assert code == 0, captured.err
    assert {p.strategy for p in report.points} == set(names) | {"pass@k"}
    pools = [record["pool"] for record in _records(tmp_path / "api") if record["kind"] == "pool"]
    for pool in pools:  # no ids stored; each sample's tokens counted all the same
        assert all(s["token_ids"] == [] and s["token_count"] == 4 and len(s["logprobs"]) == 4 for s in pool["samples"])
    at = {(p.strategy, p.n): p.cost for p in report.points}
    assert at[("self_consistency", 2)].generated_tokens == 8 and at[("self_consistency", 1)].generated_tokens == 4
    assert at[("self_consistency", 2)].prompt_tokens_computed > 0
    assert [(r["strategy"], r["n"]) for r in json.loads(captured.out)["results"]] == [
        ("self_consistency", 1), ("self_consistency", 2), ("pass@k", 1), ("pass@k", 2)]


def test_each_unit_pays_for_its_prompt_once_from_a_cold_prompt_cache(tmp_path, tiny_checkpoint):
    """LocalGenerator keeps the last prompt (PromptCache): the harness empties it before every
    unit, so greedy run after the pool of the same prompt still pays for the prompt; adaptive
    consistency, evaluated from the pool in rounds, pays for it in its first round only, as it
    would running on this generator (tests/eval/test_pool.py: every round on one that keeps
    nothing)."""
    from metagen.decoding import LocalGenerator
    from metagen.models import load

    generator = LocalGenerator(load(tiny_checkpoint, dtype="fp32"), chat=False)
    config = EvalConfig(("greedy", "adaptive_consistency"), ns=(4,),
                        params=SamplingParams(temperature=1.0, max_tokens=4, ignore_eos=True))
    problem = Problem("p0", "What is 3 + 4?", "7")
    report = evaluate(generator, [problem], config, tmp_path)
    records = _records(tmp_path)
    pool = next(r["pool"] for r in records if r["kind"] == "pool")
    greedy = next(r["cost"] for r in records if r["kind"] == "live" and r["strategy"] == "greedy")
    assert greedy["prompt_tokens_computed"] == pool["prompt_tokens"] > 0
    adaptive = next(p for p in report.points if p.strategy == "adaptive_consistency")
    assert adaptive.samples > 1  # more than one round on average
    assert adaptive.cost.prompt_tokens_computed == pool["prompt_tokens"]
    assert adaptive.cost.flops > pool["prompt_flops"]
