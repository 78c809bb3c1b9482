"""Sandbox runs of a program on a problem's example tests, cached: scoring the same program again
(the evaluation harness scores many subsets of one sample pool, and a rerun of `metagen eval`
summarizes every stored pool again) reuses its run instead of starting the sandbox again.

    report, run = cached_run(verifier, program)     # `CodeExecutionVerifier.execute`, or the cache
    with stored_runs(out / "sandbox_runs.jsonl"):   # runs also kept in (and read from) a file
        ...

Two layers, both keyed by a digest of everything the run depends on — the harness's source, the
tests and their setup, the time and memory limits, the isolation asked for, and the program:
  - in memory, per process, the last RUN_CACHE runs;
  - inside `stored_runs(path)`, a JSONL file: one {"key", "run"} line per run (`SandboxResult`'s
    fields), appended as runs finish. A torn last line (a killed write) is dropped; any other
    malformed line is an error naming the file and line (the file is a cache: deleting it loses
    nothing but time).
A reused run counts its measured seconds again (`Cost.sandbox_seconds`), as an independent run
would spend them. This assumes a program's outcome on its examples does not change from run to
run — true of the deterministic functions code benchmarks ask for; a program that reads the
clock or a random source is judged on its first run.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, fields
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

from metagen.jsonl import appended_lines
from metagen.tools.sandbox import SandboxResult

if TYPE_CHECKING:
    from metagen.scoring.code_execution import CodeExecutionVerifier
    from metagen.scoring.code_report import Report

RUN_CACHE = 4096
_FIELDS = tuple(field.name for field in fields(SandboxResult))
_runs: OrderedDict = OrderedDict()
_lock = threading.Lock()
_store: RunStore | None = None


@lru_cache(maxsize=1)
def _harness_digest() -> str:
    from metagen.scoring.code_execution import HARNESS

    return hashlib.sha256(HARNESS.encode()).hexdigest()


def run_key(verifier: CodeExecutionVerifier, program: str) -> str:
    """The hex SHA-256 of what a run of `program` under `verifier` depends on."""
    parts = [_harness_digest(), verifier.tests, verifier.setup, verifier.timeout, verifier.memory_mb,
             verifier.isolation, program]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()


def cached_run(verifier: CodeExecutionVerifier, program: str) -> tuple[Report, SandboxResult]:
    """(report, run) of `program` on the verifier's tests: from memory, from the file of
    `stored_runs` when one is open, or one sandbox run (then kept in both)."""
    key = run_key(verifier, program)
    with _lock:
        if key in _runs:
            _runs.move_to_end(key)
            return _runs[key]
        store = _store
    run = store.get(key) if store is not None else None
    done = (verifier.report_of(run), run) if run is not None else verifier.execute(program)
    with _lock:
        _runs[key] = done
        while len(_runs) > RUN_CACHE:
            _runs.popitem(last=False)
    if run is None and store is not None:
        store.put(key, done[1])
    return done


class RunStore:
    """The file of `stored_runs`: its runs by key, read when opened, appended by `put`."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.runs: dict[str, SandboxResult] = {}
        self._lock = threading.Lock()
        if self.path.exists():
            for number, line in appended_lines(self.path):
                key, run = self._parse(line, number)
                self.runs[key] = run
        self._handle = None  # opened by the first `put`: a run without programs writes no file

    def _parse(self, line: str, number: int) -> tuple[str, SandboxResult]:
        where = f"{self.path}:{number}"
        try:
            record = json.loads(line)
            key, run = record["key"], record["run"]
            missing = [name for name in ("status", "returncode", "stdout", "stderr", "wall_seconds", "isolation")
                       if name not in run]
        except (json.JSONDecodeError, KeyError, TypeError) as error:
            raise ValueError(f"{where}: not a stored sandbox run ({type(error).__name__}: {error}); the file is "
                             "a cache of sandbox runs: delete it to start over (nothing else is lost)") from None
        if missing or not isinstance(key, str):
            raise ValueError(f"{where}: stored sandbox run lacks {', '.join(missing) or 'a string key'}; the file "
                             "is a cache of sandbox runs: delete it to start over (nothing else is lost)")
        run = {name: value for name, value in run.items() if name in _FIELDS}
        run["isolation"] = tuple(run["isolation"])
        return key, SandboxResult(**run)

    def get(self, key: str) -> SandboxResult | None:
        with self._lock:
            return self.runs.get(key)

    def put(self, key: str, run: SandboxResult) -> None:
        line = json.dumps({"key": key, "run": asdict(run)}, ensure_ascii=False) + "\n"
        with self._lock:
            if key in self.runs:
                return
            self.runs[key] = run
            if self._handle is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._handle = open(self.path, "a", encoding="utf-8")
            self._handle.write(line)
            self._handle.flush()

    def close(self) -> None:
        with self._lock:
            if self._handle is not None:
                self._handle.close()


@contextmanager
def stored_runs(path: str | Path | None) -> Iterator[RunStore | None]:
    """Keep the runs of the block in `path` (JSONL) and reuse those already there; None: memory
    only. The file is the process's store until the block ends (the previous one is restored:
    blocks nest, and a thread outside the block that scores code meanwhile uses it too)."""
    global _store
    if path is None:
        yield None
        return
    store = RunStore(path)
    with _lock:
        previous, _store = _store, store
    try:
        yield store
    finally:
        with _lock:
            _store = previous
        store.close()
