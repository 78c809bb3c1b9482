"""Native PyTorch implementation of the Llama family (Llama, SmolLM2, Mistral, Qwen2).

Per layer (Touvron et al. 2023): h = x + Attn(RMSNorm(x)); out = h + SwiGLU(RMSNorm(h)), with
RoPE (Su et al. 2021) on q and k, grouped-query attention (Ainslie et al. 2023), optional q/k/v
bias (Qwen2), tied or untied LM head. Q·K·V and gate·up run as one fused matmul each.

The code is plain tensor functions over weight objects (no nn.Module) so the per-token path is
a short list of kernels: per layer 2 norms, 4 matmuls, RoPE, cache write/gather, attention.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from metagen.models import checks
from metagen.models.base import ForwardOutput, LanguageModel, LogitsMode
from metagen.models.cache import KVCache
from metagen.models.config import ModelConfig


@dataclass
class LayerWeights:
    attn_norm: torch.Tensor  # (H,)
    qkv: object  # linear: H -> (heads + 2·kv_heads)·D
    o: object  # linear: heads·D -> H
    mlp_norm: torch.Tensor  # (H,)
    gate_up: object  # linear: H -> 2·I
    down: object  # linear: I -> H


def rope_frequencies(config: ModelConfig, freq_factors: torch.Tensor | None = None) -> torch.Tensor:
    """Inverse frequencies θ^(−2i/D), i < D/2, with the checkpoint's scaling. Returns (D/2,).

    Scaling: "linear" divides all frequencies by `factor`; "llama3" (Llama 3.1) divides low
    frequencies by `factor` and interpolates the band between; GGUF's `rope_freqs` tensor gives
    the per-frequency divisors directly.
    """
    dim = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    if freq_factors is not None:
        return (inv_freq / freq_factors.double()).float()
    scaling = config.rope_scaling or {}
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind in (None, "default"):
        pass
    elif kind == "linear":
        inv_freq = inv_freq / scaling["factor"]
    elif kind == "llama3":
        factor = scaling["factor"]
        low, high = scaling.get("low_freq_factor", 1.0), scaling.get("high_freq_factor", 4.0)
        original = scaling["original_max_position_embeddings"]
        wavelength = 2 * math.pi / inv_freq
        smooth = (original / wavelength - low) / (high - low)
        scaled = torch.where(wavelength > original / low, inv_freq / factor, inv_freq)
        middle = (wavelength <= original / low) & (wavelength >= original / high)
        inv_freq = torch.where(middle, (1 - smooth) * inv_freq / factor + smooth * inv_freq, scaled)
    else:
        raise NotImplementedError(f"rope_scaling type {kind!r} is not supported (supported: linear, llama3)")
    return inv_freq.float()


def apply_rope(x: torch.Tensor, rotation: torch.Tensor) -> torch.Tensor:
    """RoPE on interleaved pairs: dims (2i, 2i+1) as one complex number times e^{i·pos·θ_i}.

    x: (B, T, heads, D) float32 (any strides with a unit last stride); rotation: (B, T, 1, D/2)
    complex64. Returns a new (B, T, heads, D) float32 tensor. One complex multiply.
    """
    pairs = torch.view_as_complex(x.unflatten(-1, (-1, 2)))
    return torch.view_as_real(pairs * rotation).flatten(-2)


# rows × cached keys up to which the fused attention reads the cache in place (beyond: SDPA over
# gathered K/V). In place wins at every size measured (int4, 2 threads, ms per decode step):
# 16 rows × 220 keys 46 vs 53, 16 × 1000 95 vs 168, 4 × 1000 31 vs 39; rows forked from one
# prompt read the same prefix slots, which stay in cache, while the gather copies them per row.
FUSED_ATTENTION_MAX_KEYS = 1 << 22
# Calls appending at most this many tokens per row (decode steps, speculative verification) run
# through the fused kernels, each new token as its own query "row" attending to its row's cache
# up to its own position; longer appends (prefill) use SDPA over gathered K/V.
FUSED_MAX_NEW_TOKENS = 16


class LlamaModel(LanguageModel):
    """Llama-family decoder over a paged `KVCache`.

    `dtype` names the weight format ("fp32", "bf16", "int8", "int4"). Matmul inputs are cast to
    the matmul dtype (fp32 for "fp32", bf16 otherwise); the residual stream, norms, RoPE,
    attention and the KV cache stay float32 (torch's CPU attention is several times slower in
    bf16, and the casts cost less than that). Logits are float32.
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
    ) -> None:
        self.config = config
        self.layers = layers
        self.embed = embed  # (V, H) in the activation dtype
        self.norm = norm
        self.lm_head = lm_head
        self.tokenizer = tokenizer
        self.dtype = dtype
        self.source = source
        self.name = config.name
        self.matmul_dtype = torch.float32 if dtype == "fp32" else torch.bfloat16
        self.freq_factors = freq_factors
        self._rope_cache_length = 0
        self._rotation = torch.zeros(0, dtype=torch.complex64)
        self._cos = self._sin = torch.zeros(0)
        self._ensure_rope(min(config.max_position_embeddings, 4096))
        from metagen.models.kernels import fused_kernels

        # Decode steps (one new token per row) run through fused CPU kernels when they build;
        # `use_fused = False` forces the pure-PyTorch path (same results, tested).
        self.kernels = fused_kernels()
        self.use_fused = self.kernels is not None

    # ------------------------------------------------------------ interface
    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    @property
    def max_context(self) -> int:
        return self.config.max_position_embeddings

    def new_cache(self, batch_size: int = 1, capacity: int = 1024) -> KVCache:
        cache = KVCache(
            self.config.num_hidden_layers,
            self.config.num_key_value_heads,
            self.config.head_dim,
            torch.float32,
            self.max_context,
            checks.bounded("capacity", capacity, 1),
        )
        cache.reset(batch_size)
        return cache

    def flops_per_token(self, context_length: int) -> float:
        return self.config.flops_per_token(context_length)

    @property
    def num_parameters(self) -> int:
        return self.config.num_parameters

    # -------------------------------------------------------------- forward
    @torch.no_grad()
    def forward(
        self,
        cache: KVCache,
        tokens: Sequence[Sequence[int]] | torch.Tensor,
        *,
        logits: LogitsMode = "last",
        hidden: bool = False,
    ) -> ForwardOutput:
        ids, counts = self._pack(tokens, cache.batch_size)
        slots, table, positions = cache.allocate(counts)
        batch, t_q = ids.shape
        self._ensure_rope(int(positions.max()) + 1)  # padding queries may run past t_kv
        if t_q <= FUSED_MAX_NEW_TOKENS and self.use_fused:
            return self._decode_fused(cache, ids, counts, slots, table, positions, logits, hidden)
        t_kv = table.shape[1]
        config = self.config
        heads, kv_heads, head_dim = config.num_attention_heads, config.num_key_value_heads, config.head_dim

        ragged = bool((counts != t_q).any())
        if ragged:  # flat indices of real (non-padding) new tokens, row-major like `slots`
            valid = torch.from_numpy((np.arange(t_q)[None, :] < counts[:, None]).reshape(-1))
            valid_index = valid.nonzero().squeeze(1)
        # Every query sees keys up to its own position; rows of equal length decoding one
        # token each need no mask at all.
        if t_q == 1 and bool((positions[:, 0] == positions[0, 0]).all()):
            mask = None
        else:
            mask = (torch.arange(t_kv)[None, None, :] <= positions[:, :, None]).unsqueeze(1)  # (B, 1, Tq, Tkv)
        rotation = self._rotation[positions].unsqueeze(2)  # (B, Tq, 1, D/2) complex
        q_width = heads * head_dim
        qk_width = (heads + kv_heads) * head_dim
        eps = config.rms_norm_eps
        width = (config.hidden_size,)
        mm_dtype = self.matmul_dtype
        flat_table = table.reshape(-1)

        x = self.embed[ids].float()  # (B, Tq, H) residual stream, float32
        for index, layer in enumerate(self.layers):
            h = F.rms_norm(x, width, layer.attn_norm, eps)
            qkv = layer.qkv(h.to(mm_dtype)).float()  # (B, Tq, (heads + 2·kv_heads)·D)
            qk = apply_rope(qkv[..., :qk_width].unflatten(-1, (heads + kv_heads, head_dim)), rotation)
            v = qkv[..., qk_width:].unflatten(-1, (kv_heads, head_dim))
            kv_new = torch.stack((qk[:, :, heads:], v), dim=2).view(batch * t_q, 2, kv_heads, head_dim)
            if ragged:
                kv_new = kv_new[valid_index]
            cache.write(index, slots, kv_new)
            kv = cache.pools[index].index_select(0, flat_table).view(batch, t_kv, 2, kv_heads, head_dim)
            q = qk[:, :, :heads].transpose(1, 2)  # (B, heads, Tq, D)
            keys, values = kv[:, :, 0].transpose(1, 2), kv[:, :, 1].transpose(1, 2)  # (B, KVH, Tkv, D)
            attn = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=True)
            x = x + layer.o(attn.transpose(1, 2).reshape(batch, t_q, q_width).to(mm_dtype))
            h = F.rms_norm(x, width, layer.mlp_norm, eps).to(mm_dtype)
            gate, up = layer.gate_up(h).chunk(2, dim=-1)
            x = x + layer.down(F.silu(gate) * up)

        if logits == "none" and not hidden:
            return ForwardOutput(None, None, counts.tolist())
        if logits == "last" or (logits == "none" and hidden):
            x = x[torch.arange(batch), torch.from_numpy(counts - 1)]  # (B, H)
        final = F.rms_norm(x, width, self.norm, eps)
        out_logits = None if logits == "none" else self.lm_head(final.to(mm_dtype)).float()
        # One reduction instead of an elementwise mask: NaN/inf anywhere makes the row sum non-finite.
        if out_logits is not None and not torch.isfinite(out_logits.sum(dim=-1)).all():
            raise FloatingPointError("the model produced NaN or infinite logits")
        return ForwardOutput(out_logits, final if hidden else None, counts.tolist())

    def _decode_fused(self, cache, ids, counts, slots, table, positions, logits: LogitsMode, hidden: bool) -> ForwardOutput:
        """A few new tokens per row through the fused kernels (metagen/models/kernels/fused.cpp).

        Every new token is one query: token j of row b reads row b's page table up to its own
        position (the new tokens' keys are stored before attention runs, layer by layer), which
        is causal attention without a mask. Same math as the general path: per layer
        add+RMSNorm, QKV, RoPE + cache store (fused), attention (read in place; SDPA beyond
        FUSED_ATTENTION_MAX_KEYS), O, add+RMSNorm (fused), gate·up, SiLU·up, down.
        """
        kernels, config = self.kernels, self.config
        heads, kv_heads, head_dim = config.num_attention_heads, config.num_key_value_heads, config.head_dim
        batch, t_q = ids.shape
        if t_q > 1:  # one query per real new token, row-major like `slots`
            valid = torch.from_numpy((np.arange(t_q)[None, :] < counts[:, None]).reshape(-1))
            ids = ids.reshape(-1)[valid]
            positions = positions.reshape(-1)[valid]
            owner = torch.from_numpy(np.repeat(np.arange(batch), counts))
            table = table[owner]
        queries = ids.numel()
        bf16 = self.matmul_dtype == torch.bfloat16
        eps = config.rms_norm_eps
        scale = head_dim**-0.5
        positions = positions.reshape(-1)
        lengths = positions + 1
        # Attention reads the cache in place (see FUSED_ATTENTION_MAX_KEYS).
        in_place = queries * table.shape[1] <= FUSED_ATTENTION_MAX_KEYS
        if not in_place:
            flat_table = table.reshape(-1)
            t_kv = table.shape[1]
            mask = None if bool((lengths == lengths[0]).all()) else (
                torch.arange(t_kv)[None, :] < lengths[:, None])[:, None, None, :]  # (N, 1, 1, Tkv)
        x = self.embed[ids.reshape(-1)].float()  # (N, H) residual stream, float32
        h = kernels.add_rms_norm(x, None, self.layers[0].attn_norm, eps, bf16)
        last = len(self.layers) - 1
        for index, layer in enumerate(self.layers):
            pool = cache.pools[index]
            q = kernels.rope_store(layer.qkv(h), self._cos, self._sin, positions, slots, pool, heads, kv_heads)
            if in_place:
                attn = kernels.paged_decode_attention(q, pool, table, lengths, scale, bf16)  # (N, heads·D)
            else:
                kv = pool.index_select(0, flat_table).view(queries, t_kv, 2, kv_heads, head_dim)
                attn = F.scaled_dot_product_attention(
                    q[:, :, None], kv[:, :, 0].transpose(1, 2), kv[:, :, 1].transpose(1, 2), attn_mask=mask, enable_gqa=True
                ).view(queries, heads * head_dim).to(self.matmul_dtype)
            h = kernels.add_rms_norm(x, layer.o(attn), layer.mlp_norm, eps, bf16)
            gate, up = layer.gate_up(h).chunk(2, dim=-1)
            down = layer.down(F.silu(gate) * up)
            next_norm = self.norm if index == last else self.layers[index + 1].attn_norm
            h = kernels.add_rms_norm(x, down, next_norm, eps, bf16)  # the last one is the final norm
        num_new = counts.tolist()
        if logits == "none" and not hidden:
            return ForwardOutput(None, None, num_new)
        if logits != "all" and t_q > 1:  # each row's last new token only
            ends = torch.from_numpy(np.cumsum(counts) - 1)
            x, h = x[ends], h[ends]
        final = F.rms_norm(x, (config.hidden_size,), self.norm, eps) if hidden else None
        out_logits = None if logits == "none" else self.lm_head(h).float()
        if out_logits is not None and not torch.isfinite(out_logits.sum(dim=-1)).all():
            raise FloatingPointError("the model produced NaN or infinite logits")
        if logits == "all":
            out_logits = _pad_rows(out_logits, counts, t_q)
            final = None if final is None else _pad_rows(final, counts, t_q)
        return ForwardOutput(out_logits, final, num_new)

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

    def _ensure_rope(self, length: int) -> None:
        if length <= self._rope_cache_length:
            return
        length = max(length, 2 * self._rope_cache_length)
        inv_freq = rope_frequencies(self.config, self.freq_factors)
        angles = torch.outer(torch.arange(length, dtype=torch.float64), inv_freq.double())
        self._rotation = torch.polar(torch.ones_like(angles), angles).to(torch.complex64)  # (T, D/2)
        self._cos = self._rotation.real.contiguous()  # (T, D/2) float32, for the fused kernels
        self._sin = self._rotation.imag.contiguous()
        self._rope_cache_length = length


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
