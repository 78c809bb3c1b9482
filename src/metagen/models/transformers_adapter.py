"""`TransformersModel`: any transformers causal LM behind metagen's `LanguageModel` interface.

For architectures the native backend does not implement. All rows live in one transformers
`DynamicCache` of keys and values `(B, H, W, D)` per layer plus a column map `valid (B, W)`
saying which columns hold a token of the row. A forward appends the same T = max new tokens
columns to every row — row b's n_b new tokens right-aligned, the T − n_b columns before them
padding — and runs all rows in one call with

- position ids = each token's position in its own row (padding queries repeat the row's first
  new position, so they attend to something and never produce NaN);
- a 4-D additive mask built from positions, not columns: query (b, t) attends to column k iff
  valid[b, k] and pos[b, k] ≤ qpos[b, t] (and qpos − pos < window on sliding-window layers),
  where pos = cumsum(valid) − 1 is each column's rank among the row's tokens.

Because the mask goes by positions, a row's tokens need not be contiguous: truncate clears
`valid` past the kept length (no copy), fork / select / reorder index the batch dimension
(copies K/V: transformers has no shared pages), snapshot copies a row's valid columns out and
restore builds a left-aligned cache from snapshots. Holes left by ragged appends and truncations
are compacted (one gather per layer) once they exceed max(16, a quarter of the longest row). Per step the
cost is that of transformers' own batched decode over W = longest row + holes columns.
Parity with the native backend on the embedded model (fp32: ragged prefill, decode steps,
truncate, fork, multi-token appends, snapshot / restore, compaction) is tested to 2e-4 in the
logits; sampling, beam search and speculative decoding run on it unchanged. Attention kinds a
position mask cannot express (chunked, linear) are refused by name. A token tree
(`forward(..., tree=)`, `models/token_tree.py`) moves its tokens to positions L + depth and lets
each see only its ancestors among the new columns; `keep_path` keeps one path by making the
other columns holes.
Needs the `transformers` extra (`pip install -e '.[transformers]'` in a checkout).
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence

import numpy as np
import torch

from metagen.models import checks
from metagen.models.base import Cache, ForwardOutput, LanguageModel, LogitsMode
from metagen.models.cache import token_bytes
from metagen.models.decoder import _check_integer_ids, _row_ids
from metagen.models.token_tree import ancestors, check_trees

_MIN_HOLES_BEFORE_COMPACTION = 16


class TransformersSnapshot:
    """A copy of a row kept outside the batch: `keys`, `values` per layer `(H, length, D)`;
    restored only by the cache that made it (`owner`)."""

    __slots__ = ("keys", "length", "owner", "released", "values")

    def __init__(self, length: int, keys: list[torch.Tensor], values: list[torch.Tensor], owner: TransformersCache) -> None:
        self.length = length
        self.keys, self.values = keys, values
        self.owner = owner
        self.released = False


class TransformersCache(Cache):
    """Rows of one batched transformers `DynamicCache` with the `KVCache` row operations (and its
    argument checks: ints in range, snapshots only from this cache).

    Shapes: per layer keys and values `(B, H, W, D)`; `valid (B, W)` bool; lengths `(B,)`.
    """

    def __init__(self, batch_size: int) -> None:
        self.reset(batch_size)

    def reset(self, batch_size: int = 1) -> None:
        """Drop every row: `batch_size` (an int >= 0) empty rows and no keys or values."""
        batch_size = checks.bounded("batch_size", batch_size, 0)
        self.past = None  # transformers DynamicCache, made at the first forward or restore
        self.valid = torch.zeros(batch_size, 0, dtype=torch.bool)  # (B, W)
        self._lengths = np.zeros(batch_size, dtype=np.int64)

    @property
    def batch_size(self) -> int:
        return len(self._lengths)

    @property
    def lengths(self) -> list[int]:
        return self._lengths.tolist()

    def length(self, row: int) -> int:
        return int(self._lengths[checks.row("row", row, self.batch_size)])

    @property
    def width(self) -> int:
        """Columns per row in the key/value tensors (longest row + holes)."""
        return self.valid.shape[1]

    def select(self, indices: Sequence[int]) -> None:
        """Rows become `[rows[i] for i in indices]` (an index of K/V along the batch: a copy)."""
        index = torch.from_numpy(checks.rows("indices", indices, self.batch_size))
        for layer in self._layers():
            layer.keys, layer.values = layer.keys[index], layer.values[index]
        self.valid = self.valid[index]
        self._lengths = self._lengths[index.numpy()]

    def fork(self, row: int, n: int) -> list[int]:
        row = checks.row("row", row, self.batch_size)
        n = checks.bounded("n", n, 0)
        first = self.batch_size
        self.select(list(range(first)) + [row] * n)
        return list(range(first, first + n))

    def truncate(self, row: int, length: int) -> None:
        """Keep the first `length` tokens of `row`: later columns become holes (no copy)."""
        row = checks.row("row", row, self.batch_size)
        length = checks.bounded("length", length, 0, int(self._lengths[row]))
        if length < self._lengths[row]:
            self.valid[row] &= self.valid[row].cumsum(0) <= length
            self._lengths[row] = length

    def keep_path(self, row: int, start: int, kept: Sequence[int]) -> None:
        """`KVCache.keep_path` here: after a tree was fed to `row` at [start, length), keep its
        tokens `kept` (increasing indices, a root-to-node path); the others become holes (no
        copy), so the kept ones rank start, start + 1, ..., the positions their keys were
        rotated for."""
        row = checks.row("row", row, self.batch_size)
        current = int(self._lengths[row])
        start = checks.bounded("start", start, 0, current)
        indices = checks.increasing("kept", kept, current - start)
        columns = self.valid[row].nonzero().squeeze(1)[start:]  # (current − start,) the fed tokens' columns
        dropped = np.delete(np.arange(columns.numel()), indices)
        self.valid[row, columns[torch.from_numpy(dropped)]] = False
        self._lengths[row] = start + indices.size

    def snapshot(self, row: int) -> TransformersSnapshot:
        """A copy of `row`'s keys and values, `(H, length, D)` per layer, outside the batch."""
        row = checks.row("row", row, self.batch_size)
        columns = self.valid[row].nonzero().squeeze(1)  # (length,)
        layers = self._layers()
        keys = [layer.keys[row][:, columns] for layer in layers]
        values = [layer.values[row][:, columns] for layer in layers]
        return TransformersSnapshot(int(self._lengths[row]), keys, values, self)

    def restore(self, snapshots: Sequence[TransformersSnapshot]) -> None:
        """Rows become copies of `snapshots` (in order), left-aligned; the snapshots stay valid."""
        snapshots = checks.snapshot_list("snapshots", snapshots, self, TransformersSnapshot)
        lengths = np.array([s.length for s in snapshots], dtype=np.int64)
        width = int(lengths.max(initial=0))
        self.valid = torch.arange(width)[None, :] < torch.from_numpy(lengths)[:, None]
        self._lengths = lengths
        self.past = None
        full = [s for s in snapshots if s.length]
        if not full:
            return
        from transformers import DynamicCache

        layers = []
        for layer in range(len(full[0].keys)):
            parts = []
            for name in ("keys", "values"):
                heads, _, dim = getattr(full[0], name)[layer].shape
                tensor = getattr(full[0], name)[layer].new_zeros(len(snapshots), heads, width, dim)  # (B, H, W, D)
                for b, snapshot in enumerate(snapshots):
                    if snapshot.length:  # an empty row's snapshot may hold no layers at all
                        tensor[b, :, : snapshot.length] = getattr(snapshot, name)[layer]
                parts.append(tensor)
            layers.append(tuple(parts))
        self.past = DynamicCache(layers)

    def release(self, snapshot: TransformersSnapshot) -> None:
        checks.snapshot("snapshot", snapshot, self, TransformersSnapshot)
        snapshot.keys, snapshot.values, snapshot.released = [], [], True

    # ------------------------------------------------------- used by the model
    def compact(self) -> None:
        """Move every row's tokens to columns [0, length) (one gather per layer) and drop the
        holes. O(B·H·W·D) per layer."""
        width = int(self._lengths.max(initial=0))
        # stable sort puts each row's valid columns first, in their order
        order = torch.sort((~self.valid).to(torch.uint8), dim=1, stable=True).indices[:, :width]  # (B, W')
        for layer in self._layers():
            batch, heads, _, dim = layer.keys.shape
            index = order[:, None, :, None].expand(batch, heads, width, dim)
            layer.keys, layer.values = layer.keys.gather(2, index), layer.values.gather(2, index)
        self.valid = torch.arange(width)[None, :] < torch.from_numpy(self._lengths)[:, None]

    def holes(self) -> int:
        return self.width - int(self._lengths.max(initial=0))

    def _layers(self) -> list:
        if self.past is None:
            return []
        return [layer for layer in self.past.layers if getattr(layer, "is_initialized", True) and layer.keys is not None]


