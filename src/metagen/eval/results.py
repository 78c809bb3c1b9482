"""`results.jsonl`: the append-only store of finished evaluation units, each stamped with the
fingerprint of what produced it (see `fingerprint.py`).

Lines, in the order they were written (each whole line written under a lock, then fsynced; with
problems run concurrently the units of several problems interleave, and nothing reads the order):
    {"kind": "setup", "fingerprint": S, "setup": {...}}            before the first unit of a set-up
    {"kind": "pool", "id": ..., "fingerprint": F, "pool": {...}}     max(n) samples of one problem
    {"kind": "live", "id": ..., "strategy": ..., "n": ..., "fingerprint": F, "correct": ..., "cost": {...}, ...}
with F = {"setup": S, "question": digest, "answer": digest} (a code problem's "answer": its entry
point and tests, `Problem.reference`). A code problem's live record also carries "program",
"reason" and "sandbox_seconds" (see `running.py`).

The units of several models coexist in one file (a sweep, `running.evaluate_models`): each
unit is keyed by its set-up's fingerprint S, which holds the model's identity, and each setup
line also names its model's display name ("model": label; optional: without it the model identity's name stands in).
A run reuses a stored unit only when it is provably the same work, and refuses, before
anything is generated, naming the file, the line and the differing field:
  - `check_shared`: a unit of another shared set-up (sampling, seed, prompt suffix, options:
    every field but "model" and "generator") or of another problem under the same id — one
    directory holds one experiment, over any number of models;
  - `bind(label, setup)`: a unit whose model has this model's label (or, for a setup line without a
    label, its identity's name) but another fingerprint (another dtype, weights file,
    ...), checked when that model is loaded.
Units of models not in the run are kept, unused. Refusing (not recomputing) never throws away
finished work silently. A torn last line (a killed write) is dropped and redone; any other
malformed line is reported with its number.

The value a value-guided strategy reads (`VALUE_FIELDS`: options value, step_delimiter,
aggregation, value_parameters, and a value file's content) is set-up too, but only such a
strategy's live units depend on it: a run given another value reuses the stored pools and the
live units of every strategy that reads no value (`ModelUnits.live(..., reads_value=False)`),
whichever value they were stored under, and runs again only the value-guided live units. So a
verifier or a PRM can be added to a stored sweep without generating its pools again.
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
from metagen.jsonl import appended_lines

_COST_FIELDS = frozenset(Cost().to_dict())
_UNKNOWABLE = frozenset({"flops", "scorer_flops"})  # None: the generator could not know them


def _is_count(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
_FINGERPRINT_FIELDS = ("setup", "question", "answer")
VALUE_FIELDS = ("value", "step_delimiter", "aggregation", "value_parameters")  # options only value-guided strategies read
MODEL_FIELDS = ("model", "generator", "code")  # the set-up fields of one model (code: its prompting mode follows its chat template); the others are the sweep's


def without_value(setup: dict) -> dict:
    """`setup` without what only value-guided strategies read (`VALUE_FIELDS` of its options and
    a value file's digest, "value_weights"): what pools and the other strategies' units depend on."""
    kept = {name: value for name, value in setup.items() if name != "value_weights"}
    if isinstance(kept.get("options"), dict):
        kept["options"] = {name: value for name, value in kept["options"].items() if name not in VALUE_FIELDS}
    return kept


class ResultsFile:
    """Finished units keyed by (set-up fingerprint, kind, problem id, strategy, n); `path` None
    keeps them in memory. Read a model's units through the view `bind` returns."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.records: dict[tuple, dict] = {}
        self.lines: dict[tuple, int] = {}
        self.setups: dict[str, tuple[int, dict, str | None]] = {}  # fingerprint -> (line, set-up, label)
        self.shared: dict | None = None  # set by `check_shared`
        self._lock = threading.Lock()  # one unit (and its set-up line) appended at a time
        if path is not None and path.exists():
            for number, line in appended_lines(path):
                self._load(line, number)

    # ------------------------------------------------------------------------- reading

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
            self.setups[record["fingerprint"]] = (number, record["setup"], record.get("model"))
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
            if not isinstance(record.get("model", ""), str) or record.get("model") == "":
                raise ValueError(f"field 'model' is {record['model']!r}: expected the model's name (a non-empty "
                                 "string) or no field")
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
        return record["fingerprint"]["setup"], record["kind"], record["id"], record.get("strategy"), record.get("n")

    # ------------------------------------------------------------------------- checking

    def check_shared(self, shared: dict, problems: Sequence) -> None:
        """Bind the file to this run's shared set-up (every set-up field but `MODEL_FIELDS`);
        ValueError (file, line, field) when a stored set-up has other shared fields, or a stored
        unit holds another problem under one of `problems`' ids. Needs no model: checked before
        any is loaded. Units of other ids are kept, unused."""
        shared = json.loads(json.dumps(shared))  # as stored: tuples as lists, keys as strings
        self.shared = shared
        for fingerprint, (line, setup, _) in self.setups.items():
            stored = {name: value for name, value in setup.items() if name not in MODEL_FIELDS}
            if without_value(stored) != without_value(shared):
                old, new = differences(without_value(stored), without_value(shared))
                raise ValueError(f"{self._first_line(fingerprint, line)} was produced with {old}, this run has {new}; "
                                 f"use another output directory (--out) or delete {self.path}")
        by_id = {problem.id: problem for problem in problems}
        for key, record in self.records.items():
            problem = by_id.get(record["id"])
            if problem is not None:
                self._check_problem(key, record, problem)

    def bind(self, label: str, setup: dict, pool_size: int = 0) -> "ModelUnits":
        """The units of one model, named `label` in the report, with the whole `setup` (shared
        fields and its model's). ValueError (file, line, field) when a stored set-up of the same
        label — or, without a label, of the same model name — has another fingerprint, or
        when one of this set-up's pools is smaller than `pool_size` (the largest n)."""
        if self.shared is None:
            raise RuntimeError("call check_shared(shared, problems) before binding a model")
        setup = json.loads(json.dumps(setup))
        fingerprint = digest(setup)
        name = setup.get("model", {}).get("name")
        siblings = [fingerprint]  # this set-up, then the stored ones differing from it only in the value
        for stored, (line, stored_setup, stored_label) in self.setups.items():
            same_model = stored_label == label if stored_label is not None else \
                stored_setup.get("model", {}).get("name") == name
            if not same_model or stored == fingerprint:
                continue
            if without_value(stored_setup) != without_value(setup):
                old, new = differences(without_value(stored_setup), without_value(setup))
                raise ValueError(f"{self._first_line(stored, line)} was produced with {old}, this run has {new}; "
                                 f"use another output directory (--out) or delete {self.path} (model {label!r})")
            siblings.append(stored)
        for key, record in self.records.items():
            if key[0] in siblings and key[1] == "pool" and len(record["pool"].samples) < pool_size:
                raise ValueError(f"{self._where(key)} holds a pool of {len(record['pool'].samples)} samples, "
                                 f"this run needs {pool_size} (the largest n); use another output directory "
                                 f"(--out) or delete {self.path}")
        return ModelUnits(self, label, setup, fingerprint, tuple(siblings[1:]))

    def _first_line(self, fingerprint: str, setup_line: int) -> str:
        """Where a set-up's first unit is (its setup line when it has none)."""
        lines = [number for key, number in self.lines.items() if key[0] == fingerprint]
        return f"{self.path}:{min(lines) if lines else setup_line}"

    def _check_problem(self, key: tuple, record: dict, problem) -> None:
        expected = problem_fingerprint(key[0], problem.question, problem.reference)
        for name, value in (("question", problem.question), ("answer", problem.reference)):
            if record["fingerprint"][name] != expected[name]:
                what = "test or entry point" if name == "answer" and problem.is_code else name
                raise ValueError(f"{self._where(key)} holds problem {problem.id!r} with another {what} than this "
                                 f"run's problem {problem.id!r} ({value[:60]!r}); use another "
                                 f"output directory (--out) or delete {self.path}")

    def _where(self, key: tuple) -> str:
        return f"{self.path}:{self.lines[key]}" if key in self.lines else "a stored result"

    # ------------------------------------------------------------------------- appending

    def add(self, units: "ModelUnits", head: dict, fields: dict, problem) -> None:
        """Append one unit as one whole line, after its set-up's line when it is the first
        (thread-safe: several problems may finish at once)."""
        with self._lock:
            if units.fingerprint not in self.setups:
                self.setups[units.fingerprint] = (0, units.setup, units.label)
                self._append({"kind": "setup", "fingerprint": units.fingerprint, "setup": units.setup,
                              "model": units.label})
            record = {**head, "fingerprint": problem_fingerprint(units.fingerprint, problem.question,
                                                                 problem.reference), **fields}
            self._append({**record, **({"pool": record["pool"].to_dict()} if "pool" in record else {})})
            self.records[self.key(record)] = record

    def _append(self, record: dict) -> None:
        if self.path is None:
            return
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record, separators=(",", ":")) + "\n")
            handle.flush()
            os.fsync(handle.fileno())


