"""The native decoder: a paged-cache `LanguageModel` over a stack of `layer.decoder_layer`s.

Every family (Llama, Mistral, Qwen2, Qwen3, Phi-3, Gemma 3, Qwen3-MoE, Mixtral, Qwen2-MoE; see
`models/families/`) runs this one class: a family differs only in its weights (which norms and
biases exist, how checkpoint names map onto `LayerWeights`), never in the forward. The code is plain tensor functions over weight
objects (no nn.Module) so the per-token path is a short list of kernels: per layer 2 norms,
4 matmuls, RoPE, cache write/gather, attention.

Two execution paths share the layer body and differ only in how attention and the residual
add + norm run (`layer_ops.GeneralOps`, `layer_ops.FusedOps`, the `layer.Ops` protocol): appends of more than FUSED_MAX_NEW_TOKENS tokens per
row (prefill) gather K/V and call SDPA; shorter ones (decode steps, speculative verification)
run the fused CPU kernels of `models/kernels/fused.cpp`.

Sliding-window layers (Mistral; Gemma 3's local layers) attend to the last W positions, p − W + 1
.. p, as transformers does: the general path masks and gathers only the columns any query of
the call can see, the fused path starts each query's read of its page table at p − W + 1. A
layer without a window costs nothing extra. When every layer is windowed the cache releases
slots that left every row's window (`KVCache(window=...)`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F

from metagen.models import checks
from metagen.models.base import DepthTruncatable, EmbeddingInput, ForwardOutput, LanguageModel, LogitsMode
from metagen.models.cache import DEFAULT_KV_DTYPE, KV_DTYPES, KVCache, check_kv_dtype, token_bytes
from metagen.models.kernel_backend import DEFAULT_ACTIVATIONS, check_activations
from metagen.models.config import ModelConfig
from metagen.models.layer import EXPERT_FIELDS, LINEAR_FIELDS, LayerWeights, Ops, decoder_layer
from metagen.models.layer_ops import FusedOps, GeneralOps
from metagen.models.rope import RopeTables
from metagen.models.shared_prefix import shared_prefix_default
from metagen.models.step_buffers import StepBuffers, StepBufferSets  # noqa: F401  (StepBuffers re-exported)
from metagen.models.token_tree import TreeLayout, check_trees

# rows × cached keys up to which the fused attention reads the cache in place (beyond: SDPA over
# gathered K/V). In place wins at every size measured (int4, 2 threads, ms per decode step):
# 16 rows × 220 keys 46 vs 53, 16 × 1000 95 vs 168, 4 × 1000 31 vs 39; rows forked from one
# prompt read the same prefix slots, which stay in cache, while the gather copies them per row.
FUSED_ATTENTION_MAX_KEYS = 1 << 22
# Calls appending at most this many tokens per row (decode steps, speculative verification) run
# through the fused kernels, each new token as its own query "row" attending to its row's cache
# up to its own position; longer appends (prefill) use SDPA over gathered K/V.
FUSED_MAX_NEW_TOKENS = 16


class DecoderModel(LanguageModel, DepthTruncatable, EmbeddingInput):
    """Pre-norm decoder over a paged `KVCache` (a `PagedCache`; any family of `models/families/`).

    `dtype` names the weight format ("fp32", "bf16", "int8", "int4", "auto"). Matmul inputs and
    outputs are in the matmul dtype: float32 when every linear takes float32 at full precision
    (fp32 weights, or quantized weights on the compiled kernels, which quantize each activation
    block to 16 bits themselves), else bf16 (bf16 weights, torch's int4/int8 kernels). The
    residual stream, norms, RoPE and attention stay float32 (torch's CPU attention is several
    times slower in bf16, and the casts cost less than that). Logits are float32. `kv_dtype`
    ("fp32" default, "bf16", "int8") is the format of the caches `new_cache` makes (see
    `models/cache.py`): keys and values are rounded to it when stored and widened back to
    float32 when attention reads them. `activations` ("int16" default, "int8") is what the
    compiled kernels quantize each activation block to (`kernel_backend`); it is set on every
    linear here, so every batch size and every path runs it (a `truncated` model shares the
    linears, hence the setting).

    Beyond `LanguageModel`: `hidden_states` (final hidden states without the LM head),
    `logits_from_hidden`, `truncated(L)` (the first L layers as a model sharing every weight:
    `DepthTruncatable`), `input_embeddings` / `forward_embeddings` (input vectors fed in place
    of token ids: `EmbeddingInput`) and `linears()` (every linear with its name, for weight
    accounting).
    """

    def __init__(
        self,
        config: ModelConfig,
        layers: list[LayerWeights],
        embed: torch.Tensor,
        norm: torch.Tensor,
        lm_head: object,
        tokenizer: object,
        dtype: str,
        freq_factors: torch.Tensor | None = None,
        source: str = "",
        kv_dtype: str = DEFAULT_KV_DTYPE,
        activations: str = DEFAULT_ACTIVATIONS,
    ) -> None:
        self.config = config
        self.kv_dtype = check_kv_dtype(kv_dtype)
        self.activations = check_activations(activations)
        self.layers = layers
        self.embed = embed  # (V, H) in the activation dtype
        self.norm = norm
        self.lm_head = lm_head
        self.tokenizer = tokenizer
        self.dtype = dtype
        self.source = source
        self.name = config.name
        self.family = config.architecture
        for _, linear in self.linears():
            linear.set_activations(activations)
        self.matmul_dtype = torch.float32 if all(linear.takes_float for _, linear in self.linears()) else torch.bfloat16
        self.freq_factors = freq_factors
        # Per layer: its window (None: full causal attention) and whether it uses the local RoPE
        # table (Gemma 3's sliding layers: rope_local_theta, unscaled).
        self.layer_windows = [config.layer_window(i) for i in range(config.num_hidden_layers)]
        self.local_rope = [config.rope_local_theta is not None and config.is_local_layer(i)
                           for i in range(config.num_hidden_layers)]
        self.rope = RopeTables(config, freq_factors, any(self.local_rope))
        self.rope.ensure(min(self.max_context, 4096))
        from metagen.models.kernels import fused_kernels

        # Decode steps (one new token per row) run through fused CPU kernels when they build;
        # `use_fused = False` forces the pure-PyTorch path (same results, tested).
        self.kernels = fused_kernels()
        self.use_fused = self.kernels is not None
        # Rows sharing a cached prefix read it once per decode step for all of them
        # (models/shared_prefix.py); False (or METAGEN_SHARED_PREFIX=0) attends row by row.
        self.use_shared_prefix = shared_prefix_default()
        self.step_buffers = StepBufferSets()  # the decode path's reused intermediates

    # ------------------------------------------------------------ interface
    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    @property
    def max_context(self) -> int:
        return self.config.max_position_embeddings

    def new_cache(self, batch_size: int = 1, capacity: int = 1024) -> KVCache:
        """An empty cache of `batch_size` rows. When every layer is windowed (Mistral with
        sliding_window) it releases the slots that left every row's window, so its pool stays
        bounded however long the rows grow."""
        config = self.config
        cache = KVCache(
            config.num_hidden_layers,
            config.num_key_value_heads,
            config.head_dim,
            KV_DTYPES[self.kv_dtype],
            self.max_context,
            checks.bounded("capacity", capacity, 1),
            window=config.cache_window,
        )
        cache.reset(batch_size)
        return cache

    def flops_per_token(self, context_length: int) -> float:
        return self.config.flops_per_token(context_length)

    @property
    def kv_bytes_per_token(self) -> int:
        """layers · 2 · kv_heads · (head_dim · itemsize (+ a float32 scale per head in int8)): what
        each slot of `new_cache()`'s pools takes."""
        config = self.config
        return token_bytes(config.num_hidden_layers, config.num_key_value_heads, config.head_dim, self.kv_dtype)

    @property
    def num_parameters(self) -> int:
        return self.config.num_parameters

    def truncated(self, num_layers: int) -> "DecoderModel":
        """The first `num_layers` layers + the final norm and LM head, as a model (early exit).

        Shares every weight tensor with this model (no copy); it has its own caches."""
        total = self.config.num_hidden_layers
        if isinstance(num_layers, bool) or not isinstance(num_layers, int) or not 1 <= num_layers < total:
            raise ValueError(f"num_layers={num_layers!r} is out of range: must be an int in [1, {total - 1}]")
        layer_types = None if self.config.layer_types is None else self.config.layer_types[:num_layers]
        config = replace(self.config, num_hidden_layers=num_layers, layer_types=layer_types,
                         name=f"{self.config.name} (first {num_layers} layers)")
        model = DecoderModel(config, self.layers[:num_layers], self.embed, self.norm, self.lm_head, self.tokenizer,
                             self.dtype, self.freq_factors, source=self.source, kv_dtype=self.kv_dtype,
                             activations=self.activations)
        model.use_fused = self.use_fused
        model.use_shared_prefix = self.use_shared_prefix
        return model

    def linears(self) -> list[tuple[str, object]]:
        """Every linear as (kind, linear): each layer's qkv, o, gate_up, down (or router and every
        expert's expert_gate_up, expert_down), then "lm_head"."""
        out = []
        for layer in self.layers:
            out += [(name, getattr(layer, name)) for name in LINEAR_FIELDS if getattr(layer, name) is not None]
            out += [(name, linear) for name in EXPERT_FIELDS for linear in getattr(layer, name) or ()]
        return out + [("lm_head", self.lm_head)]

    # -------------------------------------------------------------- forward
    @torch.no_grad()
    def forward(
        self,
        cache: KVCache,
        tokens: Sequence[Sequence[int]] | torch.Tensor,
        *,
        logits: LogitsMode = "last",
        hidden: bool = False,
        tree: Sequence[Sequence[int] | None] | None = None,
    ) -> ForwardOutput:
        """`LanguageModel.forward`; a `tree` runs on both paths (`models/token_tree.py`): the
        general one masks page-table columns, the fused one gives each tree query its own page
        table. Rows without a tree (and trees that are chains) take the ordinary path."""
        return self._output(*self._run_layers(cache, tokens, tree=tree), logits, hidden)

    def input_embeddings(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows of the input embedding table E for `ids` (any shape of ints in [0, V)): `(*ids.shape,
        H)` in the activation dtype, before Gemma's scale (which `forward_embeddings` applies)."""
        return self.embed[ids]

    @torch.no_grad()
    def forward_embeddings(self, cache: KVCache, embeddings: torch.Tensor, *, logits: LogitsMode = "last",
                           hidden: bool = False) -> ForwardOutput:
        """`forward` with input vectors in place of token ids: row b appends the T vectors
        `embeddings[b]` ((B, T, H), any float dtype), each taken where `forward` takes E[token] —
        cast to the table's dtype, scaled as token embeddings are (Gemma), then run through every
        layer on the same path (fused for T <= FUSED_MAX_NEW_TOKENS). Feeding
        `input_embeddings(ids)` gives exactly `forward(cache, ids)`'s logits and cache; a
        weighted sum of rows (superposed decoding) is rounded to the table's dtype first."""
        if not isinstance(embeddings, torch.Tensor) or embeddings.dim() != 3 or not embeddings.is_floating_point():
            shape = tuple(embeddings.shape) if isinstance(embeddings, torch.Tensor) else type(embeddings).__name__
            raise ValueError(f"embeddings must be a float tensor (batch, length, hidden), got {shape}")
        batch, length, width = embeddings.shape
        if width != self.config.hidden_size or batch != cache.batch_size or length == 0:
            raise ValueError(f"embeddings has shape {(batch, length, width)}: need ({cache.batch_size} cache rows, "
                             f">= 1 positions, hidden size {self.config.hidden_size})")
        if not bool(torch.isfinite(embeddings).all()):
            raise ValueError("embeddings holds NaN or infinite values")
        return self._output(*self._run_layers(cache, None, embeddings), logits, hidden)

    def _output(self, x: torch.Tensor, h: torch.Tensor, counts: np.ndarray, packed: bool, logits: LogitsMode,
                hidden: bool) -> ForwardOutput:
        """The `ForwardOutput` of a layer loop's residual stream x and final norm input h."""
        num_new = counts.tolist()
        if logits == "none" and not hidden:
            return ForwardOutput(None, None, num_new)
        x, h = (_positions(t, counts, packed, logits == "all") for t in (x, h))
        final = F.rms_norm(x, (self.config.hidden_size,), self.norm, self.config.rms_norm_eps) if hidden else None
        out_logits = None
        if logits != "none":
            out_logits = self.lm_head(h).float()  # not checked here: the sampler chain refuses NaN / +inf
        return ForwardOutput(out_logits, final, num_new)

    @torch.no_grad()
    def hidden_states(self, cache: KVCache, tokens: Sequence[Sequence[int]] | torch.Tensor, *,
                      positions: Literal["all", "last"] = "all", tree=None) -> ForwardOutput:
        """Append `tokens` like `forward` (a `tree` too) and return the final hidden states (after
        the last norm, float32) without running the LM head: `hidden` is (B, T, H) for "all"
        (padding past `num_new[b]`), (B, H) for "last"; `logits` is None. For value heads and exit adapters."""
        if positions not in ("all", "last"):
            raise ValueError(f"positions={positions!r} is not supported: choose 'all' or 'last'")
        x, _, counts, packed = self._run_layers(cache, tokens, tree=tree)
        x = _positions(x, counts, packed, positions == "all")
        final = F.rms_norm(x, (self.config.hidden_size,), self.norm, self.config.rms_norm_eps)
        return ForwardOutput(None, final, counts.tolist())

    def logits_from_hidden(self, hidden: torch.Tensor) -> torch.Tensor:
        """The LM head on final hidden states `(..., H)` float32 -> logits `(..., V)` float32."""
        return self.lm_head(hidden.to(self.matmul_dtype)).float()

    def _run_layers(self, cache: KVCache, tokens, embeddings: torch.Tensor | None = None, tree=None
                    ) -> tuple[torch.Tensor, torch.Tensor, np.ndarray, bool]:
        """Append `tokens` (or the input vectors `embeddings`, (B, T, H)) to the cache through
        every layer. Returns the residual stream x, its final norm h (matmul dtype), the counts
        per row and whether x is packed: (N, H) over the real new tokens row-major (fused path)
        rather than (B, T_q, H) with padding."""
        ops, x, h, counts, packed = self._start(cache, tokens, fused=self.use_fused, embeddings=embeddings, tree=tree)
        for index, (layer, next_norm) in enumerate(self._layers_and_next_norms()):
            x, h = decoder_layer(self.config, layer, x, h, index, ops, next_norm)
        return x, h, counts, packed

    def _start(self, cache: KVCache, tokens, fused: bool, embeddings: torch.Tensor | None = None, tree=None
               ) -> tuple[Ops, torch.Tensor, torch.Tensor, np.ndarray, bool]:
        """What every layer loop does first: check and pack `tokens`, allocate their cache slots,
        grow the RoPE tables, choose the path (fused when allowed and at most FUSED_MAX_NEW_TOKENS
        per row) and normalise the embeddings (E[tokens], or `embeddings` (B, T, H) as given,
        every row T new positions); `tree` (per row None or parents) is checked before the cache
        changes. Returns (ops, x, h, counts, packed)."""
        if embeddings is None:
            ids, counts = self._pack(tokens, cache.batch_size)
            width = ids.shape[1]
        else:
            counts = np.full(embeddings.shape[0], embeddings.shape[1], dtype=np.int64)
            width = embeddings.shape[1]
        trees = check_trees(tree, counts)
        slots, table, positions = cache.allocate(counts)
        self.rope.ensure(int(positions.max()) + 1)  # padding queries may run past t_kv
        layout = None
        if trees is not None:
            layout = TreeLayout(trees, positions)
            positions = layout.positions
        packed = fused and width <= FUSED_MAX_NEW_TOKENS
        if packed:
            ops = FusedOps(self, cache, counts, slots, table, positions, FUSED_ATTENTION_MAX_KEYS, layout)
        else:
            ops = GeneralOps(self, cache, counts, slots, table, positions, layout)
        if embeddings is None:
            start = self._embed(ops.ids(ids) if packed else ids)
        else:  # every row has T positions: packing is the row-major flattening
            start = self._scaled(embeddings.to(self.embed.dtype, copy=True))  # the layers write x in place
            start = start.reshape(-1, start.shape[-1]) if packed else start
        x, h = ops.add_norm(start, None, self.layers[0].attn_norm)  # (B, T, H) or (N, H)
        return ops, x, h, counts, packed

    def _layers_and_next_norms(self) -> list[tuple[LayerWeights, torch.Tensor]]:
        """Each layer with the norm of its output: the next layer's attn_norm, the final norm last."""
        return list(zip(self.layers, [layer.attn_norm for layer in self.layers[1:]] + [self.norm]))

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        """The residual stream's start, float32: embedding rows (scaled in the activation dtype
        for Gemma, as transformers does)."""
        return self._scaled(self.embed[ids])  # (B, T_q, H) or (N, H)

    def _scaled(self, x: torch.Tensor) -> torch.Tensor:
        """Input vectors in the activation dtype -> the residual stream's start, float32."""
        if self.config.embed_scale is not None:
            x = x * torch.tensor(self.config.embed_scale, dtype=x.dtype)
        return x.float()

    @torch.no_grad()
    def layer_by_layer(self, cache: KVCache, tokens: Sequence[Sequence[int]] | torch.Tensor) -> Iterator["LayerStep"]:
        """Append `tokens` through the layers one at a time, for calibration (`metagen.compress`).

        Yields a `LayerStep` before each layer: the caller may run the layer on its input as often
        as it likes, with any weights (recording a linear's inputs, then swapping in its
        compressed version); each run writes the layer's K/V for these tokens again. The output
        of the step's last run is the next layer's input, so compressing layer i before its last
        run makes every later layer see the compressed one (sequential calibration). Runs the
        general path (SDPA); no logits.
        """
        ops, x, h, _, _ = self._start(cache, tokens, fused=False)
        for index, (layer, next_norm) in enumerate(self._layers_and_next_norms()):
            step = LayerStep(self.config, index, x, h, ops, next_norm)
            yield step
            if step.output is None:
                raise RuntimeError(f"layer {index} was never run: call the LayerStep before resuming")
            x, h = step.output

    # ------------------------------------------------------------ internals
    def _pack(self, tokens, batch_size: int) -> tuple[torch.Tensor, np.ndarray]:
        """Token rows -> (ids (B, Tq) padded with 0, counts (B,)); ids must be integers (a float
        or bool id is refused, not truncated) in [0, V)."""
        if isinstance(tokens, torch.Tensor):
            if tokens.dim() != 2:
                raise ValueError(f"tokens must be (batch, length), got shape {tuple(tokens.shape)}")
            _check_integer_ids("tokens", tokens)
            ids = tokens.long()
            counts = np.full(ids.shape[0], ids.shape[1], dtype=np.int64)
        else:
            rows = [_row_ids(f"tokens[{b}]", row) for b, row in enumerate(tokens)]
            counts = np.array([len(row) for row in rows], dtype=np.int64)
            t_q = int(counts.max(initial=0))
            ids = torch.zeros(len(rows), t_q, dtype=torch.long)
            for b, row in enumerate(rows):
                ids[b, : len(row)] = row
        if ids.shape[0] != batch_size:
            raise ValueError(f"got tokens for {ids.shape[0]} rows but the cache has {batch_size} rows")
        if (counts == 0).any():
            raise ValueError(f"row {int(np.argmin(counts))} has no new tokens; every row needs at least one")
        if ids.numel() and (ids.min() < 0 or ids.max() >= self.vocab_size):
            bad = ids[(ids < 0) | (ids >= self.vocab_size)][0].item()
            raise ValueError(f"token id {bad} is out of range: must be in [0, {self.vocab_size})")
        return ids, counts


class LayerStep:
    """One layer of `DecoderModel.layer_by_layer`: `step(weights)` runs `weights` (a
    `LayerWeights`) on the layer's input and returns its output residual stream `(B, T, H)`."""

    def __init__(self, config: ModelConfig, index: int, x: torch.Tensor, h: torch.Tensor, ops, next_norm) -> None:
        self.index = index
        self._config, self._x, self._h, self._ops, self._next_norm = config, x, h, ops, next_norm
        self.output: tuple[torch.Tensor, torch.Tensor] | None = None

    @torch.no_grad()
    def __call__(self, weights: LayerWeights) -> torch.Tensor:
        self.output = decoder_layer(self._config, weights, self._x, self._h, self.index, self._ops, self._next_norm)
        return self.output[0]


def _row_ids(name: str, row: Sequence[int]) -> torch.Tensor:
    """One row of token ids as a tensor `(T,)`; TypeError unless they are integers."""
    try:
        ids = torch.tensor(list(row))  # dtype inferred: int64 for ints, float for floats
    except (TypeError, ValueError, RuntimeError):
        raise TypeError(f"{name} must be a sequence of int token ids, got {row!r}") from None
    if ids.numel():
        _check_integer_ids(name, ids)
    return ids


def _check_integer_ids(name: str, ids: torch.Tensor) -> None:
    if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
        raise TypeError(f"{name} must hold integer token ids, got {ids.dtype}")


def _pad_rows(flat: torch.Tensor, counts: np.ndarray, t_q: int) -> torch.Tensor:
    """(N, X) values of the real new tokens, row-major -> (B, T_q, X) with zero padding."""
    if t_q == 1:
        return flat.unsqueeze(1)
    out = flat.new_zeros(len(counts), t_q, flat.shape[-1])
    valid = torch.from_numpy(np.arange(t_q)[None, :] < counts[:, None])
    out[valid] = flat
    return out


def _positions(values: torch.Tensor, counts: np.ndarray, packed: bool, all_positions: bool) -> torch.Tensor:
    """Per-token values at the positions asked for: every new token `(B, T_q, X)` (padding past
    each row's count) or each row's last new token `(B, X)`. `values` is `(N, X)` packed
    row-major over the real new tokens, or `(B, T_q, X)` with padding."""
    t_q = int(counts.max())
    if packed:
        if all_positions:
            return _pad_rows(values, counts, t_q)
        return values if t_q == 1 else values[torch.from_numpy(np.cumsum(counts) - 1)]
    if all_positions:
        return values
    return values[torch.arange(len(counts)), torch.from_numpy(counts - 1)]
