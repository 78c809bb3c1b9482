"""`load()`: a checkpoint (GGUF file or HF directory, local or named on the Hugging Face Hub:
`hub.py`) -> a ready `DecoderModel`.

One reader per file format (`gguf_reader.py`, `hf_reader.py`) reads the checkpoint into canonical
weight sources (`weights.py`), driven by the family's name map; one generic builder turns them
into `LayerWeights` from the dataclass's fields (`_build`). Conversion (dequantize, fuse Q·K·V
and gate·up, pack int8/int4) runs once per (file, dtype); the result is stored as safetensors
under the cache directory ($METAGEN_CACHE, default ~/.cache/metagen) together with the
tokenizer, so the next load is a memory map (see `conversion_cache`).
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from metagen.models.cache import DEFAULT_KV_DTYPE, check_kv_dtype
from metagen.models.config import ModelConfig
from metagen.models.conversion_cache import is_saved_model, load_or_convert, load_saved_model
from metagen.models.decoder import DecoderModel
from metagen.models.disk_cache import cache_directory  # noqa: F401  (its historical home)
from metagen.models.embedded import embedded_model_path
from metagen.models.gguf_blocks import EXACT_INT4_TYPES
from metagen.models.hub import resolve
from metagen.models.kernel_backend import DEFAULT_ACTIVATIONS, check_activations
from metagen.models.linear import ConcatLinear, DenseLinear, GroupedLinear, Int4Linear, Int8Linear
from metagen.models.families import family_for
from metagen.models.families.family import EXPERT_LINEARS
from metagen.models.layer import EXPERT_FIELDS, LINEAR_FIELDS, NORM_FIELDS, LayerWeights
from metagen.models.packing import Factored

DTYPES = ("auto", "fp32", "bf16", "int8", "int4")
DEFAULT_DTYPE = "auto"
# What "auto" runs a quantized weight in when no kernel holds its blocks exactly.
AUTO_WIDE_FORMAT = "int8"


def load(path: str | os.PathLike | None = None, dtype: str | None = None, *, kv_dtype: str | None = None,
         activations: str | None = None, use_cache: bool = True) -> DecoderModel:
    """Load a decoder of any supported family (llama, mistral, qwen2, qwen3, phi3, gemma3, qwen3_moe,
    mixtral, qwen2_moe).

    path: a .gguf file, an HF directory (config.json, *.safetensors, tokenizer.json), a
        directory saved by `metagen compress` (loaded in its saved formats), or a Hugging Face
        Hub name "OWNER/NAME" or "OWNER/NAME:QUANT" (a GGUF repository's quantization, e.g.
        "Qwen/Qwen2.5-0.5B-Instruct-GGUF:Q4_K_M"; see `models/hub.py`), downloaded into the hub
        cache; an existing path wins over a hub name. None loads the embedded SmolLM2-135M-Instruct.
    dtype: "auto" (default), "fp32", "bf16", "int8" or "int4" weights. "auto" never runs a
        tensor below the precision the checkpoint stores it in: int4 where the file's blocks map
        exactly onto the int4 kernel (Q4_0, Q4_1, Q4_K), the grouped 5-, 6- and 8-bit kernel
        for Q5_0, Q5_1, Q5_K, Q6_K and Q8_0 (their own codes and scales), int8 per row for the
        other quantized types, bf16 for float tensors. A 4-bit GGUF is not 4-bit throughout
        (Q4_K_M keeps attention V, half the FFN down projections and the output at 5-8 bits), and
        re-quantizing those to int4 would lose what the file kept on purpose. The measured
        faithfulness of each format: docs/benchmarks/faithfulness.md.
        An explicit int4 / int8 re-quantizes every tensor that does not map exactly.
    kv_dtype: the KV cache's format, "fp32" (default), "bf16" (half the bytes per cached token)
        or "int8" with a float32 scale per (token, key/value, head) (about a quarter); see
        `models/cache.py` and the measured quality in BENCHMARKS.md.
    activations: what metagen's compiled kernels quantize each block of 32 activations to before
        the integer dot products with the weight codes: "int16" (default; finer than bf16) or
        "int8" (llama.cpp's Q8_0 codes: half the multiply-adds, a larger error; measured in
        docs/benchmarks/kernels.md). Every batch size runs it; fp32 / bf16 weights and torch's
        kernels (METAGEN_KERNELS=torch) do not quantize activations and ignore it.
    """
    dtype = DEFAULT_DTYPE if dtype is None else dtype
    if dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r} is not supported: choose one of {', '.join(DTYPES)}")
    kv_dtype = check_kv_dtype(DEFAULT_KV_DTYPE if kv_dtype is None else kv_dtype)
    activations = check_activations(DEFAULT_ACTIVATIONS if activations is None else activations)
    path, name = (embedded_model_path(), None) if path is None else resolve(path)
    if not path.exists():
        raise FileNotFoundError(f"model path {path} does not exist")
    # The weights depend on neither kv_dtype nor activations: one conversion serves every setting.
    if is_saved_model(path):  # a directory written by `metagen compress`
        return load_saved_model(path, dtype, kv_dtype=kv_dtype, activations=activations)
    if not use_cache:
        return _convert(path, dtype, kv_dtype, activations, name)
    return load_or_convert(path, dtype, lambda: _convert(path, dtype, kv_dtype, activations, name),
                           kv_dtype=kv_dtype, activations=activations)


def _convert(path: Path, dtype: str, kv_dtype: str, activations: str, name: str | None = None) -> DecoderModel:
    """The model of the checkpoint at `path`; `name` replaces the checkpoint's own (a hub snapshot
    directory's name is a commit)."""
    config, sources, tokenizer = _read_checkpoint(path)
    if name is not None:
        config = replace(config, name=name)
    _check_complete(config, sources, path)
    return _build(config, sources, tokenizer, dtype, str(path), kv_dtype, activations)


