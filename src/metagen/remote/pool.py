"""Which endpoint of a fleet takes the next request: least outstanding, bounded, health-checked.

    pick = argmin over live, trusted endpoints that have not refused this request with an HTTP
           error, with outstanding < min(max_concurrency, endpoint's slots), of
           (times this request already failed there, outstanding, requests sent)
    stalled(e) = now - (last byte of e's oldest-heard request in flight) >= stall_seconds
                 and a peer received a byte since then

Passive stall detection: each request in flight on an endpoint carries the time of the last byte
of its answer (its sending time until one arrives; every chunk of a stream moves it; a whole
answer ends it). An endpoint whose least recently heard request has been silent for
`stall_seconds` while another endpoint answered meanwhile is suspect: it gets no new request
(unless no trusted endpoint is live) and is health-checked at once, one check at a time, again
at each new request while it is suspect (and by `watch`). It is trusted again as soon as
anything comes from it: a byte of an answer, or a health check's answer (which restarts the
silence of its requests in flight). A server that accepts connections but answers nothing is so
noticed within seconds, not at its requests' timeouts; a slow one (a long answer not streamed)
costs a health check. Its requests in flight are left to finish (or to the rules below).

Outlier detection: an endpoint is live until `failures_to_eject` consecutive requests fail on it
with no answer (connection errors, timeouts of a server not answering its health check, each
after the transport's own retries); then it is down for `cooldown` seconds, after which the next
`acquire` health-checks it (one checker at a time) and takes it back or leaves it down for another
cool-down. An HTTP error status (a 500 for one request the engine cannot run, a 429) says nothing
about the endpoint's health and is not counted, and a timeout of a server that still answers its
health check is slowness, not death; the last live endpoint is never ejected by request failures
(ejecting it would turn one bad request into 503 for everyone). `watch(interval)` checks the live
ones on a schedule too: one failing its check (an error, or no answer within the transport's
HEALTH_TIMEOUT) is taken out the same way, the last one too, before a request fails on it, and
the requests in flight on an endpoint taken out are cancelled (the fleet sends them to another);
endpoints whose cool-down is over are rechecked, as the next request would. A check given no
answer in time is not enough while the endpoint is making progress (a byte of an answer came from
it within PROGRESS_SECONDS): llama-cpp-python's server, generating on a loaded machine, answers
/v1/models late but is alive; one that answers nothing, requests nor checks, is hung. The pool
lives on the fleet's event loop (`loop.py`): every coroutine that acquires and releases runs on that one thread, so its state
needs no lock (other threads only read counts, through `stats`). An acquire with every live
endpoint at its limit awaits a release. With no endpoint live, `acquire` raises
`FleetUnavailableError` naming each endpoint and its last failure.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from metagen.decoding.errors import RequestFailedError

PROGRESS_SECONDS = 60.0  # an endpoint that sent a byte of an answer this recently is busy, not hung
STALL_SECONDS = 5.0  # an endpoint silent this long on a request, while its peers answer, gets no new one


class FleetUnavailableError(RequestFailedError):
    """Every endpoint of a fleet is down: the message names each one and its last failure."""


@dataclass
class Endpoint:
    """One server of a fleet and what happened to it (counts are of requests, not attempts)."""

    url: str
    member: object  # the OpenAIGenerator of this server
    requests: int = 0  # answered
    failures: int = 0  # failed (each after the transport's retries)
    outstanding: int = 0
    sent: int = 0  # requests given to it (ties go to the one given fewest: not to one that never answers)
    slots: int | None = None  # requests it works on at once (probed; None: not said)
    heard_at: float | None = None  # when a byte of an answer to a request last came from it (the pool's clock)
    suspect: str | None = None  # why it gets no new request while it is silent (None: trusted)
    consecutive: int = 0
    down_until: float | None = None  # None: live
    checking: bool = False
    last_failure: str | None = None
    # task of each request in flight on it (cancelled when taken out) -> the last byte of its answer
    # (when it was sent, until one arrives)
    attempts: dict = field(default_factory=dict)

    def stats(self) -> dict:
        return {"requests": self.requests, "failures": self.failures, "outstanding": self.outstanding,
                "up": self.down_until is None, "suspect": self.suspect, "last_failure": self.last_failure,
                "slots": self.slots}


class EndpointPool:
    """Least-outstanding choice among live endpoints, at most `max_concurrency` in flight each.

    health_check(endpoint) -> awaitable of None when the endpoint answers, else the failure's text.
    stall_seconds: silence of a request in flight that makes its endpoint suspect (None: never).
    """

    def __init__(self, endpoints: Sequence[Endpoint], *, max_concurrency: int, failures_to_eject: int,
                 cooldown: float, health_check: Callable[[Endpoint], Awaitable[str | None]],
                 stall_seconds: float | None = STALL_SECONDS, clock: Callable[[], float] = time.monotonic) -> None:
        self.endpoints = list(endpoints)
        self.max_concurrency, self.failures_to_eject = max_concurrency, failures_to_eject
        self.cooldown, self.health_check, self.clock = cooldown, health_check, clock
        self.stall_seconds = stall_seconds
        self._waiters: list[asyncio.Future] = []  # acquires waiting for a change
        self._checks: set[asyncio.Task] = set()  # health checks of suspects, running

    def describe(self) -> str:
        """Each endpoint, up or down, with its last failure."""
        parts = []
        for e in self.endpoints:
            state = "up" if e.down_until is None else "down"
            parts.append(f"{e.url} ({state}; last failure: {e.last_failure or 'none'})")
        return "; ".join(parts)

    def take_down(self, endpoint: Endpoint, failure: str, forever: bool = False) -> None:
        """Out for the cool-down (or for good): its requests in flight are cancelled."""
        endpoint.last_failure, endpoint.suspect = failure, None
        endpoint.down_until = float("inf") if forever else self.clock() + self.cooldown
        for attempt in list(endpoint.attempts):
            attempt.cancel()
        self._wake()

    def capacity(self) -> int:
        """Requests the live endpoints take at once (the trusted ones, when some are; at least 1)."""
        return max(sum(self._limit(e) for _, e in self._eligible(frozenset())), 1)

    def _limit(self, endpoint: Endpoint) -> int:
        return min(self.max_concurrency, endpoint.slots or self.max_concurrency)

    async def acquire(self, tried: dict[int, int], refused: frozenset[int] = frozenset()) -> Endpoint | None:
        """A live endpoint with room, counted as outstanding; `tried`: failures of this request by
        endpoint index (chosen last), `refused`: endpoints that answered it with an HTTP error (not
        chosen). None when every endpoint not refused is down (and none is being checked);
        FleetUnavailableError when nothing was refused and every endpoint is down."""
        while True:
            self._suspect_stalled()
            due = self._claim_due()
            if due is not None:
                await self._recheck(due)
                continue
            chosen = self._choose(tried, refused)
            if chosen is not None:
                chosen.outstanding += 1
                chosen.sent += 1
                return chosen
            others = [e for i, e in enumerate(self.endpoints) if i not in refused]
            if all(e.down_until is not None and not e.checking for e in others):
                if not refused:
                    raise FleetUnavailableError(f"every endpoint of the fleet is down: {self.describe()}")
                return None
            await self._wait(self._next_due_in())

    def release(self, endpoint: Endpoint, failure: str | None, counted: bool = True, recorded: bool = True) -> None:
        """The request on `endpoint` ended: answered (failure None) or failed. counted: an outlier
        failure (no answer) towards ejection; recorded=False for failures that say nothing about
        the endpoint (a request it rejected as invalid, one cancelled by its caller)."""
        endpoint.outstanding -= 1
        if failure is None:
            endpoint.requests += 1
            endpoint.consecutive = 0
            self.heard(endpoint)
        elif counted:
            endpoint.failures += 1
            endpoint.consecutive += 1
            endpoint.last_failure = failure
            others_live = any(e.down_until is None for e in self.endpoints if e is not endpoint)
            if endpoint.consecutive >= self.failures_to_eject and endpoint.down_until is None and others_live:
                self.take_down(endpoint, failure)
        elif recorded:  # the request's own failure (HTTP 5xx), or slowness: named, not counted
            endpoint.failures += 1
            endpoint.last_failure = failure
        self._wake()

    def heard(self, endpoint: Endpoint, attempt: asyncio.Future | None = None) -> None:
        """A byte of an answer came from `endpoint` (for its request in flight `attempt`, or a
        whole answer): it is making progress, and trusted again if it was suspect."""
        now = endpoint.heard_at = self.clock()
        if attempt in endpoint.attempts:
            endpoint.attempts[attempt] = now
        self._trust(endpoint)

    def _trust(self, endpoint: Endpoint) -> None:
        if endpoint.suspect is not None:
            endpoint.suspect = None
            self._wake()

    def _suspect_stalled(self) -> None:
        """Mark each live endpoint that `stalled` (module docstring) as suspect, and start a health
        check of every suspect not being checked (it brings the endpoint back when answered)."""
        if self.stall_seconds is None:
            return
        now = self.clock()
        for endpoint in self.endpoints:
            if endpoint.down_until is not None or endpoint.checking:
                continue
            if endpoint.suspect is None:
                since = min(endpoint.attempts.values(), default=None)  # the least recently heard request
                if since is None or now - since < self.stall_seconds or not any(
                        peer.heard_at is not None and peer.heard_at > since
                        for peer in self.endpoints if peer is not endpoint and peer.down_until is None):
                    continue
                endpoint.suspect = (f"stalled: a request in flight has had no byte for {now - since:.3g} s "
                                    f"(stall_seconds={self.stall_seconds:g}) while other endpoints answered")
                endpoint.last_failure = endpoint.suspect
            endpoint.checking = True
            task = asyncio.get_running_loop().create_task(self._recheck(endpoint))
            self._checks.add(task)
            task.add_done_callback(self._checks.discard)

    async def stop(self) -> None:
        """Cancel the health checks of suspects that are running (the fleet is closing)."""
        for task in list(self._checks):
            task.cancel()
        await asyncio.gather(*self._checks, return_exceptions=True)

    def _wake(self) -> None:
        """Wake every waiting acquire: something changed (a release, an endpoint up or down)."""
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._waiters.clear()

    async def _wait(self, timeout: float | None) -> None:
        """Until the next change, or `timeout` seconds (None: no limit)."""
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await asyncio.wait_for(waiter, timeout)
        except asyncio.TimeoutError:
            pass
        finally:
            if waiter in self._waiters:
                self._waiters.remove(waiter)

    def _eligible(self, refused: frozenset[int]) -> list[tuple[int, Endpoint]]:
        """(index, endpoint) of the live endpoints not in `refused`: the trusted ones, or the
        suspects when none is trusted."""
        live = [(i, e) for i, e in enumerate(self.endpoints) if i not in refused and e.down_until is None]
        return [(i, e) for i, e in live if e.suspect is None] or live

    def _choose(self, tried: dict[int, int], refused: frozenset[int]) -> Endpoint | None:
        free = [(i, e) for i, e in self._eligible(refused) if e.outstanding < self._limit(e)]
        best = min(free, key=lambda item: (tried.get(item[0], 0), item[1].outstanding, item[1].sent), default=None)
        return None if best is None else best[1]

    def _claim_due(self) -> Endpoint | None:
        """A down endpoint whose cool-down is over, marked as being checked (one checker each)."""
        now = self.clock()
        for e in self.endpoints:
            if e.down_until is not None and now >= e.down_until and not e.checking:
                e.checking = True
                return e
        return None

    async def watch(self, interval: float) -> None:
        """Every `interval` seconds: health-check every live endpoint at once, taking out each that
        fails (down for the cool-down, no request counted as failed), and recheck those whose
        cool-down is over. Runs until cancelled."""
        while True:
            await asyncio.sleep(interval)
            live = [e for e in self.endpoints if e.down_until is None]
            due = []
            while (endpoint := self._claim_due()) is not None:
                due.append(endpoint)
            await asyncio.gather(*(self.check(e) for e in live), *(self._recheck(e) for e in due),
                                 return_exceptions=True)

    async def check(self, endpoint: Endpoint) -> str | None:
        """Health-check `endpoint` now and act on it: back in service when it answers (unless out
        for good), out for the cool-down when it does not (its requests in flight cancelled).
        None when it answered, else the failure."""
        try:
            failure = await self.health_check(endpoint)
        except Exception as error:  # noqa: BLE001 - a failing check is a failure, never a crash
            failure = f"{type(error).__name__}: {error}"
        if getattr(failure, "unanswered", False) and endpoint.down_until is None and self._progressing(endpoint):
            kept = "answering requests: busy, kept" if endpoint.suspect is None else endpoint.suspect
            endpoint.last_failure = f"health check: {failure} ({kept})"
            return None
        if endpoint.down_until != float("inf"):  # not taken out for good (by the check itself)
            if failure is None:
                endpoint.down_until, endpoint.consecutive = None, 0
                now = self.clock()  # it answers: its requests in flight are silent from now on
                for attempt in endpoint.attempts:
                    endpoint.attempts[attempt] = now
                self._trust(endpoint)
            else:
                self.take_down(endpoint, f"health check: {failure}")
        self._wake()
        return failure

    def _progressing(self, endpoint: Endpoint) -> bool:
        return endpoint.heard_at is not None and self.clock() - endpoint.heard_at < PROGRESS_SECONDS

    async def _recheck(self, endpoint: Endpoint) -> None:
        try:
            await self.check(endpoint)
        finally:
            endpoint.checking = False

    def _next_due_in(self) -> float | None:
        """Seconds until the next cool-down ends (None: none pending)."""
        ends = [e.down_until for e in self.endpoints if e.down_until is not None and e.down_until != float("inf")]
        return max(min(ends) - self.clock(), 0.01) if ends else None
