"""`results.jsonl`: the append-only store of finished evaluation units, each stamped with the
fingerprint of what produced it (see `fingerprint.py`).

Lines, in the order they were written (each whole line written under a lock, then fsynced; with
problems run concurrently the units of several problems interleave, and nothing reads the order):
    {"kind": "setup", "fingerprint": S, "setup": {...}}            before the first unit of a set-up
    {"kind": "pool", "id": ..., "fingerprint": F, "pool": {...}}     max(n) samples of one problem
    {"kind": "live", "id": ..., "strategy": ..., "n": ..., "fingerprint": F, "correct": ..., "cost": {...}, ...}
with F = {"setup": S, "question": digest, "answer": digest} (a code problem's "answer": its entry
point and tests, `Problem.reference`). A code problem's live record also carries "program",
"reason" and "sandbox_seconds" (see `harness.py`).

A run reuses a stored unit only when it is provably the same work: `check` refuses, before
anything is generated, a file holding units of another set-up or of another problem under the
same id, naming the file, the line and the differing field. Refusing (not recomputing) keeps
one directory = one set-up, and never throws away finished work silently. A torn last line
(a killed write) is dropped and redone; any other malformed line is reported with its number.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Sequence
from pathlib import Path

from metagen.decoding.cost import Cost
from metagen.eval.fingerprint import differences, digest, problem_fingerprint
from metagen.eval.pool import Pool

_COST_FIELDS = frozenset(Cost().to_dict())
_UNKNOWABLE = frozenset({"flops", "scorer_flops"})  # None: the generator could not know them


def _is_count(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
_FINGERPRINT_FIELDS = ("setup", "question", "answer")


class ResultsFile:
    """Finished units keyed by (kind, problem id, strategy, n); `path` None keeps them in memory."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.records: dict[tuple, dict] = {}
        self.lines: dict[tuple, int] = {}
        self.setups: dict[str, tuple[int, dict]] = {}  # fingerprint -> (line, set-up)
        self.setup: dict = {}
        self.setup_digest: str | None = None  # set by `check`
        self._lock = threading.Lock()  # one unit (and its set-up line) appended at a time
        if path is not None and path.exists():
            for number, line in self._read_lines(path):
                self._load(line, number)

    # ------------------------------------------------------------------------- reading

    @staticmethod
    def _read_lines(path: Path):
        try:
            raw = path.read_bytes()
        except OSError as error:
            raise ValueError(f"{path}: cannot be read ({error.strerror})") from None
        keep = raw[: raw.rfind(b"\n") + 1]  # a torn last line (killed mid-write) is redone
        if len(keep) != len(raw):
            with open(path, "r+b") as handle:
                handle.truncate(len(keep))
        for number, line in enumerate(keep.splitlines(), start=1):
            try:
                text = line.decode("utf-8")
            except UnicodeDecodeError as error:
                raise ValueError(f"{path}:{number}: not UTF-8 text (byte {line[error.start]:#04x} "
                                 f"at column {error.start + 1})") from None
            if text.strip():
                yield number, text

    def _load(self, line: str, number: int) -> None:
        where = f"{self.path}:{number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{where}: not valid JSON ({error.msg}); move the file away to start over") from None
        try:
            self._check_shape(record)
            if record["kind"] == "pool":
                record["pool"] = Pool.from_dict(record["pool"])
        except ValueError as error:
            raise ValueError(f"{where}: {error}; move the file away to start over") from None
        if record["kind"] == "setup":
            self.setups[record["fingerprint"]] = (number, record["setup"])
            return
        if record["fingerprint"]["setup"] not in self.setups:
            raise ValueError(f"{where}: its set-up {record['fingerprint']['setup']!r} is described by no earlier "
                             "setup line; move the file away to start over")
        key = self.key(record)
        self.records[key] = record
        self.lines[key] = number

    @staticmethod
    def _check_shape(record) -> None:
        """ValueError naming the first missing or malformed field of a record."""
        if not isinstance(record, dict):
            raise ValueError(f"expected a JSON object, got {type(record).__name__}")
        kind = record.get("kind")
        if kind not in ("setup", "pool", "live"):
            raise ValueError("field 'kind' is missing" if kind is None else
                             f"field 'kind' is {kind!r}, expected 'setup', 'pool' or 'live'")
        if kind == "setup":
            if not isinstance(record.get("setup"), dict) or not isinstance(record.get("fingerprint"), str):
                raise ValueError("a setup line needs an object 'setup' and a string 'fingerprint'")
            if digest(record["setup"]) != record["fingerprint"]:
                raise ValueError("field 'fingerprint' does not match its 'setup' (edited by hand?)")
            return
        if not isinstance(record.get("id"), str):
            raise ValueError("field 'id' is missing or not a string")
        fingerprint = record.get("fingerprint")
        if not isinstance(fingerprint, dict) or not all(isinstance(fingerprint.get(name), str)
                                                        for name in _FINGERPRINT_FIELDS):
            raise ValueError("field 'fingerprint' is missing or incomplete (a file of an older metagen?): "
                             "what produced this record cannot be checked")
        if kind == "pool":
            if "pool" not in record:
                raise ValueError("field 'pool' is missing")
            return  # its fields: Pool.from_dict
        if not isinstance(record.get("strategy"), str):
            raise ValueError("field 'strategy' is missing or not a string")
        if not isinstance(record.get("n"), int) or isinstance(record["n"], bool):
            raise ValueError("field 'n' is missing or not an integer")
        if not isinstance(record.get("correct"), bool):
            raise ValueError("field 'correct' is missing or not true/false")
        cost = record.get("cost")
        if not isinstance(cost, dict) or set(cost) - _COST_FIELDS or not all(
                _is_count(v) or (v is None and k in _UNKNOWABLE) for k, v in cost.items()):
            raise ValueError(f"field 'cost' must be an object of numbers with fields among {sorted(_COST_FIELDS)} "
                             f"(null allowed for {', '.join(sorted(_UNKNOWABLE))}: unknown)")

    @staticmethod
    def key(record: dict) -> tuple:
        return record["kind"], record["id"], record.get("strategy"), record.get("n")

    # ------------------------------------------------------------------------- checking

    def check(self, setup: dict, problems: Sequence, pool_size: int = 0) -> None:
        """Bind the file to this run's set-up; ValueError (file, line, field) when a stored unit
        was produced by another set-up, or for another problem under one of `problems`' ids, or
        when a stored pool is smaller than `pool_size`. Units of other ids are kept, unused."""
        setup = json.loads(json.dumps(setup))  # as stored: tuples as lists, keys as strings
        self.setup_digest = digest(setup)
        self.setup = setup
        for key, record in self.records.items():
            stored = record["fingerprint"]["setup"]
            if stored != self.setup_digest:
                old, new = differences(self.setups[stored][1], setup)
                raise ValueError(f"{self._where(key)} was produced with {old}, this run has {new}; "
                                 f"use another output directory (--out) or delete {self.path}")
        by_id = {problem.id: problem for problem in problems}
        for key, record in self.records.items():
            problem = by_id.get(record["id"])
            if problem is not None:
                self._check_problem(key, record, problem)
                if record["kind"] == "pool" and len(record["pool"].samples) < pool_size:
                    raise ValueError(f"{self._where(key)} holds a pool of {len(record['pool'].samples)} samples, "
                                     f"this run needs {pool_size} (the largest n); use another output directory "
                                     f"(--out) or delete {self.path}")

    def _check_problem(self, key: tuple, record: dict, problem) -> None:
        expected = problem_fingerprint(self.setup_digest, problem.question, problem.reference)
        for name, value in (("question", problem.question), ("answer", problem.reference)):
            if record["fingerprint"][name] != expected[name]:
                what = "test or entry point" if name == "answer" and problem.is_code else name
                raise ValueError(f"{self._where(key)} holds problem {problem.id!r} with another {what} than this "
                                 f"run's problem {problem.id!r} ({value[:60]!r}); use another "
                                 f"output directory (--out) or delete {self.path}")

    def _where(self, key: tuple) -> str:
        return f"{self.path}:{self.lines[key]}" if key in self.lines else "a stored result"

    # ------------------------------------------------------------------------- units

    def pool(self, problem) -> Pool | None:
        record = self._get(("pool", problem.id, None, None), problem)
        return None if record is None else record["pool"]

    def live(self, problem, strategy: str, n: int) -> dict | None:
        return self._get(("live", problem.id, strategy, n), problem)

    def _get(self, key: tuple, problem) -> dict | None:
        if self.setup_digest is None:
            raise RuntimeError("call check(setup, problems) before reading units")
        record = self.records.get(key)
        if record is not None:
            self._check_problem(key, record, problem)
        return record

    def add_pool(self, problem, pool: Pool) -> None:
        self._add({"kind": "pool", "id": problem.id}, {"pool": pool}, problem)

    def add_live(self, problem, strategy: str, n: int, fields: dict) -> None:
        self._add({"kind": "live", "id": problem.id, "strategy": strategy, "n": n}, fields, problem)

    def _add(self, head: dict, fields: dict, problem) -> None:
        """Append one unit as one whole line (thread-safe: several problems may finish at once)."""
        if self.setup_digest is None:
            raise RuntimeError("call check(setup, problems) before adding units")
        with self._lock:
            self._add_locked(head, fields, problem)

    def _add_locked(self, head: dict, fields: dict, problem) -> None:
        if self.setup_digest not in self.setups:
            self.setups[self.setup_digest] = (0, self.setup)
            self._append({"kind": "setup", "fingerprint": self.setup_digest, "setup": self.setup})
        record = {**head, "fingerprint": problem_fingerprint(self.setup_digest, problem.question, problem.reference),
                  **fields}
        self._append({**record, **({"pool": record["pool"].to_dict()} if "pool" in record else {})})
        self.records[self.key(record)] = record

    def _append(self, record: dict) -> None:
        if self.path is None:
            return
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record, separators=(",", ":")) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