def _check_complete(config: ModelConfig, sources: dict, path: Path) -> None:
    """ValueError naming the checkpoint and the tensors its family needs but it lacks."""
    needed = ["embed", "norm"] + ([] if config.tie_word_embeddings else ["lm_head"])
    family = family_for(config.architecture, str(path))
    per_layer = family.required_layer_tensors()
    per_layer += [f"experts.{e}.{part}" for e in range(config.num_experts) for part in family.expert_names]
    for i in range(config.num_hidden_layers):
        needed += [f"layers.{i}.{name}" for name in per_layer]
    missing = [name for name in needed if name not in sources]
    if missing:
        shown = ", ".join(missing[:6]) + (f" and {len(missing) - 6} more" if len(missing) > 6 else "")
        raise ValueError(f"{path} is missing tensors a {config.architecture} model needs: {shown}")


def _read_checkpoint(path: Path):
    from metagen.models.tokenizer import Tokenizer
    from metagen.models.gguf_reader import read_gguf
    from metagen.models.hf_reader import read_hf_directory

    if path.is_dir():
        config, sources = read_hf_directory(path)
        return config, sources, Tokenizer.from_hf_dir(path)
    if path.suffix != ".gguf":
        raise ValueError(f"{path} is neither a .gguf file nor an HF model directory")
    config, sources, reader = read_gguf(path)
    return config, sources, Tokenizer.from_gguf(reader)


def _auto_format(part) -> tuple:
    """The format "auto" gives one stored tensor: never below the precision it has.

    ("grouped", bits, group, zeros, offset) for the blocks the grouped kernel holds exactly, with
    their own two-level scales for the K-quants (Q4_K, Q5_0, Q5_1, Q5_K, Q6_K, Q8_0); ("int4",) for
    the other blocks that are exactly int4 codes (Q4_0, Q4_1); ("bf16",) for floats (F32 / F16 /
    BF16 / safetensors); else (AUTO_WIDE_FORMAT,) (the 2- and 3-bit K-quants and the IQ types,
    re-quantized per row)."""
    if part.type_name in GROUPED_FORMATS:
        return ("grouped",) + GROUPED_FORMATS[part.type_name]
    if part.type_name in EXACT_INT4_TYPES:
        return ("int4",)
    if part.raw is None:
        return ("bf16",)
    return (AUTO_WIDE_FORMAT,)


# bits, group, has zeros, offset of each GGUF type the grouped kernel holds exactly (gguf_blocks.py)
GROUPED_FORMATS = {"Q4_K": (4, 32, True, 0), "Q5_0": (5, 32, False, 16), "Q5_1": (5, 32, True, 0),
                   "Q5_K": (5, 32, True, 0), "Q6_K": (6, 16, False, 32), "Q8_0": (8, 32, False, 128)}


def _linear(sources: dict, names: list[str], dtype: str, bias_names: list[str] | None = None):
    """One fused linear from the row-wise concatenation of `names` (out dims stacked).

    Under "auto" each part keeps its own format: consecutive parts stored alike run as one
    linear, and parts stored differently (e.g. Q·K in Q4_K, V in Q6_K) as a `ConcatLinear`.
    The linear's `stored` attribute names the checkpoint formats it was built from.
    """
    missing = [n for n in names if n not in sources]
    if missing:
        raise ValueError(f"checkpoint is missing tensors: {', '.join(missing)}")
    parts = [sources[n] for n in names]
    stored = "+".join(sorted({part.type_name for part in parts}))
    biases = [sources.get(n) for n in bias_names] if bias_names else [None] * len(parts)
    if not all(b is not None for b in biases):
        biases = [None] * len(parts)
    if dtype != "auto":
        linear = _linear_from_parts(parts, dtype, biases)
    else:
        runs: list[tuple[tuple, list, list]] = []  # (format, parts, biases) of consecutive parts stored alike
        for part, bias in zip(parts, biases):
            form = _auto_format(part)
            if runs and runs[-1][0] == form:
                runs[-1][1].append(part)
                runs[-1][2].append(bias)
            else:
                runs.append((form, [part], [bias]))
        pieces = [_linear_from_parts(run_parts, form[0], run_biases) for form, run_parts, run_biases in runs]
        linear = pieces[0] if len(pieces) == 1 else ConcatLinear(pieces)
    linear.stored = stored
    return linear


