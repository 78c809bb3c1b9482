"""A private event loop on a background thread: the synchronous face of the async transport.

    loop = BackgroundLoop("metagen-remote")
    loop.run(coroutine)           # blocks until done; from any thread, even one running its own
                                  # event loop (a notebook cell), where asyncio.run is refused
    await loop.call(coroutine)    # from async code on any event loop: runs it on this one
    loop.close()                  # cancels what is pending, stops the loop, joins the thread

An `httpx.AsyncClient` belongs to the event loop it was first used on, and a synchronous caller
inside a running loop can neither `asyncio.run` nor block that loop waiting for itself. So every
coroutine of a remote generator runs on one private loop, in one daemon thread started on first
use: synchronous callers on any number of threads block on a `concurrent.futures.Future`
(`asyncio.run_coroutine_threadsafe`), async callers await it (`asyncio.wrap_future`). State the
coroutines share (endpoint pools, the probe lock) is then touched by that one thread only. The
thread stops on `close()`, when the object is garbage collected, or at interpreter exit
(`weakref.finalize`).
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import Awaitable, Coroutine, Iterable
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")


def _serve(loop: asyncio.AbstractEventLoop) -> None:
    """The thread's body: run `loop` until stopped, then cancel what is left and close it."""
    asyncio.set_event_loop(loop)
    try:
        loop.run_forever()
    finally:
        pending = asyncio.all_tasks(loop)
        for task in pending:
            task.cancel()
        loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


def _stop(loop: asyncio.AbstractEventLoop, thread: threading.Thread) -> None:
    """Stop `loop` and wait for its thread (not when called on that thread: it ends on return)."""
    try:
        loop.call_soon_threadsafe(loop.stop)
    except RuntimeError:  # already closed
        return
    if threading.current_thread() is not thread:
        thread.join()


class BackgroundLoop:
    """An event loop running in its own daemon thread (named `name`), started on first use."""

    def __init__(self, name: str = "metagen-remote") -> None:
        self.name = name
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._finalizer: weakref.finalize | None = None
        self.closed = False

    def __repr__(self) -> str:
        state = "closed" if self.closed else "running" if self._thread is not None else "not started"
        return f"BackgroundLoop({self.name!r}, {state})"

    @property
    def started(self) -> bool:
        return self._thread is not None and not self.closed

    def in_loop(self) -> bool:
        """Whether the caller runs on this loop's thread."""
        return self._thread is not None and threading.current_thread() is self._thread

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self.closed:
                raise RuntimeError(f"{self.name}: the generator or transport was closed; create a new one")
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=_serve, args=(loop,), name=self.name, daemon=True)
                thread.start()
                self._loop, self._thread = loop, thread
                self._finalizer = weakref.finalize(self, _stop, loop, thread)
            return self._loop

    def submit(self, coroutine: Coroutine[Any, Any, T]) -> Future[T]:
        """Schedule `coroutine` on the loop; its future (thread-safe)."""
        try:
            loop = self._running_loop()
        except RuntimeError:
            coroutine.close()  # never started: no "was never awaited" warning
            raise
        return asyncio.run_coroutine_threadsafe(coroutine, loop)

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run `coroutine` on the loop and return its result (or raise its exception), blocking
        the calling thread; an interrupt while waiting (Ctrl-C) cancels it."""
        if self.in_loop():
            coroutine.close()
            raise RuntimeError(f"{self.name}: a synchronous call from inside its own event loop would wait "
                               "for itself; await the async method (agenerate, ...) instead")
        future = self.submit(coroutine)
        try:
            return future.result()
        except BaseException:
            future.cancel()
            raise

    async def call(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Await `coroutine` on this loop from async code on any loop (cancelling the await
        cancels it)."""
        if self.in_loop():
            return await coroutine
        return await asyncio.wrap_future(self.submit(coroutine))

    def close(self) -> None:
        """Cancel pending coroutines, stop the loop and join its thread (idempotent)."""
        with self._lock:
            self.closed = True
            finalizer = self._finalizer
        if finalizer is not None:
            finalizer()


async def gather_all(awaitables: Iterable[Awaitable[T]], limit: int | None = None) -> list[T]:
    """The results of `awaitables`, run concurrently, in order; when one fails, the others are
    cancelled (and awaited) and its exception is raised as it is. limit: at most this many run at
    once, the next taken from the iterable as one ends (a generator of coroutines is then
    consumed lazily: n = 100,000 makes `limit` tasks at a time, not n)."""
    if limit is None:
        tasks = [asyncio.ensure_future(awaitable) for awaitable in awaitables]
        try:
            return list(await asyncio.gather(*tasks))
        except BaseException:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
    if limit < 1:
        raise ValueError(f"limit={limit!r} is out of range: must be >= 1 or None")
    pending = iter(enumerate(awaitables))
    results: dict[int, T] = {}
    running: dict[asyncio.Future, int] = {}
    try:
        while True:
            while len(running) < limit and (item := next(pending, None)) is not None:
                running[asyncio.ensure_future(item[1])] = item[0]
            if not running:
                return [results[index] for index in range(len(results))]
            done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                results[running.pop(task)] = task.result()  # raises the first failure
    except BaseException:
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
        for _, awaitable in pending:  # never started: no "was never awaited" warning
            if asyncio.iscoroutine(awaitable):
                awaitable.close()
        raise
