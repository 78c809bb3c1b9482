"""A whole model compressed layer by layer through its own forward (Frantar et al. 2023's
sequential recipe), and the `Recipe` that says how.

Calibration text is run through `DecoderModel.layer_by_layer`: before each layer runs, the inputs
of its four linears are recorded in forward order — Q·K·V (one fused linear, so q, k and v share
one Hessian), O, gate·up, down — each linear is compressed from its Hessian H = 2XXᵀ and swapped
in before the next one's inputs are recorded, and the layer's output with every linear compressed
is what the next layer sees. A recording run stops as soon as the linear's input is seen
(`_Recorded`), so a layer costs about three runs instead of five. Unstructured pruning picks its
threshold within each projection of a fused linear (q, k, v; gate, up), as the papers' separate
linears have it (`compress_weight`).

Data-free methods (rtn, magnitude) need no calibration: each weight is compressed on its own.
The LM head and embeddings are never compressed (quantized formats keep the int8 head of
`load(dtype="int4")`).

Output formats (every linear of a model runs in one of the existing dtypes, `models/linear.py`):
- quantized (3/4 bits) → `Int4Linear` codes in the kernel's group layout (3-bit codes use 8 of
  the 16 levels); 8 bits → `Int8Linear` (one scale per output channel);
- pruned (with or without quantized values) → dense with exact zeros, in `recipe.dtype`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

import torch

from metagen.compress.gptq import SweepResult, gptq
from metagen.compress.hessian import HessianAccumulator, check_damp
from metagen.compress.magnitude import check_n_m, check_sparsity, magnitude_mask, n_m_mask
from metagen.compress.obc import obc_prune, obc_quantize
from metagen.compress.quantize import check_bits, fit_grid, quantize_rtn
from metagen.compress.sparsegpt import sparsegpt
from metagen.models.decoder import DecoderModel
from metagen.models.layer import LINEAR_FIELDS
from metagen.models.linear import DenseLinear, Int4Linear, Int8Linear

METHODS = ("rtn", "magnitude", "obc", "gptq", "sparsegpt")
CALIBRATED = ("obc", "gptq", "sparsegpt")


@dataclass(frozen=True)
class Recipe:
    """How to compress every linear of the decoder layers.

    method: rtn (round to nearest; `clip` for the clipping search) | magnitude | obc | gptq |
        sparsegpt. bits: 3, 4 or 8 (None: not quantized). group_size: input features per
        grid for 3 and 4 bits (the int4 layout); 8 bits have one grid per row (the int8 layout).
        sparsity: fraction pruned in [0, 1), or n_m = (N, M) structured. damp: relative Hessian
        dampening. block_size: GPTQ/SparseGPT lazy block.
    dtype: fp32 | bf16, the dense format of pruned weights.
    """

    method: str
    bits: int | None = None
    group_size: int = 32
    clip: bool = False
    sparsity: float = 0.0
    n_m: tuple[int, int] | None = None
    damp: float = 0.01
    block_size: int = 128
    dtype: str = "fp32"

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"method={self.method!r} is not supported: choose one of {', '.join(METHODS)}")
        if self.bits is not None:
            check_bits(self.bits)
        check_sparsity(self.sparsity)
        if self.n_m is not None:
            check_n_m(*self.n_m)
            if self.sparsity:
                raise ValueError("give either sparsity or n_m, not both")
        check_damp(self.damp)
        if self.dtype not in ("fp32", "bf16"):
            raise ValueError(f"dtype={self.dtype!r} is not supported for pruned weights: choose fp32 or bf16")
        if self.method in ("rtn", "gptq") and self.bits is None:
            raise ValueError(f"method={self.method!r} quantizes: give bits (3, 4 or 8)")
        if self.method in ("rtn", "gptq") and self.pruned:
            raise ValueError(f"method={self.method!r} does not prune: use sparsegpt (with bits) or magnitude")
        if self.method in ("magnitude", "sparsegpt") and not self.pruned:
            raise ValueError(f"method={self.method!r} prunes: give sparsity > 0 or n_m")
        if self.method == "obc" and (self.bits is None) == (not self.pruned):
            raise ValueError("method='obc' does one of pruning (sparsity) or quantization (bits), not both or neither")
        if self.method == "obc" and self.n_m is not None:
            raise ValueError("method='obc' prunes unstructured only: n_m is not supported with it")
        if self.clip and self.bits is None:
            raise ValueError("clip chooses a quantization grid: it needs bits")

    @property
    def pruned(self) -> bool:
        return self.sparsity > 0 or self.n_m is not None

    @property
    def needs_calibration(self) -> bool:
        return self.method in CALIBRATED

    @property
    def model_dtype(self) -> str:
        """The DecoderModel dtype of the result."""
        if self.pruned or self.bits is None:
            return self.dtype
        return "int8" if self.bits == 8 else "int4"

    def to_dict(self) -> dict:
        return asdict(self) | {"n_m": list(self.n_m) if self.n_m else None}


def compress_weight(weight: torch.Tensor, hessian: torch.Tensor | None, recipe: Recipe,
                    parts: tuple[int, ...] | None = None) -> SweepResult:
    """One linear's weight (N, K) compressed by `recipe` (hessian (K, K) for calibrated methods).

    parts: row counts of the projections fused in this linear (q, k, v in `qkv`; gate, up in
    `gate_up`), summing to N. Unstructured pruning (magnitude, SparseGPT at a sparsity) picks one
    threshold over the rows it sees, so it runs on each part as on a separate linear — the
    papers' layers are those projections; a threshold over the fused rows prunes the part of
    smaller weights far more (measured on Qwen2.5-0.5B's layer 0: v 93% pruned, q 45%). Every
    other method treats rows independently (one H per linear), so parts do not change it."""
    weight = weight.float()
    if parts is not None and len(parts) > 1 and recipe.sparsity and recipe.method in ("magnitude", "sparsegpt"):
        if sum(parts) != weight.shape[0]:
            raise ValueError(f"parts={parts} do not sum to the weight's {weight.shape[0]} rows")
        pieces = [compress_weight(piece, hessian, recipe) for piece in weight.split(list(parts))]
        grid = None
        if pieces[0].grid is not None:
            first = pieces[0].grid
            grid = replace(first, scale=torch.cat([p.grid.scale for p in pieces]),
                           zero=torch.cat([p.grid.zero for p in pieces]))
        return SweepResult(torch.cat([p.weight for p in pieces]), grid, torch.cat([p.mask for p in pieces]))
    group = weight.shape[1] if recipe.bits == 8 else recipe.group_size
    if recipe.method == "rtn":
        quantized, grid = quantize_rtn(weight, recipe.bits, group, clip=recipe.clip)
        return SweepResult(quantized, grid, None)
    if recipe.method == "magnitude":
        mask = n_m_mask(weight.abs(), *recipe.n_m) if recipe.n_m else magnitude_mask(weight, recipe.sparsity)
        pruned = weight.masked_fill(mask, 0.0)
        if recipe.bits is None:
            return SweepResult(pruned, None, mask)
        quantized, grid = quantize_rtn(pruned, recipe.bits, group, clip=recipe.clip)
        return SweepResult(quantized.masked_fill(mask, 0.0), grid, mask)
    if hessian is None:
        raise ValueError(f"method={recipe.method!r} needs calibration data")
    if recipe.method == "gptq":
        return gptq(weight, hessian, recipe.bits, group, clip=recipe.clip, block_size=recipe.block_size,
                    damp=recipe.damp)
    if recipe.method == "sparsegpt":
        return sparsegpt(weight, hessian, sparsity=recipe.sparsity, n_m=recipe.n_m, bits=recipe.bits,
                         group_size=group if recipe.bits else None, clip=recipe.clip, block_size=recipe.block_size,
                         damp=recipe.damp)
    if recipe.bits is not None:
        grid = fit_grid(weight, recipe.bits, group, clip=recipe.clip)
        return SweepResult(obc_quantize(weight, hessian, grid, damp=recipe.damp), grid, None)
    pruned = obc_prune(weight, hessian, int(recipe.sparsity * weight.shape[1]), damp=recipe.damp)
    return SweepResult(pruned, None, pruned == 0)


class _Recorded(Exception):
    """Raised by a recording linear once it has seen its input: the rest of the layer is not needed."""


class _Recorder:
    """Stands in for a linear: adds its input (..., K) to a Hessian, then stops the layer."""

    def __init__(self, accumulator: HessianAccumulator) -> None:
        self.accumulator = accumulator

    def __call__(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        self.accumulator.add(x.float())
        raise _Recorded


def compress_model(model: DecoderModel, recipe: Recipe, calibration: list[list[int]] | None = None,
                   progress: Callable[[int, int], None] | None = None) -> tuple[DecoderModel, dict]:
    """`model` (fp32 weights) compressed by `recipe`; returns (the new model, facts for the
    recipe file: seconds, calibration tokens). `calibration`: equal-length token rows, required
    exactly for calibrated methods. `progress(done_layers, total_layers)` after each layer."""
    if model.dtype != "fp32":
        raise ValueError(f"compress a model loaded with dtype='fp32' (got {model.dtype!r}): the methods start "
                         f"from the dense weights")
    if model.config.num_experts:
        raise NotImplementedError(f"{model.config.name} is a mixture of experts ({model.config.num_experts} "
                                  f"experts): compressing experts is not implemented")
    if recipe.needs_calibration and not calibration:
        raise ValueError(f"method={recipe.method!r} needs calibration text")
    if not recipe.needs_calibration and calibration:
        raise ValueError(f"method={recipe.method!r} is data-free: it takes no calibration text")
    started = time.perf_counter()
    total = len(model.layers)
    results: list[dict[str, SweepResult]] = []
    layers = list(model.layers)
    if calibration:
        lengths = {len(row) for row in calibration}
        if len(lengths) != 1:
            raise ValueError(f"calibration rows must have one length, got lengths {sorted(lengths)}")
        work = DecoderModel(model.config, layers, model.embed, model.norm, model.lm_head, model.tokenizer, "fp32",
                            model.freq_factors, source=model.source, activations=model.activations)
        cache = work.new_cache(len(calibration), capacity=len(calibration) * lengths.pop())
        for step in work.layer_by_layer(cache, calibration):
            layer = layers[step.index]
            compressed = {}
            for name in _linear_names(layer):  # forward order: each sees the ones before it compressed
                linear = getattr(layer, name)
                accumulator = HessianAccumulator(linear.in_features)
                try:
                    step(replace(layer, **{name: _Recorder(accumulator)}))
                except _Recorded:
                    pass
                compressed[name] = compress_weight(linear.weight, accumulator.hessian, recipe,
                                                   fused_parts(model.config, name, linear.weight.shape[0]))
                layer = replace(layer, **{name: DenseLinear(compressed[name].weight, linear.bias)})
            layers[step.index] = layer
            step(layer)
            results.append(compressed)
            if progress is not None:
                progress(step.index + 1, total)
    else:
        for index, layer in enumerate(layers):
            results.append({name: compress_weight(getattr(layer, name).weight, None, recipe,
                                                  fused_parts(model.config, name, getattr(layer, name).weight.shape[0]))
                            for name in _linear_names(layer)})
            if progress is not None:
                progress(index + 1, total)
    built = _build(model, recipe, results)
    facts = {"seconds": round(time.perf_counter() - started, 1),
             "calibration_tokens": sum(len(row) for row in calibration) if calibration else 0}
    return built, facts


def layer_hessians(model: DecoderModel, calibration: list[list[int]], index: int) -> dict[str, torch.Tensor]:
    """The Hessians H = 2XXᵀ (`HessianAccumulator`, float64 (K, K)) of the inputs of every
    linear of decoder layer `index`, by name, from `calibration` run through the dense `model`
    (fp32, nothing compressed): the layer-wise problems of that layer, each linear on its own
    (OBC's setting), for measuring methods on a few layers instead of the whole model."""
    if model.dtype != "fp32":
        raise ValueError(f"layer_hessians needs a model loaded with dtype='fp32' (got {model.dtype!r})")
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(model.layers):
        raise ValueError(f"index={index!r} is out of range: must be an int in [0, {len(model.layers) - 1}]")
    lengths = {len(row) for row in calibration}
    if not calibration or len(lengths) != 1:
        raise ValueError(f"calibration rows must be non-empty and of one length, got lengths {sorted(lengths)}")
    cache = model.new_cache(len(calibration), capacity=len(calibration) * lengths.pop())
    for step in model.layer_by_layer(cache, calibration):
        layer = model.layers[step.index]
        if step.index < index:
            step(layer)
            continue
        hessians = {}
        for name in _linear_names(layer):
            accumulator = HessianAccumulator(getattr(layer, name).in_features)
            try:
                step(replace(layer, **{name: _Recorder(accumulator)}))
            except _Recorded:
                pass
            hessians[name] = accumulator.hessian
        return hessians
    raise AssertionError("unreachable: layer_by_layer yields every layer")


def fused_parts(config, name: str, rows: int) -> tuple[int, ...] | None:
    """Row counts of the projections fused in linear `name` of `rows` rows: (q, k, v) for qkv,
    (gate, up) for gate_up, None for a linear that is one projection."""
    if name == "qkv":
        kv = config.num_key_value_heads * config.head_dim
        return (config.num_attention_heads * config.head_dim, kv, kv)
    if name == "gate_up":
        return (rows // 2, rows // 2)
    return None


def _linear_names(layer) -> list[str]:
    """The layer's linears in forward order (qkv, o, gate_up, down; optional ones it lacks left out)."""
    return [name for name in LINEAR_FIELDS if getattr(layer, name) is not None]


def _build(model: DecoderModel, recipe: Recipe, results: list[dict[str, SweepResult]]) -> DecoderModel:
    dtype = recipe.model_dtype
    activation = torch.float32 if dtype == "fp32" else torch.bfloat16
    layers = []
    for layer, compressed in zip(model.layers, results):
        linears = {name: _linear(compressed[name], getattr(layer, name).bias, recipe, activation)
                   for name in _linear_names(layer)}
        layers.append(replace(layer, **linears))
    head_weight = model.lm_head.weight.float()
    lm_head = Int8Linear.quantize(head_weight) if dtype in ("int4", "int8") else DenseLinear(head_weight.to(activation))
    lm_head.stored = model.lm_head.stored
    return DecoderModel(model.config, layers, model.embed.to(activation), model.norm, lm_head, model.tokenizer, dtype,
                        model.freq_factors, source=model.source, activations=model.activations)


def _linear(result: SweepResult, bias: torch.Tensor | None, recipe: Recipe, activation: torch.dtype):
    stored = f"{recipe.method}" + (f" int{recipe.bits}" if recipe.bits else "") + (
        f" {recipe.n_m[0]}:{recipe.n_m[1]}" if recipe.n_m else f" {recipe.sparsity:.0%} sparse" if recipe.sparsity else "")
    if recipe.pruned or recipe.bits is None:
        linear = DenseLinear(result.weight.to(activation), None if bias is None else bias.to(activation))
    elif recipe.bits == 8:
        grid = result.grid
        codes = (grid.codes(result.weight) - grid.center).to(torch.int8)
        linear = Int8Linear(codes, grid.scale[:, 0].to(torch.bfloat16), None if bias is None else bias.to(torch.bfloat16))
    else:
        n, k = result.weight.shape
        if not Int4Linear.supports(n, k, recipe.group_size):
            raise ValueError(f"a ({n}, {k}) linear does not fit the int4 kernel (N % 16, K % group_size={recipe.group_size})")
        grid = result.grid
        linear = Int4Linear.from_codes(grid.codes(result.weight).to(torch.int32), grid.scale, grid.zero, bias,
                                       recipe.group_size)
    linear.stored = stored
    return linear