def _linear_from_parts(parts: list, dtype: str, bias_parts: list):
    bias = None
    if all(part is not None for part in bias_parts):
        bias = torch.cat([part.dense() for part in bias_parts])
    if dtype == "int4":
        exact = [part.int4_codes() for part in parts]
        if all(e is not None for e in exact):  # Q4_0 / Q4_1 / Q4_K blocks map onto the kernel exactly
            codes, scales, zeros = (torch.cat(pieces) for pieces in zip(*exact))
            if Int4Linear.supports(*codes.shape):
                return Int4Linear.from_codes(codes, scales, zeros, bias)
    if dtype == "grouped":
        exact = [part.group_codes() for part in parts]
        if all(e is not None for e in exact):  # None: a Q8_0 tensor holding the code −128
            first = exact[0]
            scales, zeros = (_group_values(exact, name) for name in ("scales", "zeros"))
            return GroupedLinear(torch.cat([torch.from_numpy(e.codes) for e in exact]), scales, zeros, first.bits,
                                 first.group, first.offset, None if bias is None else bias.float())
        dtype = AUTO_WIDE_FORMAT
    weight = torch.cat([part.dense() for part in parts])
    if dtype == "int4" and Int4Linear.supports(*weight.shape):
        return Int4Linear.quantize(weight, bias)
    if dtype in ("int4", "int8"):
        return Int8Linear.quantize(weight, bias)
    activation = torch.float32 if dtype == "fp32" else torch.bfloat16
    return DenseLinear(weight.to(activation), None if bias is None else bias.to(activation))


def _group_values(exact: list, name: str):
    """The stacked parts' "scales" or "zeros": `Factored` where the blocks store them in two levels."""
    if getattr(exact[0], name) is None:
        return None
    if exact[0].factors is not None:
        tops, subs = zip(*(e.factors[name] for e in exact))
        return Factored(torch.from_numpy(np.concatenate(tops)), torch.from_numpy(np.concatenate(subs)))
    return torch.cat([torch.from_numpy(getattr(e, name)) for e in exact])


def _build(config: ModelConfig, sources: dict, tokenizer, dtype: str, source: str, kv_dtype: str,
           activations: str = DEFAULT_ACTIVATIONS) -> DecoderModel:
    activation = torch.float32 if dtype == "fp32" else torch.bfloat16
    family = family_for(config.architecture, source)
    layers = []
    for i in range(config.num_hidden_layers):
        p = f"layers.{i}."
        weights = {}
        for name in LINEAR_FIELDS:  # each linear from the family's parts, fused in order (None if it has none)
            if name not in family.linears:
                weights[name] = None
                continue
            parts, bias_parts = family.linears[name]
            # The router (and a shared expert's gate) stays float32: see models/moe.py.
            gating = name in ("router", "shared_expert_gate")
            weights[name] = _linear(sources, [p + part for part in parts], "fp32" if gating else dtype,
                                    [p + part for part in bias_parts])
        for name in EXPERT_FIELDS:  # one linear per expert (None for a dense MLP)
            parts = EXPERT_LINEARS[name]
            weights[name] = [_linear(sources, [f"{p}experts.{e}.{part}" for part in parts], dtype)
                             for e in range(config.num_experts)] if family.moe else None
        for name in NORM_FIELDS:  # optional norms (q_norm, k_norm) are None when the family has none
            weights[name] = sources[p + name].dense() if p + name in sources else None
        layers.append(LayerWeights(**weights))
    embed = sources["embed"].dense()
    head_name = "embed" if config.tie_word_embeddings else "lm_head"
    # The LM head reads V·H weights per token; int8 keeps it 4x smaller than fp32 (an int4
    # head loses too much: GGUF ships it at 8 bits or more). "auto" keeps a float head in bf16.
    head_dtype = "int8" if dtype in ("int8", "int4") else dtype
    if dtype == "auto" and _auto_format(sources[head_name]) == ("int4",):
        head_dtype = AUTO_WIDE_FORMAT
    lm_head = _linear(sources, [head_name], head_dtype)
    freq_factors = sources["rope_freqs"].dense() if "rope_freqs" in sources else None
    return DecoderModel(
        config,
        layers,
        embed.to(activation),
        sources["norm"].dense(),
        lm_head,
        tokenizer,
        dtype,
        freq_factors,
        source,
        kv_dtype,
        activations,
    )


def weight_formats(model: DecoderModel) -> dict[str, dict[str, int]]:
    """What each kind of linear runs in, and from which stored format: e.g.
    {"down": {"int4 from Q4_K": 12, "int6g16 from Q6_K": 12}, "lm_head": {"int8g32 from Q8_0": 1}}."""
    formats: dict[str, dict[str, int]] = {}  # an expert linear counts once per expert
    for name, linear in model.linears():
        label = f"{linear.kind} from {linear.stored}" if linear.stored else linear.kind
        counts = formats.setdefault(name, {})
        counts[label] = counts.get(label, 0) + 1
    return formats
