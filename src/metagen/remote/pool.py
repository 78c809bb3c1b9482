"""Which endpoint of a fleet takes the next request: least outstanding, bounded, health-checked.

    pick = argmin over live endpoints with outstanding < limit of
           (times this request already failed there, outstanding, answered)

An endpoint is live until `failures_to_eject` consecutive requests fail on it (connection
errors, timeouts, 429 / 5xx, each after the transport's own retries); then it is down for
`cooldown` seconds, after which the next `acquire` health-checks it (one checker at a time) and
takes it back or leaves it down for another cool-down. `watch(interval)` checks the live ones on
a schedule too: one failing its check is taken out the same way, before a request fails on it
(and endpoints whose cool-down is over are rechecked, as the next request would). The pool
lives on the fleet's event loop (`loop.py`): every coroutine that acquires and releases runs on that one thread, so its state
needs no lock (other threads only read counts, through `stats`). An acquire with every live
endpoint at its limit awaits a release. With no endpoint live, `acquire` raises
`FleetUnavailableError` naming each endpoint and its last failure.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass


class FleetUnavailableError(RuntimeError):
    """Every endpoint of a fleet is down: the message names each one and its last failure."""


@dataclass
class Endpoint:
    """One server of a fleet and what happened to it (counts are of requests, not attempts)."""

    url: str
    member: object  # the OpenAIGenerator of this server
    requests: int = 0  # answered
    failures: int = 0  # failed (each after the transport's retries)
    outstanding: int = 0
    consecutive: int = 0
    down_until: float | None = None  # None: live
    checking: bool = False
    last_failure: str | None = None

    def stats(self) -> dict:
        return {"requests": self.requests, "failures": self.failures, "outstanding": self.outstanding,
                "up": self.down_until is None, "last_failure": self.last_failure}


class EndpointPool:
    """Least-outstanding choice among live endpoints, at most `max_concurrency` in flight each.

    health_check(endpoint) -> awaitable of None when the endpoint answers, else the failure's text.
    """

    def __init__(self, endpoints: Sequence[Endpoint], *, max_concurrency: int, failures_to_eject: int,
                 cooldown: float, health_check: Callable[[Endpoint], Awaitable[str | None]],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.endpoints = list(endpoints)
        self.max_concurrency, self.failures_to_eject = max_concurrency, failures_to_eject
        self.cooldown, self.health_check, self.clock = cooldown, health_check, clock
        self._waiters: list[asyncio.Future] = []  # acquires waiting for a change

    def describe(self) -> str:
        """Each endpoint, up or down, with its last failure."""
        parts = []
        for e in self.endpoints:
            state = "up" if e.down_until is None else "down"
            parts.append(f"{e.url} ({state}; last failure: {e.last_failure or 'none'})")
        return "; ".join(parts)

    def take_down(self, endpoint: Endpoint, failure: str, forever: bool = False) -> None:
        endpoint.last_failure = failure
        endpoint.down_until = float("inf") if forever else self.clock() + self.cooldown
        self._wake()

    async def acquire(self, tried: dict[int, int]) -> Endpoint:
        """A live endpoint with room, counted as outstanding; `tried`: failures of this request
        by endpoint index (those are chosen last)."""
        while True:
            due = self._claim_due()
            if due is not None:
                await self._recheck(due)
                continue
            chosen = self._choose(tried)
            if chosen is not None:
                chosen.outstanding += 1
                return chosen
            if all(e.down_until is not None and not e.checking for e in self.endpoints):
                raise FleetUnavailableError(f"every endpoint of the fleet is down: {self.describe()}")
            await self._wait(self._next_due_in())

    def release(self, endpoint: Endpoint, failure: str | None, counted: bool = True) -> None:
        """The request on `endpoint` ended: answered (failure None) or failed; counted=False for
        failures that say nothing about the endpoint (a request it rejected as invalid)."""
        endpoint.outstanding -= 1
        if failure is None:
            endpoint.requests += 1
            endpoint.consecutive = 0
        elif counted:
            endpoint.failures += 1
            endpoint.consecutive += 1
            endpoint.last_failure = failure
            if endpoint.consecutive >= self.failures_to_eject and endpoint.down_until is None:
                endpoint.down_until = self.clock() + self.cooldown
        self._wake()

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

    def _choose(self, tried: dict[int, int]) -> Endpoint | None:
        free = [(i, e) for i, e in enumerate(self.endpoints)
                if e.down_until is None and e.outstanding < self.max_concurrency]
        if not free:
            return None
        return min(free, key=lambda item: (tried.get(item[0], 0), item[1].outstanding, item[1].requests))[1]

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
            checks = await asyncio.gather(*(self.health_check(e) for e in live),
                                          *(self._recheck(e) for e in due), return_exceptions=True)
            for endpoint, failure in zip(live, checks):
                if isinstance(failure, BaseException):
                    failure = f"{type(failure).__name__}: {failure}"
                if failure is not None and endpoint.down_until is None:
                    self.take_down(endpoint, f"health check: {failure}")

    async def _recheck(self, endpoint: Endpoint) -> None:
        try:
            failure = await self.health_check(endpoint)
        finally:
            endpoint.checking = False
        if failure is None:
            endpoint.down_until, endpoint.consecutive = None, 0
        else:
            endpoint.last_failure = f"health check: {failure}"
            if endpoint.down_until != float("inf"):  # not taken out for good by the check
                endpoint.down_until = self.clock() + self.cooldown
        self._wake()

    def _next_due_in(self) -> float | None:
        """Seconds until the next cool-down ends (None: none pending)."""
        ends = [e.down_until for e in self.endpoints if e.down_until is not None and e.down_until != float("inf")]
        return max(min(ends) - self.clock(), 0.01) if ends else None
