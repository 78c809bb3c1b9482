"""The conversion cache: a converted model stored once per (checkpoint, dtype), then memory-mapped.

An entry `$METAGEN_CACHE/<key>/` holds `weights.safetensors` (packed linears, norms, embedding),
`config.json`, `linears.json` (each linear's kind) and `tokenizer/`, plus the `manifest.json` of
`disk_cache` (size + CRC-32 per file). The key hashes the format version, the checkpoint's path,
size and mtime, the dtype and the torch version. Nothing stored depends on the KV format or the
kernels' activation codes (run-time choices of `DecoderModel`): one entry serves every setting.
Entries are written in a staging directory and renamed into place under the entry's lock; an
entry that fails its manifest is converted again with a warning (see `disk_cache` for the rules).
"""

from __future__ import annotations

import hashlib
import json
import warnings
from collections.abc import Callable
from pathlib import Path

import torch

from metagen.models.cache import DEFAULT_KV_DTYPE
from metagen.models.config import ModelConfig
from metagen.models.kernel_backend import DEFAULT_ACTIVATIONS
from metagen.models.disk_cache import (EntryLock, cache_directory, cache_hit, manifest_problem, publish, publish_entry,
                                       staging_directory)
from metagen.models.linear import restore_linear
from metagen.models.decoder import DecoderModel
from metagen.models.layer import EXPERT_FIELDS, LINEAR_FIELDS, NORM_FIELDS, LayerWeights

# 3: manifest.json replaces the `done` marker; 4: linears record their stored format;
# 5: layers stored from LayerWeights' fields (optional q/k norms), config gains qk_norm and sliding_window;
# 6: optional linears (router) and per-expert linears, config gains the mixture-of-experts fields
# 7: grouped 5/6/8-bit linears (GGUF Q5_x, Q6_K, Q8_0 kept exactly) and concatenated linears
# 8: K-quant tensors (Q4_K, Q5_K, Q6_K) keep their two-level scales (packing.Factored)
_FORMAT_VERSION = "8"
WAIT_SECONDS = 600.0  # for another process converting the same checkpoint; then we convert too


