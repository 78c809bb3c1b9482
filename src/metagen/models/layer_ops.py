"""How a decoder layer's attention and residual add + norm run (`layer.Ops`): two paths.

- `GeneralOps` (prefill, layer-by-layer calibration): x is (B, T_q, H) with padding; K/V
  gathered through the page tables, SDPA under a causal (and window) mask.
- `FusedOps` (decode steps, speculative verification): x is (N, H), one query per real new
  token; RoPE + cache store, attention reading the cache in place and add + norm run as the
  fused CPU kernels of `models/kernels/fused.cpp`, writing into the step's reused buffers
  (`models/step_buffers.py`).

Both read the model's RoPE tables (`rope.RopeTables`), its per-layer windows and local-RoPE
flags, and return the same values (tests compare them).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from metagen.models.cache import KVCache
from metagen.models.layer import apply_rope
from metagen.models.shared_prefix import SharedPrefixPlan


def _activate(gate: torch.Tensor, activation: str) -> torch.Tensor:
    """The MLP gate's activation, in place: SiLU (SwiGLU) or GELU's tanh approximation (GeGLU,
    config "gelu_pytorch_tanh")."""
    if activation == "silu":
        return F.silu(gate, inplace=True)
    return torch.ops.aten.gelu_.default(gate, approximate="tanh")


class GeneralOps:
    """Attention and add + norm of the general path: x is (B, T_q, H) with padding; new K/V
    are written to the cache, every row's K/V gathered through its page table, SDPA with a
    causal mask over positions (none when every row decodes one token at the same length).
    A windowed layer gathers only the columns from the oldest key any query sees and masks
    keys older than q − W + 1 (padding queries keep the plain causal mask, so no row is empty).
    With a `tree` (a `token_tree.TreeLayout`; its positions given as `positions`) the mask is
    its column mask and a window compares key positions, not columns."""

    def __init__(self, model, cache: KVCache, counts: np.ndarray, slots, table, positions, tree=None) -> None:
        config = model.config
        batch, t_q = positions.shape
        self.cache, self.slots, self.table = cache, slots, table
        self.heads, self.kv_heads, self.head_dim = config.num_attention_heads, config.num_key_value_heads, config.head_dim
        self.matmul_dtype, self.eps, self.width = model.matmul_dtype, config.rms_norm_eps, (config.hidden_size,)
        self.scale = None if config.query_pre_attn_scalar is None else config.attention_scale
        self.layer_windows, self.local_rope = model.layer_windows, model.local_rope
        self.positions, self.counts, self.tree = positions, counts, tree
        self.windowed: dict[int, tuple[torch.Tensor, torch.Tensor | None]] = {}  # window -> (table, mask)
        self.valid_index = None
        if bool((counts != t_q).any()):  # flat indices of real (non-padding) new tokens, row-major like `slots`
            valid = torch.from_numpy((np.arange(t_q)[None, :] < counts[:, None]).reshape(-1))
            self.valid_index = valid.nonzero().squeeze(1)
        # Every query sees keys up to its own position; rows of equal length decoding one
        # token each need no mask at all.
        if tree is not None:
            self.mask = tree.column_mask(table.shape[1])  # (B, 1, Tq, Tkv)
        elif t_q == 1 and bool((positions[:, 0] == positions[0, 0]).all()):
            self.mask = None
        else:
            t_kv = table.shape[1]
            self.mask = (torch.arange(t_kv)[None, None, :] <= positions[:, :, None]).unsqueeze(1)  # (B, 1, Tq, Tkv)
        self.rotation = model.rope.rotation[positions].unsqueeze(2)  # (B, Tq, 1, D/2) complex
        self.local_rotation = self.rotation
        if any(model.local_rope):
            self.local_rotation = model.rope.local_rotation[positions].unsqueeze(2)

    def _window(self, window: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(table columns lo.., mask (B, 1, Tq, Tkv − lo)) of a layer with this window, where lo
        is the oldest position any real query sees; the unwindowed pair when every key is in."""
        if window not in self.windowed:
            positions = self.positions
            t_kv = self.table.shape[1]
            if int(positions.max()) - window + 1 <= 0:
                self.windowed[window] = (self.table, self.mask)
                return self.windowed[window]
            lo = max(0, int(positions[:, 0].min()) - window + 1)
            keys = torch.arange(lo, t_kv)[None, None, :]
            ends = torch.from_numpy(self.counts) + positions[:, 0]  # (B,) each row's length
            padding = (positions >= ends[:, None])[:, :, None]  # (B, Tq, 1)
            if self.tree is None:
                inside = (keys > positions[:, :, None] - window) | padding
                mask = ((keys <= positions[:, :, None]) & inside).unsqueeze(1)
            else:  # a tree's keys sit at L + depth, not at their column
                keys = self.tree.key_positions(t_kv)[:, None, lo:]  # (B, 1, Tkv − lo)
                inside = (keys > positions[:, :, None] - window) | padding
                mask = self.mask[..., lo:] & inside.unsqueeze(1)
            self.windowed[window] = (self.table[:, lo:], mask)
        return self.windowed[window]

    def attend(self, index: int, qkv: torch.Tensor) -> torch.Tensor:
        """qkv (B, Tq, (heads + 2·kv_heads)·D) -> attention output (B, Tq, heads·D), matmul dtype."""
        heads, kv_heads, head_dim = self.heads, self.kv_heads, self.head_dim
        batch, t_q, _ = qkv.shape
        qkv = qkv.float()
        rotation = self.local_rotation if self.local_rope[index] else self.rotation
        qk = apply_rope(qkv[..., : (heads + kv_heads) * head_dim].unflatten(-1, (heads + kv_heads, head_dim)), rotation)
        v = qkv[..., (heads + kv_heads) * head_dim :].unflatten(-1, (kv_heads, head_dim))
        kv_new = torch.stack((qk[:, :, heads:], v), dim=2).view(batch * t_q, 2, kv_heads, head_dim)
        if self.valid_index is not None:
            kv_new = kv_new[self.valid_index]
        self.cache.write(index, self.slots, kv_new)
        window = self.layer_windows[index]
        table, mask = (self.table, self.mask) if window is None else self._window(window)
        kv = self.cache.read(index, table)  # (B, Tkv, 2, KVH, D)
        q = qk[:, :, :heads].transpose(1, 2)  # (B, heads, Tq, D)
        keys, values = kv[:, :, 0].transpose(1, 2), kv[:, :, 1].transpose(1, 2)  # (B, KVH, Tkv, D)
        attn = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=True, scale=self.scale)
        return attn.transpose(1, 2).reshape(batch, t_q, heads * head_dim).to(self.matmul_dtype)

    def add_norm(self, x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor):
        if delta is not None:
            x = x + delta
        return x, F.rms_norm(x, self.width, weight, self.eps).to(self.matmul_dtype)

    def gated(self, gate_up: torch.Tensor, activation: str) -> torch.Tensor:
        """act(gate) ⊙ up, in place in gate_up's gate half (returned as a view)."""
        width = gate_up.shape[-1] // 2
        return _activate(gate_up[..., :width], activation).mul_(gate_up[..., width:])

    def buffer(self, name: str, linear) -> None:
        return None  # fresh tensors: a prefill runs once per prompt