class ModelUnits:
    """The units of one model in a `ResultsFile` (`ResultsFile.bind`): label, whole set-up and
    its fingerprint; siblings: the fingerprints of its stored set-ups that differ from it only in
    `VALUE_FIELDS` (their pools, and their live units of strategies reading no value, are this
    set-up's too); reads and appends go to the shared file, appends under `fingerprint`."""

    def __init__(self, results: ResultsFile, label: str, setup: dict, fingerprint: str,
                 siblings: tuple[str, ...] = ()) -> None:
        self.results, self.label, self.setup, self.fingerprint = results, label, setup, fingerprint
        self.siblings = siblings

    @property
    def path(self) -> Path | None:
        return self.results.path

    def pool(self, problem) -> Pool | None:
        record = self._get(("pool", problem.id, None, None), problem, shared=True)
        return None if record is None else record["pool"]

    def live(self, problem, strategy: str, n: int, reads_value: bool = True) -> dict | None:
        """The stored unit of (strategy, n) on `problem`; reads_value False (a strategy that
        reads no value, `StrategySpec.uses_value`): one stored under a sibling set-up too."""
        return self._get(("live", problem.id, strategy, n), problem, shared=not reads_value)

    def _get(self, key: tuple, problem, shared: bool = False) -> dict | None:
        for fingerprint in (self.fingerprint, *(self.siblings if shared else ())):
            found = (fingerprint, *key)
            record = self.results.records.get(found)
            if record is not None:
                self.results._check_problem(found, record, problem)
                return record
        return None

    def add_pool(self, problem, pool: Pool) -> None:
        self.results.add(self, {"kind": "pool", "id": problem.id}, {"pool": pool}, problem)

    def add_live(self, problem, strategy: str, n: int, fields: dict) -> None:
        self.results.add(self, {"kind": "live", "id": problem.id, "strategy": strategy, "n": n}, fields, problem)
