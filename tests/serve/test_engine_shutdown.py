"""Shutting the engine down ends every request through the one way out (`Scheduler.finish`), on the
real embedded model: stopped while a long prompt is prefilled in pieces, or while the batch
decodes, each waiting, prefilling and running request gets exactly one DoneEvent naming the
shutdown, takes its final status, is counted, and lets go of its prompt: no prefix stays locked,
no partial prompt row holds a slot, the queue is empty."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from metagen.models.prefix_cache import PrefixCache
from metagen.sampling import SamplingParams
from metagen.serve.engine import DoneEvent, Engine
from metagen.serve.request_state import RequestStatus

from .test_chunked_prefill import _prompt
from .test_prefix_cache import SYSTEM, Run, chat

pytestmark = pytest.mark.slow

SHUTDOWN = DoneEvent("the server is shutting down")
BUDGET = 4  # tokens the prefix cache may keep unlocked


def _locks(prefixes: PrefixCache) -> list[int]:
    """The lock count of every node of the prefix cache's tree."""
    counts, stack = [], list(prefixes.root.children.values())
    while stack:
        node = stack.pop()
        counts.append(node.locks)
        stack.extend(node.children.values())
    return counts


class StopAt:
    """`model.forward`, patched: at the first forward `when(tokens)` accepts (on the engine thread),
    the engine's requests and their statuses are noted and `Engine.stop` is called from another
    thread; the loop stops at its next check."""

    def __init__(self, engine: Engine, model, monkeypatch, when) -> None:
        self.engine, self.forward, self.when = engine, model.forward, when
        self.states, self.statuses, self.locked = [], [], 0
        self.stopper = threading.Thread(target=engine.stop)
        self.stopped = threading.Event()
        monkeypatch.setattr(model, "forward", self)

    def __call__(self, cache, tokens, **kwargs):
        if not self.stopper.is_alive() and not self.states and self.when(tokens):
            scheduler = self.engine.scheduler
            self.states = scheduler.waiting + scheduler.running
            self.statuses = [state.status for state in self.states]
            self.locked = sum(_locks(self.engine.prefix_cache))
            self.stopper.start()
            while not self.engine._stopping:
                time.sleep(0.001)
            self.stopped.set()
        return self.forward(cache, tokens, **kwargs)

    def join(self) -> None:
        if not self.stopped.wait(180):
            self.engine.stop()
            pytest.fail("the forward to stop at never came")
        self.stopper.join(120)
        assert not self.engine.alive


def _engine(model) -> Engine:
    return Engine(model, max_rows=2, max_queue=8, prefill_chunk=16,
                  cache_memory=BUDGET * model.kv_bytes_per_token)


def _ended_through_finish(engine: Engine, stop: StopAt, runs: list[Run]) -> None:
    for run in runs:
        assert run.done.is_set()
        assert [event for event in run.events if isinstance(event, DoneEvent)] == [SHUTDOWN]
        assert run.events[-1] == SHUTDOWN
    assert len(stop.states) == len(runs)
    for state in stop.states:
        assert state.status is RequestStatus.FAILED
        assert state.prefix_node is None and state.prompt_row is None
    assert engine.stats.requests_failed == len(runs)
    assert engine.stats.requests_finished == engine.stats.requests_cancelled == 0
    assert engine.queue_depth == 0
    assert not any(_locks(engine.prefix_cache))
    assert engine.prefix_cache.size <= BUDGET  # unlocked, then evicted down to the budget
    engine._cache.select([])  # the batch's rows: what is left holds no slot but the prefix cache's
    assert engine._cache.num_cached_slots == engine.prefix_cache.size


def test_a_shutdown_during_prefill_ends_every_request_through_finish(model_fp32, monkeypatch):
    engine = _engine(model_fp32)
    long_ids = _prompt(model_fp32, 3)

    def a_later_piece(tokens) -> bool:  # a piece of the long prompt after its first
        if not isinstance(tokens, list):
            return False
        piece = tokens[0]
        return any(long_ids[start:start + len(piece)] == piece for start in range(1, len(long_ids) - len(piece) + 1))

    stop = StopAt(engine, model_fp32, monkeypatch, a_later_piece)
    engine.start()
    running = Run(engine, chat(model_fp32, [{"role": "user", "content": "Hi"}]),
                  SamplingParams(temperature=0, max_tokens=2000, ignore_eos=True))
    assert running.first.wait(120)
    prefilling = Run(engine, long_ids, SamplingParams(temperature=0, max_tokens=4))
    waiting = Run(engine, chat(model_fp32, [{"role": "system", "content": SYSTEM}]), SamplingParams(max_tokens=4))
    stop.join()
    assert [state.request for state in stop.states] == [prefilling.request, waiting.request, running.request]
    assert stop.statuses == [RequestStatus.PREFILLING, RequestStatus.WAITING, RequestStatus.RUNNING]
    assert stop.locked > 0  # the running request's prompt was locked
    _ended_through_finish(engine, stop, [running, prefilling, waiting])


def test_a_shutdown_during_decode_ends_every_request_through_finish(model_fp32, monkeypatch):
    engine = _engine(model_fp32)
    decodes = []

    def third_decode_of_two_rows(tokens) -> bool:
        if isinstance(tokens, torch.Tensor) and tokens.shape == (2, 1):
            decodes.append(tokens)
        return len(decodes) == 3

    stop = StopAt(engine, model_fp32, monkeypatch, third_decode_of_two_rows)
    params = SamplingParams(temperature=0, max_tokens=2000, ignore_eos=True)
    first = Run(engine, chat(model_fp32, [{"role": "user", "content": "Hi"}]), params)
    second = Run(engine, chat(model_fp32, [{"role": "user", "content": "Tell me a story."}]), params)
    waiting = Run(engine, chat(model_fp32, [{"role": "system", "content": SYSTEM}]), SamplingParams(max_tokens=4))
    engine.start()
    stop.join()
    assert [state.request for state in stop.states] == [waiting.request, first.request, second.request]
    assert stop.statuses == [RequestStatus.WAITING, RequestStatus.RUNNING, RequestStatus.RUNNING]
    assert stop.locked > 0  # the running requests' prompts were locked
    assert first.first.is_set() and second.first.is_set()
    _ended_through_finish(engine, stop, [first, second, waiting])