def cache_entry(path: Path, dtype: str) -> Path:
    stat_of = [path] if path.is_file() else sorted(path.glob("*.safetensors")) + [path / "config.json"]
    key = hashlib.sha256()
    key.update(f"{_FORMAT_VERSION}|{path.resolve()}|{dtype}|{torch.__version__}".encode())
    for item in stat_of:
        stat = item.stat()
        key.update(f"|{item.name}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return cache_directory() / key.hexdigest()[:24]


def load_or_convert(path: Path, dtype: str, convert: Callable[[], DecoderModel], *,
                    kv_dtype: str = DEFAULT_KV_DTYPE, activations: str = DEFAULT_ACTIVATIONS) -> DecoderModel:
    """The cached conversion of `path` when its entry is intact, else `convert()` (then cached).

    Concurrent processes converting the same entry take turns: the second loads what the first
    wrote. A damaged entry is converted again with a warning naming the damaged file.
    """
    entry = cache_entry(path, dtype)
    if cache_hit(entry):
        return _load_converted(entry, dtype, str(path), kv_dtype, activations)
    try:
        lock = EntryLock(entry)
    except OSError as error:
        warnings.warn(f"metagen: the cache {entry.parent} is not writable ({error}); converting {path} without it",
                      stacklevel=3)
        return convert()
    with lock:
        if not lock.acquire(WAIT_SECONDS, f"converting {path}"):
            warnings.warn(f"metagen: gave up waiting for another process converting {path}; converting it here",
                          stacklevel=3)
            return convert()
        problem = manifest_problem(entry)
        if problem is None:  # another process converted it while we waited
            return _load_converted(entry, dtype, str(path), kv_dtype, activations)
        if entry.exists():
            warnings.warn(f"metagen: damaged cache entry ({problem}); converting {path} again", stacklevel=3)
        model = convert()
        try:
            with staging_directory(entry) as staging:
                _save_converted(model, staging)
                publish_entry(staging, entry, source=str(path), dtype=dtype)
        except OSError as error:
            warnings.warn(f"metagen: could not write the cache entry {entry} ({error}); the next load converts again",
                          stacklevel=3)
        return model


def _linear_state(prefix: str, linear, tensors: dict, kinds: dict) -> None:
    kinds[prefix] = linear.record(prefix, tensors)


def _save_converted(model: DecoderModel, directory: Path) -> None:
    """The model's weights, config, linear formats and tokenizer as files in `directory`."""
    from safetensors.torch import save_file

    tensors: dict[str, torch.Tensor] = {"embed": model.embed, "norm": model.norm}
    if model.freq_factors is not None:
        tensors["rope_freqs"] = model.freq_factors
    kinds: dict[str, dict] = {}
    for i, layer in enumerate(model.layers):
        for name in NORM_FIELDS:
            if getattr(layer, name) is not None:  # an optional norm the family lacks is stored as absence
                tensors[f"layers.{i}.{name}"] = getattr(layer, name)
        for name in LINEAR_FIELDS:  # an optional linear the layer lacks is stored as absence
            if getattr(layer, name) is not None:
                _linear_state(f"layers.{i}.{name}", getattr(layer, name), tensors, kinds)
        for name in EXPERT_FIELDS:
            for e, linear in enumerate(getattr(layer, name) or ()):
                _linear_state(f"layers.{i}.{name}.{e}", linear, tensors, kinds)
    _linear_state("lm_head", model.lm_head, tensors, kinds)
    save_file(tensors, str(directory / "weights.safetensors"))
    (directory / "config.json").write_text(model.config.to_json())
    (directory / "linears.json").write_text(json.dumps(kinds))
    model.tokenizer.save(directory / "tokenizer")


def _load_converted(entry: Path, dtype: str, source: str, kv_dtype: str = DEFAULT_KV_DTYPE,
                    activations: str = DEFAULT_ACTIVATIONS) -> DecoderModel:
    from safetensors.torch import load_file

    from metagen.models.tokenizer import Tokenizer

    config = ModelConfig.from_json((entry / "config.json").read_text())
    kinds = json.loads((entry / "linears.json").read_text())
    # Fresh allocations: the packed-weight kernels use aligned vector loads, and tensors carved
    # out of the file's buffer are not guaranteed 64-byte aligned.
    tensors = {name: tensor.clone() for name, tensor in load_file(str(entry / "weights.safetensors")).items()}

    def linear(prefix: str):
        return restore_linear(prefix, kinds[prefix], tensors) if prefix in kinds else None

    def experts(prefix: str):
        return [linear(f"{prefix}.{e}") for e in range(config.num_experts)] if f"{prefix}.0" in kinds else None

    layers = [
        LayerWeights(
            **{name: tensors.get(f"layers.{i}.{name}") for name in NORM_FIELDS},
            **{name: linear(f"layers.{i}.{name}") for name in LINEAR_FIELDS},
            **{name: experts(f"layers.{i}.{name}") for name in EXPERT_FIELDS},
        )
        for i in range(config.num_hidden_layers)
    ]
    lm_head = restore_linear("lm_head", kinds["lm_head"], tensors)
    tokenizer = Tokenizer.load(entry / "tokenizer")
    return DecoderModel(
        config, layers, tensors["embed"], tensors["norm"], lm_head, tokenizer, dtype, tensors.get("rope_freqs"), source,
        kv_dtype, activations,
    )


RECIPE = "recipe.json"


def is_saved_model(path: Path) -> bool:
    """A directory written by `save_model` (a compressed model), as opposed to an HF checkpoint."""
    return path.is_dir() and (path / RECIPE).is_file()


def save_model(model: DecoderModel, directory: Path, recipe: dict) -> None:
    """Save a built model (e.g. compressed) in the conversion cache's layout plus `recipe.json`
    (how it was made), built aside and renamed into place with its manifest. Refuses to replace
    a non-empty directory that is not a saved model."""
    directory = Path(directory)
    if directory.exists() and any(directory.iterdir()) and not is_saved_model(directory):
        raise ValueError(f"--out {str(directory)!r} is a non-empty directory that is not a saved model; "
                         f"choose a new or empty directory")
    directory.parent.mkdir(parents=True, exist_ok=True)
    with staging_directory(directory) as staging:
        _save_converted(model, staging)
        (staging / RECIPE).write_text(json.dumps(recipe | {"dtype": model.dtype}, indent=1, sort_keys=True))
        if directory.exists() and not any(directory.iterdir()):
            directory.rmdir()
        publish(staging, directory)


def load_saved_model(directory: Path, dtype: str | None = None, *, kv_dtype: str = DEFAULT_KV_DTYPE,
                     activations: str = DEFAULT_ACTIVATIONS) -> DecoderModel:
    """A model written by `save_model`, checked against its manifest, in the formats it was saved
    in: `dtype` may be None, "auto" or that format, and anything else is refused."""
    problem = manifest_problem(directory)
    if problem is not None:
        raise ValueError(f"the saved model {directory} is damaged: {problem}")
    saved = json.loads((directory / RECIPE).read_text())["dtype"]
    if dtype not in (None, "auto", saved):
        raise ValueError(f"dtype={dtype!r} cannot be applied to the saved model {directory}: it runs in the formats "
                         f"it was saved in ({saved}); choose auto or {saved}")
    return _load_converted(directory, saved, str(directory), kv_dtype, activations)
