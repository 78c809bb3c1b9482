"""Concurrent evaluation: same results as a sequential run, refused for a local-only generator,
exactly-once and resumable when killed mid-run."""

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from metagen.decoding.errors import RequestFailedError
from metagen.eval import EvalConfig, Problem, evaluate
from metagen.eval.running import UnfinishedProblemsError
from metagen.sampling import SamplingParams
from tests.eval.dice import PROBLEMS, ConcurrentDiceGenerator, DiceGenerator

ROOT = Path(__file__).resolve().parents[2]
CONFIG = EvalConfig(("greedy", "self_consistency", "self_refine"), ns=(1, 2, 4),
                    params=SamplingParams(temperature=1.0))
MANY = [Problem(f"p{i}", f"question {i}", str(i % 3)) for i in range(40)]


def _timeless(value):
    """`value` without its wall-clock fields (seconds differ between runs, nothing else may)."""
    if isinstance(value, dict):
        return {k: _timeless(v) for k, v in value.items() if not k.endswith("_seconds")}
    if isinstance(value, list):
        return [_timeless(v) for v in value]
    return value


def _lines(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]


def _keys(out: Path) -> list[tuple]:
    return [(r["kind"], r["id"], r.get("strategy"), r.get("n")) for r in _lines(out) if r["kind"] != "setup"]


def _canonical(out: Path) -> set[str]:
    return {json.dumps(_timeless(record), sort_keys=True) for record in _lines(out)}


def test_concurrent_results_equal_sequential_ones(tmp_path):
    sequential = evaluate(ConcurrentDiceGenerator(delay=0.0), PROBLEMS, CONFIG, tmp_path / "one")
    generator = ConcurrentDiceGenerator()
    seen = []
    concurrent = evaluate(generator, PROBLEMS, CONFIG, tmp_path / "four", concurrency=4,
                          progress=lambda done, total: seen.append((done, total)))
    assert generator.peak > 1  # calls did overlap
    assert _canonical(tmp_path / "four") == _canonical(tmp_path / "one")
    assert len(_lines(tmp_path / "four")) == len(_lines(tmp_path / "one"))
    assert _timeless(concurrent.to_dict()) == _timeless(sequential.to_dict())
    assert seen == [(done, len(PROBLEMS)) for done in range(1, len(PROBLEMS) + 1)]


def test_concurrency_is_refused_for_a_generator_that_does_not_allow_it(tmp_path):
    generator = DiceGenerator()
    with pytest.raises(ValueError, match=r"concurrency=2 .*DiceGenerator may not"):
        evaluate(generator, PROBLEMS, CONFIG, tmp_path, concurrency=2)
    with pytest.raises(ValueError, match=r"concurrency=0 is out of range"):
        evaluate(ConcurrentDiceGenerator(), PROBLEMS, CONFIG, tmp_path, concurrency=0)
    assert generator.calls == [] and not (tmp_path / "results.jsonl").exists()


def test_the_local_generator_is_not_concurrent_and_the_remote_one_is():
    pytest.importorskip("httpx")
    from metagen.decoding import LocalGenerator
    from metagen.remote import OpenAIGenerator

    assert LocalGenerator.concurrent is False and OpenAIGenerator.concurrent is True


def test_a_failing_problem_stops_the_run_and_names_the_problem(tmp_path):
    class Failing(ConcurrentDiceGenerator):
        def generate(self, prompt, params, *, generator=None):
            if "question 3" in str(prompt):
                raise ValueError("no room")
            return super().generate(prompt, params, generator=generator)

    with pytest.raises(ValueError, match="problem 'p3': no room"):
        evaluate(Failing(), PROBLEMS, CONFIG, tmp_path, concurrency=3)
    keys = _keys(tmp_path)
    assert len(keys) == len(set(keys))


_SCRIPT = """
import sys
sys.path.insert(0, {root!r})
from metagen.eval import EvalConfig, Problem, evaluate
from metagen.sampling import SamplingParams
from tests.eval.dice import ConcurrentDiceGenerator
problems = [Problem(f"p{{i}}", f"question {{i}}", str(i % 3)) for i in range(40)]
config = EvalConfig(("greedy", "self_consistency", "self_refine"), ns=(1, 2, 4),
                    params=SamplingParams(temperature=1.0))
evaluate(ConcurrentDiceGenerator(delay=float(sys.argv[2])), problems, config, sys.argv[1], concurrency=4)
"""


