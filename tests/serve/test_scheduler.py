"""The engine's scheduler alone (no model, no cache): which waiting requests leave or get rows
(first come, first served within max_rows, no overtaking), how the prompt budget is split, and
the cache rows of each running request; and how a DoneEvent names its outcome."""

from __future__ import annotations

import pytest

from metagen.sampling import SamplingParams
from metagen.serve.requests import DoneEvent, EngineStats, QueueFullError, ServeRequest
from metagen.serve.request_state import RequestStatus
from metagen.serve.scheduler import Scheduler


class _Rows:
    """A RowBatch's `active` only: the scheduler counts live rows and nothing else."""

    def __init__(self, live: int) -> None:
        self.active = list(range(live))


def _submit(scheduler: Scheduler, prompt_length: int, n: int = 1, timeout: float | None = None, emit=None):
    request = ServeRequest(list(range(prompt_length)), SamplingParams(n=n), emit or (lambda event: None),
                           timeout=timeout)
    request.submitted = 0.0
    scheduler.reserve()  # as `Engine.submit` does
    return scheduler.add(request)


def _run(scheduler: Scheduler, state, live: int) -> None:
    state.batch = _Rows(live)
    scheduler.start_running(state)


def test_rows_are_given_first_come_first_served_and_a_request_that_does_not_fit_holds_back_the_rest():
    scheduler = Scheduler(max_rows=4, prefill_chunk=256)
    _run(scheduler, _submit(scheduler, 5, n=2), live=2)  # 2 of the 4 rows in use
    first, big, small = _submit(scheduler, 5, n=1), _submit(scheduler, 5, n=2), _submit(scheduler, 5, n=1)
    admission = scheduler.admit(now=1.0)
    assert admission.stopped == [] and admission.admitted == [first]  # `small` would fit, but not before `big`
    assert scheduler.waiting == [first, big, small]  # admitted requests wait until their prompt is in


def test_cancelled_and_late_requests_leave_and_do_not_hold_back_the_others():
    scheduler = Scheduler(max_rows=2, prefill_chunk=256)
    cancelled, late, on_time = _submit(scheduler, 5), _submit(scheduler, 5, timeout=0.5), _submit(scheduler, 5, n=2)
    cancelled.request.cancel()
    admission = scheduler.admit(now=1.0)
    assert [(state, event.outcome) for state, event in admission.stopped] == [(cancelled, "cancelled"),
                                                                              (late, "timed_out")]
    assert admission.admitted == [on_time]


def test_the_prompt_budget_is_split_by_prefill_plan_over_what_is_left_to_prefill():
    scheduler = Scheduler(max_rows=8, prefill_chunk=256)
    long, short = _submit(scheduler, 3000), _submit(scheduler, 40)
    long.prefilled = 100  # cached prefix or earlier pieces
    # half the budget to the oldest (128), the short one whole (40), what is left to the oldest (88)
    assert [(state, tokens) for state, tokens in scheduler.plan_prefill([long, short])] == [(long, 216), (short, 40)]
    short.prefilled = 39
    assert [tokens for _, tokens in scheduler.plan_prefill([long, short])] == [255, 1]


def test_decode_gives_each_running_request_its_cache_rows_and_leaves_out_the_stopped_ones():
    scheduler = Scheduler(max_rows=8, prefill_chunk=256)
    states = [_submit(scheduler, 5, n=n) for n in (2, 3, 1)]
    for state, live in zip(states, (2, 1, 1)):  # the second has two rows ended already
        _run(scheduler, state, live)
    assert all(state.status is RequestStatus.RUNNING for state in states) and scheduler.waiting == []
    assert scheduler.rows_in_use() == 4
    states[1].request.cancel()
    schedule = scheduler.decode(now=1.0)
    assert [(state, event.outcome) for state, event in schedule.stopped] == [(states[1], "cancelled")]
    assert schedule.decoding == [(states[0], range(0, 2)), (states[2], range(3, 4))]


def test_every_request_leaves_through_finish_once_with_its_status_counted_and_the_queue_depth_down():
    scheduler = Scheduler(max_rows=4, prefill_chunk=256, max_queue=3)
    events = []
    running, prefilling, waiting = (_submit(scheduler, 5, emit=events.append) for _ in range(3))
    _run(scheduler, running, live=1)
    scheduler.start_prefill(prefilling)
    assert scheduler.queue_depth == 2 and prefilling.status is RequestStatus.PREFILLING
    scheduler.finish(prefilling, DoneEvent("cancelled"))
    assert prefilling.status is RequestStatus.CANCELLED and scheduler.waiting == [waiting]
    scheduler.finish_all("the server is shutting down")
    assert scheduler.waiting == scheduler.running == [] and scheduler.queue_depth == 0
    assert [state.status for state in (running, waiting)] == [RequestStatus.FAILED] * 2
    assert events == [DoneEvent("cancelled")] + [DoneEvent("the server is shutting down")] * 2
    assert (scheduler.stats.requests_cancelled, scheduler.stats.requests_failed) == (1, 2)


def test_the_queue_is_bounded_by_max_queue():
    scheduler = Scheduler(max_rows=4, prefill_chunk=256, max_queue=1)
    _submit(scheduler, 5)
    with pytest.raises(QueueFullError, match=r"1 requests are waiting \(--max-queue 1\)"):
        scheduler.reserve()


@pytest.mark.parametrize("event, outcome", [
    (DoneEvent(), "finished"),
    (DoneEvent("the request took longer than its 1 s timeout", timed_out=True), "timed_out"),
    (DoneEvent("cancelled"), "cancelled"),
    (DoneEvent("RuntimeError: every token of row 0 is forbidden"), "failed"),
    (DoneEvent("the backend failed", status=502), "failed"),
])
def test_a_done_event_names_its_outcome_and_is_counted_under_it(event, outcome):
    stats = EngineStats()
    stats.count(event)
    counts = {"finished": stats.requests_finished, "timed_out": stats.requests_timed_out,
              "cancelled": stats.requests_cancelled, "failed": stats.requests_failed}
    assert counts == {name: int(name == outcome) for name in counts}
    assert RequestStatus(outcome).value == outcome
