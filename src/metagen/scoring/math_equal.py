"""Equality of two answers as math (math-verify), bounded in time, in a separate process.

math-verify bounds its own parse and verify with signal.alarm, which only the main thread may
set, and no signal can interrupt a C-level big-integer power in any case: comparing
"9^{9^{8}}" with "3" holds the interpreter for a minute ("9^{9^{9}}": many more), and in
`metagen serve` that is every stream and /health. So each comparison runs in a worker process:

    parent (any thread)  --"[a, b]\\n"-->  worker: parse both, verify   (stdin / stdout, one JSON line each)
                         <--"true\\n"---

One persistent worker, started on first use (its imports, sympy and math-verify, take about a
second) and shared by all threads under a lock. A comparison that has not answered within
`timeout` seconds (`MATH_TIMEOUT_SECONDS` by default) is a non-match: the worker is killed
(SIGKILL) and the next comparison starts a new one. The worker never outlives the parent: it
dies with the thread that started it (PR_SET_PDEATHSIG; that thread waits for it, so it lives as
long as the worker), it is killed at exit (atexit), it shares the parent's process group, and it
exits when its stdin closes. Parses are cached in the worker; the parent caches comparisons
(`answers._math_equal`).

Cost: one pipe round trip (~0.1 ms) per comparison on top of math-verify's own work.

Run as a script (`python math_equal.py`) this file is the worker: it imports only the standard
library and math-verify, not metagen (whose package imports torch).
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time

MATH_TIMEOUT_SECONDS = 5.0  # one comparison (both parses and the verify); past it: a non-match
START_TIMEOUT_SECONDS = 120.0  # the worker's imports, on a loaded machine
_PR_SET_PDEATHSIG = 1


class MathWorker:
    """The worker process and the lock its callers share. `equal(a, b)` -> bool."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._process: subprocess.Popen | None = None
        self._buffer = b""

    def equal(self, a: str, b: str, timeout: float = MATH_TIMEOUT_SECONDS) -> bool:
        """Whether math-verify finds `a` and `b` equal; False when either does not parse, when
        math-verify fails, when no answer came within `timeout` seconds (the worker is then
        killed), or when the worker died comparing them twice (a worker that died of something
        else, e.g. the OOM killer, is restarted once)."""
        with self._lock:
            for _ in range(2):
                process = self._started()
                try:
                    process.stdin.write(json.dumps([a, b]).encode() + b"\n")
                    process.stdin.flush()
                    line = self._read_line(process, timeout)
                except (BrokenPipeError, EOFError):  # died meanwhile
                    self._kill()
                    continue
                if line is None:  # past the deadline
                    self._kill()
                    return False
                return json.loads(line) is True
            return False

    def stop(self) -> None:
        """Kill the worker if it runs (the next comparison starts a new one)."""
        with self._lock:
            self._kill()

    @property
    def pid(self) -> int | None:
        """The worker's process id while it runs (for tests)."""
        return None if self._process is None else self._process.pid

    def _started(self) -> subprocess.Popen:
        if self._process is not None and self._process.poll() is None:
            return self._process
        self._kill()
        spawned: list = []
        ready = threading.Event()

        def own() -> None:  # starts the worker and waits for it: PDEATHSIG is tied to this thread
            try:
                spawned.append(subprocess.Popen([sys.executable, "-B", os.path.abspath(__file__), str(os.getpid())],
                                                stdin=subprocess.PIPE, stdout=subprocess.PIPE))
            except BaseException as error:  # noqa: BLE001 - handed to the caller
                spawned.append(error)
                return
            finally:
                ready.set()
            spawned[0].wait()

        threading.Thread(target=own, name="metagen-math-worker", daemon=True).start()
        ready.wait()
        if isinstance(spawned[0], BaseException):
            raise spawned[0]
        self._process, self._buffer = spawned[0], b""
        try:
            line = self._read_line(self._process, START_TIMEOUT_SECONDS)
        except EOFError:
            line = None
        if line != b"ready":
            self._kill()
            from metagen.extras import core_requirement

            raise RuntimeError("the math comparison worker did not start (see its error output): "
                               "math answers need math-verify, a dependency of metagen: "
                               f"{core_requirement('math-verify')}")
        return self._process

    def _read_line(self, process: subprocess.Popen, timeout: float) -> bytes | None:
        """The next line from the worker, None when none came within `timeout` seconds;
        EOFError when the worker closed its output."""
        fd = process.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                raise EOFError
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line

    def _kill(self) -> None:
        process, self._process, self._buffer = self._process, None, b""
        if process is None:
            return
        if process.poll() is None:
            process.kill()
        process.wait()  # (also reaped by its owner thread; wait is safe from both)
        for pipe in (process.stdin, process.stdout):
            try:
                pipe.close()
            except OSError:
                pass


WORKER = MathWorker()
atexit.register(WORKER.stop)
os.register_at_fork(after_in_child=WORKER.__init__)  # a forked child starts its own worker, leaves the parent's


def math_equal(a: str, b: str, timeout: float = MATH_TIMEOUT_SECONDS) -> bool:
    """`a` = `b` as math (math-verify), in the shared worker process, within `timeout` seconds
    (else False). See `MathWorker.equal`."""
    return WORKER.equal(a, b, timeout)


def _serve(parent: int) -> None:
    """The worker: dies with its parent (process id `parent`), imports math-verify, says
    "ready", then answers each line [a, b] of stdin with true / false until stdin closes. Time
    is bounded by the parent, so math-verify's own alarm-based timeouts are off; Ctrl-C is the
    parent's to handle."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: stdin closing and atexit remain
        pass
    if os.getppid() != parent:  # the parent died before prctl
        return
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [path for path in sys.path if os.path.abspath(path or ".") != here]  # no sibling shadows a module
    import logging
    from functools import lru_cache

    from math_verify import parse, verify

    for name in ("math_verify.parser", "math_verify.grader"):  # "Timeout is disabled": the parent's deadline is it
        logging.getLogger(name).addFilter(lambda record: not record.getMessage().startswith("Timeout is disabled"))

    @lru_cache(maxsize=4096)
    def parsed(answer: str):
        # math-verify reads LaTeX between delimiters only: a bare "\\left( 3, \\frac{\\pi}{2} \\right)"
        # parses as its first number, 3, so every answer without a "$" is given them
        return parse(answer if "$" in answer else f"${answer}$", parsing_timeout=None)

    def equal(a: str, b: str) -> bool:
        parsed_a, parsed_b = parsed(a), parsed(b)
        return bool(parsed_a) and bool(parsed_b) and bool(verify(parsed_a, parsed_b, timeout_seconds=None))

    out = sys.stdout.buffer
    out.write(b"ready\n")
    out.flush()
    for line in sys.stdin.buffer:
        try:
            a, b = json.loads(line)
            result = equal(a, b)
        except Exception:  # noqa: BLE001 - an answer math-verify cannot handle is no match
            result = False
        out.write(b"true\n" if result else b"false\n")
        out.flush()


if __name__ == "__main__":
    _serve(int(sys.argv[1]))