def test_a_killed_concurrent_run_resumes_exactly_once(tmp_path):
    whole = ConcurrentDiceGenerator(delay=0.0)
    reference = evaluate(whole, MANY, CONFIG, tmp_path / "whole", concurrency=4)
    out = tmp_path / "killed"
    script = _SCRIPT.format(root=str(ROOT))
    process = subprocess.Popen([sys.executable, "-c", script, str(out), "0.05"], env=os.environ.copy())
    results = out / "results.jsonl"
    deadline = time.monotonic() + 60
    while not (results.exists() and results.read_text().count("\n") >= 12):
        assert process.poll() is None, "the run ended before it could be killed"
        assert time.monotonic() < deadline
        time.sleep(0.01)
    process.send_signal(signal.SIGKILL)
    process.wait()
    total = len(_lines(tmp_path / "whole"))
    written = results.read_text().count("\n")
    assert 12 <= written < total  # killed mid-run
    generator = ConcurrentDiceGenerator(delay=0.0)
    resumed = evaluate(generator, MANY, CONFIG, out, concurrency=4)
    keys = _keys(out)
    assert len(keys) == len(set(keys)) == total - 1  # every unit once (and one setup line)
    assert Counter(kind for kind, *_ in keys) == Counter(kind for kind, *_ in _keys(tmp_path / "whole"))
    assert len(generator.calls) < len(whole.calls)  # units on disk were not regenerated
    assert _canonical(out) == _canonical(tmp_path / "whole")
    assert _timeless(resumed.to_dict()) == _timeless(reference.to_dict())


@pytest.mark.parametrize("concurrency", [1, 3])
def test_a_problem_whose_request_finally_fails_leaves_the_others_to_finish(tmp_path, concurrency):
    """A remote server failing one problem's request past its retries (a fault proxy's drops, a
    server busy past the deadline): the other problems finish, the unfinished one is named, and a
    rerun resumes it alone."""
    pytest.importorskip("httpx")
    from metagen.remote import ServerError

    class Flaky(ConcurrentDiceGenerator):
        failing = True

        def generate(self, prompt, params, *, generator=None):
            if self.failing and "question 3" in str(prompt):
                raise ServerError("http://127.0.0.1:1/v1/completions", None, "no answer within the call's deadline")
            return super().generate(prompt, params, generator=generator)

    with pytest.raises(UnfinishedProblemsError, match=r"1 of \d+ problems unfinished.*rerun with the same "
                                                      r"directory .*p3: .*deadline") as raised:
        evaluate(flaky := Flaky(), PROBLEMS, CONFIG, tmp_path, concurrency=concurrency)
    assert list(raised.value.failures) == ["p3"]
    finished = {key[1] for key in _keys(tmp_path)}
    assert finished == {p.id for p in PROBLEMS} - {"p3"}
    flaky.failing, before = False, len(flaky.calls)  # the server is back
    evaluate(flaky, PROBLEMS, CONFIG, tmp_path, concurrency=concurrency)
    assert {key[1] for key in _keys(tmp_path)} == {p.id for p in PROBLEMS}
    assert flaky.calls[before:] and all("question 3" in str(call) for call in flaky.calls[before:])  # it alone ran


class _Down(RequestFailedError):
    """A backend's own failed-request error: counted by its declared type, not by its module."""


class _Refused(RequestFailedError, ValueError):
    """A failed request that is the request's fault (as `remote.InvalidRequestError`)."""


@pytest.mark.parametrize(("error", "raised"), [(_Down, UnfinishedProblemsError), (_Refused, ValueError),
                                               (RuntimeError, RuntimeError)])
def test_only_a_declared_request_failure_leaves_the_problem_unfinished(tmp_path, error, raised):
    """`RequestFailedError` is the contract, whatever backend raises it (no remote module loaded
    or consulted); one that is also a ValueError, or any other error, stops the run."""
    class Failing(ConcurrentDiceGenerator):
        def generate(self, prompt, params, *, generator=None):
            if "question 3" in str(prompt):
                raise error("the server went away")
            return super().generate(prompt, params, generator=generator)

    if raised is UnfinishedProblemsError:  # the others ran to the end
        with pytest.raises(UnfinishedProblemsError, match=r"1 of 5 problems unfinished.*p3: the server went away"):
            evaluate(Failing(), PROBLEMS, CONFIG, tmp_path, concurrency=2)
        assert {key[1] for key in _keys(tmp_path)} == {p.id for p in PROBLEMS} - {"p3"}
    else:  # the run stopped at it
        with pytest.raises(raised, match=r"^(problem 'p3': )?the server went away$") as stopped:
            evaluate(Failing(), PROBLEMS, CONFIG, tmp_path, concurrency=2)
        assert not isinstance(stopped.value, UnfinishedProblemsError)
        assert "p3" not in {key[1] for key in _keys(tmp_path)}


def test_the_remote_errors_are_declared_request_failures_and_running_imports_no_httpx():
    done = subprocess.run([sys.executable, "-c", "import sys, metagen.eval.running; print('httpx' in sys.modules)"],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert done.stdout.split() == ["False"], done.stderr[-2000:]
    pytest.importorskip("httpx")
    from metagen.remote import FleetUnavailableError, InvalidRequestError, ServerError

    assert issubclass(ServerError, RequestFailedError) and issubclass(FleetUnavailableError, RequestFailedError)
    assert issubclass(InvalidRequestError, ValueError)  # the request's fault: it stops a run