class FusedOps:
    """Attention and add + norm through the fused kernels (metagen/models/kernels/fused.cpp).

    Every real new token is one query (x is packed (N, H), row-major): token j of row b reads
    row b's page table up to its own position (the new tokens' keys are stored before attention
    runs, layer by layer), which is causal attention without a mask. Per layer: RoPE + cache
    store (one kernel), attention reading the cache in place (SDPA over gathered K/V beyond
    `max_keys`), residual add + next RMSNorm + cast (one kernel). A windowed
    layer's query at position p reads its page table from p − W + 1 on. Rows sharing a cached
    prefix read it once per group (`shared_prefix.SharedPrefixPlan`, when `use_shared_prefix`).
    With a `tree` (a `token_tree.TreeLayout`; its positions given as `positions`) each query of
    a tree row gets its own page table (cached entries, its ancestors', its own; `query_tables`),
    read by the same kernels: no mask, and the kernels are unchanged.
    """

    def __init__(self, model, cache: KVCache, counts: np.ndarray, slots, table, positions, max_keys: int,
                 tree=None) -> None:
        config = model.config
        batch, t_q = positions.shape
        self.kernels, self.cache, self.slots = model.kernels, cache, slots
        self.heads, self.kv_heads, self.head_dim = config.num_attention_heads, config.num_key_value_heads, config.head_dim
        self.cos, self.sin = model.rope.cos, model.rope.sin
        self.bf16, self.eps, self.matmul_dtype = model.matmul_dtype == torch.bfloat16, config.rms_norm_eps, model.matmul_dtype
        self.scale = config.attention_scale
        self.layer_windows, self.local_rope = model.layer_windows, model.local_rope
        self.local_cos, self.local_sin = model.rope.local_cos, model.rope.local_sin
        self.width = config.hidden_size
        self.windowed: dict[int, tuple[torch.Tensor | None, torch.Tensor | None]] = {}  # window -> (starts, mask)
        # Groups of rows sharing a cached prefix, attended as prefix + suffixes (None: row by row).
        self.shared = None
        if model.use_shared_prefix and self.head_dim in (64, 128, 256):
            self.shared = SharedPrefixPlan.of_step(table, positions, counts)
        self.valid = None
        if t_q > 1:  # one query per real new token, row-major like `slots`
            self.valid = torch.from_numpy((np.arange(t_q)[None, :] < counts[:, None]).reshape(-1))
            positions = positions.reshape(-1)[self.valid]
            rows_table = table
            table = table[torch.from_numpy(np.repeat(np.arange(batch), counts))]
            if tree is not None:
                tree.query_tables(rows_table, table, counts)
        self.positions = positions.reshape(-1)
        self.lengths = self.positions + 1
        self.table = table
        self.queries = self.positions.numel()
        self.buffers = model.step_buffers.get(self.queries)
        # Resolved once per step, not per layer: every layer of a family has the same shapes (a
        # linear of another width, or an MoE layer's shared expert, falls back to `buffers.get`).
        n, get, matmul = self.queries, self.buffers.get, self.matmul_dtype
        self.q_out = get("q", (n, self.heads, self.head_dim), torch.float32)
        self.attention_out = get("attention", (n, self.heads * self.head_dim), matmul)
        self.h_out = get("h", (n, self.width), matmul)
        first = model.layers[0]
        self.outputs = {name: get(name, (n, linear.out_features), matmul)
                        for name in ("qkv", "o", "gate_up", "down") if (linear := getattr(first, name)) is not None}
        gate_up = self.outputs.get("gate_up")
        self.gated_out = None if gate_up is None else get("gated", (n, gate_up.shape[1] // 2), matmul)
        # Attention reads the cache in place up to `max_keys` rows × keys (decoder.FUSED_ATTENTION_MAX_KEYS).
        self.in_place = self.queries * table.shape[1] <= max_keys
        if not self.in_place:
            t_kv = table.shape[1]
            lengths = self.lengths
            self.mask = None if bool((lengths == lengths[0]).all()) else (
                torch.arange(t_kv)[None, :] < lengths[:, None])[:, None, None, :]  # (N, 1, 1, Tkv)

    def _window(self, window: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """(starts (N,) of each query's first visible key or None when all are 0, the SDPA mask
        (N, 1, 1, Tkv) when attention does not run in place)."""
        if window not in self.windowed:
            starts = (self.lengths - window).clamp_min(0)
            if not bool(starts.any()):
                self.windowed[window] = (None, None if self.in_place else self.mask)
            else:
                mask = None
                if not self.in_place:
                    keys = torch.arange(self.table.shape[1])[None, :]
                    mask = ((keys < self.lengths[:, None]) & (keys >= starts[:, None]))[:, None, None, :]
                self.windowed[window] = (starts, mask)
        return self.windowed[window]

    def ids(self, ids: torch.Tensor) -> torch.Tensor:
        """(B, T_q) padded ids -> (N,) ids of the real new tokens."""
        return ids.reshape(-1) if self.valid is None else ids.reshape(-1)[self.valid]

    def attend(self, index: int, qkv: torch.Tensor) -> torch.Tensor:
        """qkv (N, (heads + 2·kv_heads)·D) -> attention output (N, heads·D), matmul dtype."""
        pool, scales = self.cache.pools[index], self.cache.layer_scales(index)  # scales: int8 pools only
        cos, sin = (self.local_cos, self.local_sin) if self.local_rope[index] else (self.cos, self.sin)
        q = self.kernels.rope_store(qkv, cos, sin, self.positions, self.slots, pool, self.heads, self.kv_heads, scales,
                                    self.q_out)
        window = self.layer_windows[index]
        starts, mask = (None, None if self.in_place else self.mask) if window is None else self._window(window)
        if self.in_place:
            out = self.attention_out
            if self.shared is not None and starts is None:  # a window that cuts in attends row by row
                return self.shared.attend(self.kernels, q, pool, self.table, self.lengths, self.scale, self.bf16,
                                          scales, self.buffers, out)
            return self.kernels.paged_decode_attention(q, pool, self.table, self.lengths, self.scale, self.bf16, starts,
                                                       scales, out)
        kv = self.cache.read(index, self.table)  # (N, Tkv, 2, KVH, D) float32
        attn = F.scaled_dot_product_attention(q[:, :, None], kv[:, :, 0].transpose(1, 2), kv[:, :, 1].transpose(1, 2),
                                              attn_mask=mask, enable_gqa=True, scale=self.scale)
        return attn.view(self.queries, self.heads * self.head_dim).to(self.matmul_dtype)

    def add_norm(self, x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor):
        return x, self.kernels.add_rms_norm(x, delta, weight, self.eps, self.bf16, self.h_out)  # x += delta in place

    def gated(self, gate_up: torch.Tensor, activation: str) -> torch.Tensor:
        """act(gate) ⊙ up into a contiguous buffer (the gate half activated in place)."""
        width = gate_up.shape[-1] // 2
        out = self.gated_out
        if out is None or out.shape[1] != width:
            out = self.buffers.get("gated", (self.queries, width), self.matmul_dtype)
        return torch.mul(_activate(gate_up[:, :width], activation), gate_up[:, width:], out=out)

    def buffer(self, name: str, linear) -> torch.Tensor:
        out = self.outputs.get(name)
        if out is None or out.shape[1] != linear.out_features:
            return self.buffers.get(name, (self.queries, linear.out_features), self.matmul_dtype)
        return out
