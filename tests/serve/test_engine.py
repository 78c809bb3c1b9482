"""The engine alone (no HTTP): requests joining a running batch at different steps, each with
its own sampling parameters, constraint and seed, give exactly what the sampling loop gives
each of them alone; cancelled requests leave; the bounds refuse what cannot be admitted."""

from __future__ import annotations

import time

import pytest

from metagen.decoding import generate
from metagen.decoding.prompts import encode_prompt
from metagen.sampling import SamplingParams
from metagen.serve.engine import DoneEvent, Engine, EngineStoppedError, QueueFullError, ServeRequest
from tests.serve.events import Collector

pytestmark = pytest.mark.slow


def _request(model, prompt, params) -> tuple[ServeRequest, Collector]:
    collector = Collector()
    return ServeRequest(encode_prompt(model.tokenizer, prompt, chat=False), params, collector), collector


@pytest.fixture
def engine(model):
    running = Engine(model, max_rows=8, max_queue=8)
    running.start()
    yield running
    running.stop()


def test_requests_joining_a_running_batch_equal_the_sampling_loop_alone(model, engine):
    cases = [
        ("The capital of France is", SamplingParams(temperature=0, max_tokens=30)),
        ("Once upon a time", SamplingParams(temperature=0.9, top_k=40, seed=1, n=2, max_tokens=25)),
        ("My favourite colour is", SamplingParams(temperature=0, max_tokens=12, logprobs=2,
                                                  structured_outputs={"choice": ["red", "green", "blue"]})),
        ("def add(a, b):", SamplingParams(temperature=0.7, repetition_penalty=1.2, no_repeat_ngram_size=3,
                                          seed=9, max_tokens=30, stop=["\n\n"])),
        ("1, 2, 3,", SamplingParams(temperature=1.0, min_p=0.1, seed=2, max_tokens=20, n=3)),
    ]
    submitted = []
    for prompt, params in cases:  # each joins once the one before it has started decoding
        request, collector = _request(model, prompt, params)
        engine.submit(request)
        submitted.append((request, collector))
        deadline = time.monotonic() + 60
        while not collector.events:
            assert time.monotonic() < deadline
            time.sleep(0.001)
    for request, collector in submitted:
        assert collector.done.wait(120)
        assert collector.events[-1] == DoneEvent()
    assert engine.stats.max_batch_rows > 2  # the requests really shared decode steps
    for (prompt, params), (request, collector) in zip(cases, submitted):
        alone = generate(model, prompt, params, chat=False)
        assert [c.token_ids for c in request.completions] == [c.token_ids for c in alone.completions]
        assert [c.text for c in request.completions] == [c.text for c in alone.completions]
        assert [c.finish_reason for c in request.completions] == [c.finish_reason for c in alone.completions]
        for mine, theirs in zip(request.completions, alone.completions):
            assert mine.logprobs == pytest.approx(theirs.logprobs, abs=1e-5)
            assert mine.complete == theirs.complete
        # the streamed events spell the same texts
        for index, completion in enumerate(request.completions):
            tokens = collector.tokens_of(index)
            assert "".join(e.text for e in tokens) == completion.text
            assert [e.token_id for e in tokens] == completion.token_ids
            assert [e.finish_reason is not None for e in tokens] == [False] * (len(tokens) - 1) + [True]


def test_a_cancelled_request_leaves_and_the_others_go_on(model, engine):
    long, long_events = _request(model, "Tell me a story.", SamplingParams(temperature=1.0, seed=0, max_tokens=3000,
                                                                          ignore_eos=True))
    short, short_events = _request(model, "The capital of France is", SamplingParams(temperature=0, max_tokens=20))
    engine.submit(long)
    engine.submit(short)
    deadline = time.monotonic() + 60
    while len(long_events.events) < 5:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    long.cancel()
    assert long_events.done.wait(30) and long_events.events[-1] == DoneEvent("cancelled")
    assert short_events.done.wait(60) and short_events.events[-1] == DoneEvent()
    assert short.completions[0].text == generate(model, "The capital of France is",
                                                 SamplingParams(temperature=0, max_tokens=20), chat=False).text
    assert len(long.completions[0].token_ids) < 3000
    while engine.stats.batch_rows:  # the next step drops the rows
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert engine.stats.requests_cancelled == 1


def test_a_request_past_its_timeout_is_stopped(model, engine):
    request, events = _request(model, "Tell me a story.", SamplingParams(temperature=1.0, seed=0, max_tokens=3000,
                                                                        ignore_eos=True))
    request.timeout = 0.5
    engine.submit(request)
    assert events.done.wait(30)
    assert events.events[-1].timed_out and "0.5 s timeout" in events.events[-1].error
    assert 0 < len(request.completions[0].token_ids) < 3000
    assert engine.stats.requests_timed_out == 1


def test_bounds(model):
    engine = Engine(model, max_rows=2, max_queue=1)  # not started: submissions stay queued
    with pytest.raises(ValueError, match="n=3 is more than the server's --max-rows 2"):
        engine.submit(_request(model, "Hi", SamplingParams(n=3))[0])
    engine.submit(_request(model, "Hi", SamplingParams())[0])
    with pytest.raises(QueueFullError, match="--max-queue 1"):
        engine.submit(_request(model, "Hi", SamplingParams())[0])
    assert engine.queue_depth == 1
    with pytest.raises(ValueError, match="max_rows=0"):
        Engine(model, max_rows=0)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the fault is re-raised
def test_a_fault_in_the_engine_loop_answers_everyone_and_refuses_new_requests(model, monkeypatch):
    engine = Engine(model, max_rows=4, max_queue=4)

    def broken_step():
        raise RuntimeError("broken step")

    monkeypatch.setattr(engine, "_step", broken_step)
    request, events = _request(model, "Hi", SamplingParams(max_tokens=5))
    engine.submit(request)
    engine.start()
    assert events.done.wait(30)
    assert events.events[-1] == DoneEvent("the engine stopped: RuntimeError: broken step")
    engine._thread.join(10)
    assert not engine.alive
    with pytest.raises(EngineStoppedError, match="broken step"):
        engine.submit(_request(model, "Hi", SamplingParams())[0])


def test_a_strategy_call_over_max_rows_runs_as_groups_of_rows(model):
    """n = 5 on an engine of 2 rows: three requests of 2, 2 and 1 rows; every completion comes
    back, a seed reproduces them, and each group drew from its own generator (the groups differ)."""
    from metagen.serve.engine_generator import EngineGenerator

    engine = Engine(model, max_rows=2, max_queue=8)
    engine.start()
    try:
        generator = EngineGenerator(engine, model, chat=False)
        params = SamplingParams(temperature=1.0, seed=3, n=5, max_tokens=8, ignore_eos=True)
        first = generator.generate("Once upon a time", params)
        again = generator.generate("Once upon a time", params)
    finally:
        engine.stop()
    texts = [completion.text for completion in first.completions]
    assert len(texts) == 5 and all(len(c.token_ids) == 8 for c in first.completions)
    assert texts == [completion.text for completion in again.completions]
    assert texts[0:2] != texts[2:4]  # not one generator replayed per group
    assert generator.requests == 2 and generator.completion_tokens == 2 * 5 * 8
    assert first.cost.generated_tokens == 40
