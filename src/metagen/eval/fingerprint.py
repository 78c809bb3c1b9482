"""Fingerprints of stored evaluation results: what produced a record, so a resumed run reuses
only the same work.

A record of `results.jsonl` (a pool of samples, or one strategy × n result) depends on

    the problem:  its question and reference answer (with its grading, "qa", when it has one; a code
                  problem: its entry point and tests);
    the set-up:   model   — name, class, dtype, the identity of its weights file(s) and the
                            kernels' activation codes when not the default int16 (absent for
                            int16, as in set-ups stored before the option existed)
                  generator — its class, chat setting (the prompt template) and token-level
                            decoder: its kind, settings and companion models' identities
                            (`decoder_identity`; absent without one, as in set-ups stored
                            before decoders were evaluated)
                  params  — every SamplingParams field but n and seed, which the harness sets
                            per unit (n = the pool size or the strategy's n, seed = `seed` below)
                  seed, prompt_suffix, options (answer pattern, math, value, step delimiter,
                  aggregation), overrides of strategy config fields (the retriever; absent
                  without any), and the content of a value-head file given as the value;
                  code    — with code problems only: the prompt mode used (chat or completion,
                            its request text or stop strings) and the sandbox's limits
    the unit:     pool, or (strategy, n) — part of the record's key.

A unit that reads no value (a pool, a strategy that is not value-guided) is reused under a
set-up that differs only in the value fields (`results.VALUE_FIELDS`, `results.without_value`).
Each record carries `{"setup": digest(set-up), "question": digest(question), "answer":
digest(answer)}`; `results.jsonl` also holds every set-up in full (a "setup" line), so a
mismatch is reported by field name whether or not run.json is still there. `subsets` is not
part of the set-up: it changes how the summary averages the stored records, not the records.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path

from metagen.models.kernel_backend import DEFAULT_ACTIVATIONS

_CHUNK = 1 << 24


def digest(value) -> str:
    """First 16 hex digits of the SHA-256 of `value`'s canonical JSON (sorted keys)."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def file_digest(path: Path) -> str:
    """SHA-256 of a file's content (a copied or touched file keeps it, other weights do not).

    O(size) once per version of the file: the result is kept in the cache directory under
    (resolved path, size, mtime, inode) — as the loader's conversion cache keys on the first three."""
    from metagen.models.loading import cache_directory

    stat = path.stat()
    key = digest([str(path.resolve()), stat.st_size, stat.st_mtime_ns, stat.st_ino])
    memo = cache_directory() / "digests" / key
    try:
        remembered = memo.read_text().strip()
        if len(remembered) == 64 and all(c in "0123456789abcdef" for c in remembered):
            return remembered
    except OSError:
        pass
    hasher = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            hasher.update(chunk)
    value = hasher.hexdigest()
    try:
        memo.parent.mkdir(parents=True, exist_ok=True)
        partial = memo.with_name(f"{memo.name}.{os.getpid()}.tmp")
        partial.write_text(value)
        os.replace(partial, memo)  # a concurrent reader sees the whole digest or none
    except OSError:
        pass  # an unwritable cache only costs the next run the hashing
    return value


def weights_digest(source: str | Path) -> str | None:
    """Identity of a checkpoint: a .gguf file's content, or an HF directory's *.safetensors and
    *.json files (names and contents). None when `source` is not a local path."""
    path = Path(source) if source else None
    if path is None or not path.exists():
        return None
    if path.is_file():
        return file_digest(path)[:16]
    files = sorted(p for p in path.iterdir() if p.is_file() and p.suffix in (".safetensors", ".json"))
    return digest({item.name: file_digest(item) for item in files})


# Classes recorded under an earlier name, so results files written before a rename still resume:
# the native backend's class was LlamaModel until it became the family-generic DecoderModel (the
# weights digest, not the class, tells checkpoints and families apart).
_RECORDED_CLASS_NAMES = {"DecoderModel": "LlamaModel"}


def model_identity(model) -> dict:
    """What of a loaded model its outputs depend on: name, class, dtype, weights identity (the
    content, where value heads' `model_identity` ties a head to an architecture) and
    "activations" when it is not the default "int16" (so int16 set-ups keep their digests).

    A model without a local weights file (an in-memory model) is identified by its source text
    when it has one, else by name and class only."""
    config = getattr(model, "config", None)
    name = getattr(config, "name", None) or getattr(model, "name", None) or type(model).__name__
    source = model.source
    weights = weights_digest(source)
    recorded_class = _RECORDED_CLASS_NAMES.get(type(model).__name__, type(model).__name__)
    identity = {"name": str(name), "class": recorded_class, "dtype": str(getattr(model, "dtype", None)),
                "weights": weights if weights is not None or not source else f"source:{source}"}
    activations = getattr(model, "activations", None)
    if activations not in (None, DEFAULT_ACTIVATIONS):
        identity["activations"] = activations
    return identity


def generator_identity(generator) -> dict:
    """The generator's class and chat setting (None: the model's template when it has one), and
    its token-level decoder when it has one (`Generator.decoder`, `decoder_identity`)."""
    identity = {"class": type(generator).__name__, "chat": generator.chat}
    if generator.decoder is not None:
        identity["decoder"] = decoder_identity(generator.decoder)
    return identity


def decoder_identity(decoder) -> dict:
    """A decoder config (a frozen dataclass: `ContrastiveConfig`, `DExpertsConfig`,
    `EntropyAdaptiveConfig`, `AdaDecConfig`) as JSON: {"kind": its class, each field: its value},
    a companion model's field as its `model_identity` (an early-exit companion's name says its
    layers), a non-finite number as its text ("inf": JSON has none)."""
    companions = getattr(decoder, "companions", ())  # AdaDec runs none
    identity = {"kind": type(decoder).__name__}
    for field in fields(decoder):
        value = getattr(decoder, field.name)
        if any(value is companion for companion in companions):
            value = model_identity(value)
        elif isinstance(value, float) and not math.isfinite(value):
            value = str(value)
        identity[field.name] = value
    return identity


def problem_fingerprint(setup_digest: str, question: str, answer: str) -> dict:
    return {"setup": setup_digest, "question": digest(question), "answer": digest(answer)}


def flatten(tree: Mapping, prefix: str = "") -> dict:
    """{"a": {"b": 1}} -> {"a.b": 1}: field names for messages."""
    flat = {}
    for key, value in tree.items():
        if isinstance(value, Mapping):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[prefix + key] = value
    return flat


def differences(stored: Mapping, current: Mapping) -> tuple[str, str]:
    """('a=1, b=2', 'a=3, b=4'): the fields whose values differ, stored side and current side."""
    old, new = flatten(stored), flatten(current)
    absent = object()
    names = [name for name in dict.fromkeys([*new, *old]) if old.get(name, absent) != new.get(name, absent)]

    def shown(values: dict) -> str:
        return ", ".join(f"{name}={values[name]!r}" if name in values else f"no {name}" for name in names)

    return shown(old), shown(new)