class TransformersModel(LanguageModel):
    """Wrap a transformers causal LM (`AutoModelForCausalLM`) and a metagen `Tokenizer`.

    Attention layer kinds other than full and sliding-window are refused by name (their masks
    would need more than positions).
    """

    def __init__(self, hf_model, tokenizer, name: str = "") -> None:
        self.hf_model = hf_model.eval()
        self.tokenizer = tokenizer
        self.name = name or getattr(hf_model.config, "name_or_path", "transformers")
        self.config = hf_model.config
        self.dtype = str(next(hf_model.parameters()).dtype).replace("torch.", "")
        self._mask_dtype = next(hf_model.parameters()).dtype
        text_config = self.config.get_text_config(decoder=True) if hasattr(self.config, "get_text_config") else self.config
        self._layer_types, self._window = _attention_layout(text_config)
        self._flops_shape = _flops_shape(hf_model, text_config)
        self._kv_shape = _kv_shape(text_config)
        parameters = inspect.signature(hf_model.forward).parameters
        self._cache_argument = "cache" if "cache" in parameters else "past_key_values"
        self._keeps_logits = "logits_to_keep" in parameters

    @classmethod
    def from_pretrained(cls, path: str, gguf_file: str | None = None, dtype: torch.dtype = torch.float32):
        """Load with `AutoModelForCausalLM` from an HF directory (or a directory + GGUF file name)."""
        from pathlib import Path

        from transformers import AutoModelForCausalLM

        from metagen.models.tokenizer import Tokenizer

        kwargs = {"gguf_file": gguf_file} if gguf_file else {}
        hf_model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **kwargs)
        if gguf_file:
            from gguf import GGUFReader

            tokenizer = Tokenizer.from_gguf(GGUFReader(str(Path(path) / gguf_file)))
        else:
            tokenizer = Tokenizer.from_hf_dir(path)
        return cls(hf_model, tokenizer, name=str(gguf_file or path))

    @property
    def vocab_size(self) -> int:
        return int(self.hf_model.config.vocab_size)

    @property
    def max_context(self) -> int:
        return int(getattr(self.hf_model.config, "max_position_embeddings", 2048))

    def new_cache(self, batch_size: int = 1) -> TransformersCache:
        return TransformersCache(batch_size)

    def flops_per_token(self, context_length: int) -> float:
        """2·N + 4·layers·heads·head_dim·context, as the native backend counts
        (`models.flops.transformer_flops_per_token`; N from `_flops_shape`)."""
        from metagen.models.flops import transformer_flops_per_token

        return transformer_flops_per_token(*self._flops_shape, context_length)

    @property
    def kv_bytes_per_token(self) -> int:
        """Counted as a float32 cache of the text config's layers, KV heads and head_dim
        (`_kv_shape`)."""
        return token_bytes(*self._kv_shape, "fp32")

    @torch.no_grad()  # not inference_mode: the cache edits its tensors in place outside forward
    def forward(
        self,
        cache: TransformersCache,
        tokens: Sequence[Sequence[int]] | torch.Tensor,
        *,
        logits: LogitsMode = "last",
        hidden: bool = False,
        tree: Sequence[Sequence[int] | None] | None = None,
    ) -> ForwardOutput:
        """`LanguageModel.forward`. A `tree` row's tokens get positions L + depth and the 4-D
        mask lets each see only its ancestors among them (`_tree_block`); the cache then holds
        them in fed order until `keep_path` keeps one path (or `truncate` drops them)."""
        from transformers import DynamicCache

        ids, counts = self._pack(tokens, cache.batch_size)  # (B, T) right-aligned, (B,)
        trees = check_trees(tree, counts.numpy())
        lengths = torch.from_numpy(cache._lengths)
        end = cache._lengths + counts.numpy()
        if end.max(initial=0) > self.max_context:
            row = int(end.argmax())
            raise ValueError(f"row {row} would hold {int(end[row])} tokens, more than the model's context of {self.max_context}")
        if cache.holes() > max(_MIN_HOLES_BEFORE_COMPACTION, int(cache._lengths.max(initial=0)) // 4):
            cache.compact()
        width = ids.shape[1]
        offset = torch.arange(width)[None, :] - (width - counts)[:, None]  # (B, T): index among the new tokens
        new_valid = offset >= 0
        query_positions = lengths[:, None] + offset.clamp(min=0)  # (B, T)
        valid = torch.cat([cache.valid, new_valid], dim=1)  # (B, W + T)
        key_positions = valid.cumsum(1) - 1
        blocks = [] if trees is None else [_tree_block(b, parents, width, query_positions, key_positions)
                                           for b, parents in enumerate(trees) if parents is not None]
        allowed = valid[:, None, :] & (key_positions[:, None, :] <= query_positions[:, :, None])  # (B, T, W + T)
        for b, rows, ancestor in blocks:  # a tree row's new tokens see their ancestors only
            allowed[b, rows, -rows.numel():] = ancestor
        if cache.past is None:
            cache.past = DynamicCache()
        kwargs = {self._cache_argument: cache.past}
        if logits != "all" and self._keeps_logits:
            kwargs["logits_to_keep"] = 1  # every row's last new token is the last column
        out = self.hf_model(  # extends cache.past in place
            input_ids=ids,
            attention_mask=self._masks(allowed, query_positions, key_positions),
            position_ids=query_positions,
            use_cache=True,
            output_hidden_states=hidden,
            **kwargs,
        )
        cache.valid = valid
        cache._lengths = end
        count_list = counts.tolist()
        if logits == "all":
            # row b's new tokens are the last n_b columns; move them to [0, n_b), zeros after
            source = (torch.arange(width)[None, :] + (width - counts)[:, None]).clamp(max=width - 1)  # (B, T)
            keep = torch.arange(width)[None, :] < counts[:, None]  # (B, T)
            out_logits = _gather_positions(out.logits.float(), source, keep)
            out_hidden = _gather_positions(out.hidden_states[-1].float(), source, keep) if hidden else None
        else:
            out_logits = out.logits[:, -1].float()  # (B, V)
            out_hidden = out.hidden_states[-1][:, -1].float() if hidden else None
        return ForwardOutput(None if logits == "none" else out_logits, out_hidden, count_list)

    def _masks(self, allowed: torch.Tensor, query_positions: torch.Tensor, key_positions: torch.Tensor):
        """Additive 4-D masks `(B, 1, T, W)`: 0 where attended, the dtype's minimum elsewhere; a
        dict by layer kind when the model has sliding-window layers."""
        def additive(attend: torch.Tensor) -> torch.Tensor:
            mask = torch.zeros(attend.shape, dtype=self._mask_dtype)
            return mask.masked_fill_(~attend, torch.finfo(self._mask_dtype).min)[:, None]

        if self._window is None:
            return additive(allowed)
        near = (query_positions[:, :, None] - key_positions[:, None, :]) < self._window
        sliding = additive(allowed & near)
        if self._layer_types is None:  # every layer slides (Mistral)
            return sliding
        return {"full_attention": additive(allowed), "sliding_attention": sliding}

    def _pack(self, tokens, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Token rows -> (ids (B, T) right-aligned, padded on the left with 0, counts (B,)); ids
        must be integers in [0, V)."""
        if isinstance(tokens, torch.Tensor):
            if tokens.dim() != 2:
                raise ValueError(f"tokens must be (batch, length), got shape {tuple(tokens.shape)}")
            _check_integer_ids("tokens", tokens)
            rows = list(tokens.long())
        else:
            rows = [_row_ids(f"tokens[{b}]", row) for b, row in enumerate(tokens)]
        if len(rows) != batch_size:
            raise ValueError(f"got tokens for {len(rows)} rows but the cache has {batch_size} rows")
        counts = torch.tensor([len(row) for row in rows], dtype=torch.long)
        if (counts == 0).any():
            raise ValueError(f"row {int(counts.argmin())} has no new tokens; every row needs at least one")
        width = int(counts.max()) if len(rows) else 0
        ids = torch.zeros(len(rows), width, dtype=torch.long)
        for b, row in enumerate(rows):
            ids[b, width - len(row):] = row
        if ids.numel() and (ids.min() < 0 or ids.max() >= self.vocab_size):
            bad = ids[(ids < 0) | (ids >= self.vocab_size)][0].item()
            raise ValueError(f"token id {bad} is out of range: must be in [0, {self.vocab_size})")
        return ids, counts


def _gather_positions(values: torch.Tensor, source: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """`values (B, T, X)` -> out[b, t] = values[b, source[b, t]] where keep[b, t], else 0."""
    index = source[:, :, None].expand(-1, -1, values.shape[-1])
    return torch.where(keep[:, :, None], values.gather(1, index), 0.0)


def _logical_size(parameter: torch.Tensor) -> int:
    """Elements of the matrix a parameter stands for: a packed quantized parameter (bitsandbytes'
    quant_state) counts its logical shape, not its storage."""
    shape = getattr(getattr(parameter, "quant_state", None), "shape", None)
    return int(np.prod(shape)) if shape is not None else parameter.numel()


def _flops_shape(hf_model, config) -> tuple[int, int, int]:
    """(N, layers, attention width) of `transformer_flops_per_token`: N = every parameter but the
    input embedding table, the LM head counted once whether or not it is tied (as
    `ModelConfig.non_embedding_parameters`; a mixture of experts counts all its experts here,
    transformers exposes no per-token count); width = heads·head_dim."""
    total = sum(_logical_size(p) for p in hf_model.parameters())  # a tied matrix once
    embedding = hf_model.get_input_embeddings().weight
    head = hf_model.get_output_embeddings()
    active = total - _logical_size(embedding)
    if head is not None and head.weight is embedding:
        active += _logical_size(embedding)  # the tied head still multiplies
    return active, int(config.num_hidden_layers), int(config.num_attention_heads) * _head_dim(config)


def _head_dim(config) -> int:
    """The config's head_dim, else hidden_size / heads (what transformers' attention layers
    take when a config names none, as Qwen2's and Phi-3's do)."""
    return int(getattr(config, "head_dim", None) or config.hidden_size // int(config.num_attention_heads))


def _kv_shape(config) -> tuple[int, int, int]:
    """(layers, KV heads, head_dim) of the keys and values transformers caches per token. KV
    heads default to the attention heads (a config without num_key_value_heads, as GPT-2's, has
    no grouped-query attention); head_dim is `_head_dim`'s."""
    heads = int(config.num_attention_heads)
    return int(config.num_hidden_layers), int(getattr(config, "num_key_value_heads", None) or heads), _head_dim(config)


def _tree_block(b: int, parents: np.ndarray, width: int, query_positions: torch.Tensor,
                key_positions: torch.Tensor) -> tuple[int, torch.Tensor, torch.Tensor]:
    """Row b's tree (`token_tree`): its m new tokens (the last m of the `width` columns) move
    to positions L + depth in `query_positions (B, T)` and `key_positions (B, W + T)`, in
    place; returns (b, their query rows (m,), their ancestor mask (m, m))."""
    ancestor = ancestors(parents)
    m = parents.size
    rows = torch.arange(width - m, width)
    depths = torch.from_numpy(ancestor.sum(axis=1) - 1)
    query_positions[b, rows] = query_positions[b, width - m] + depths
    key_positions[b, -m:] = query_positions[b, rows]
    return b, rows, torch.from_numpy(ancestor)


def _attention_layout(config) -> tuple[list[str] | None, int | None]:
    """(layer types, sliding window) of a transformers text config; other attention kinds
    (chunked, linear) are refused by name."""
    layer_types = getattr(config, "layer_types", None)
    window = getattr(config, "sliding_window", None)
    if getattr(config, "use_sliding_window", True) is False:
        window = None
    if layer_types is not None:
        unknown = sorted(set(layer_types) - {"full_attention", "sliding_attention"})
        if unknown:
            raise ValueError(f"layer_types {unknown} are not supported by the transformers adapter "
                             "(it masks full and sliding-window attention only)")
        if "sliding_attention" not in layer_types:
            return None, None
        if window is None:
            raise ValueError("layer_types has sliding_attention layers but the config sets no sliding_window")
        return list(layer_types), int(window)
    return None, None if window is None else int(window)
