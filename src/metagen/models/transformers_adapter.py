"""`TransformersModel`: any transformers causal LM behind metagen's `LanguageModel` interface.

For architectures the native backend does not implement. Each cache row keeps its own
transformers `DynamicCache`; `forward` runs the rows one after another (batch 1 each), fork
copies the row's cache, truncate crops it. Every token-level algorithm runs unchanged, only
slower than on the native backend (no batching across rows, copies on fork).
Needs the optional extra: `pip install metagen[transformers]`.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch

from metagen.models import checks
from metagen.models.base import ForwardOutput, LanguageModel, LogitsMode


class _Row:
    __slots__ = ("length", "past")

    def __init__(self, length: int = 0, past=None) -> None:
        self.length = length
        self.past = past


class TransformersSnapshot(_Row):
    """A copy of a row kept outside the batch; restored only by the cache that made it (`owner`)."""

    __slots__ = ("owner", "released")

    def __init__(self, length: int, past, owner: TransformersCache) -> None:
        super().__init__(length, past)
        self.owner = owner
        self.released = False


class TransformersCache:
    """Rows of per-sequence transformers caches with the `KVCache` row operations (and its
    argument checks: ints in range, snapshots only from this cache)."""

    def __init__(self, batch_size: int) -> None:
        self.rows = [_Row() for _ in range(checks.bounded("batch_size", batch_size, 0))]

    @property
    def batch_size(self) -> int:
        return len(self.rows)

    @property
    def lengths(self) -> list[int]:
        return [row.length for row in self.rows]

    def select(self, indices: Sequence[int]) -> None:
        used: set[int] = set()
        rows = []
        for index in checks.rows("indices", indices, self.batch_size).tolist():
            source = self.rows[index]
            if index in used:  # a second user of the same row needs its own copy
                source = _Row(source.length, copy.deepcopy(source.past))
            used.add(index)
            rows.append(source)
        self.rows = rows

    def fork(self, row: int, n: int) -> list[int]:
        row = checks.row("row", row, self.batch_size)
        n = checks.bounded("n", n, 0)
        first = self.batch_size
        self.select(list(range(first)) + [row] * n)
        return list(range(first, first + n))

    def truncate(self, row: int, length: int) -> None:
        entry = self.rows[checks.row("row", row, self.batch_size)]
        length = checks.bounded("length", length, 0, entry.length)
        if entry.past is not None and length < entry.length:
            entry.past.crop(length - entry.length)  # negative: tokens to remove
        entry.length = length

    def snapshot(self, row: int) -> TransformersSnapshot:
        """A copy of `row` kept outside the batch (transformers caches are copied, not shared)."""
        entry = self.rows[checks.row("row", row, self.batch_size)]
        return TransformersSnapshot(entry.length, copy.deepcopy(entry.past), self)

    def restore(self, snapshots: Sequence[TransformersSnapshot]) -> None:
        snapshots = checks.snapshot_list("snapshots", snapshots, self, TransformersSnapshot)
        self.rows = [_Row(s.length, copy.deepcopy(s.past)) for s in snapshots]

    def release(self, snapshot: TransformersSnapshot) -> None:
        checks.snapshot("snapshot", snapshot, self, TransformersSnapshot)
        snapshot.past, snapshot.released = None, True


class TransformersModel(LanguageModel):
    """Wrap a transformers causal LM (`AutoModelForCausalLM`) and a metagen `Tokenizer`."""

    def __init__(self, hf_model, tokenizer, name: str = "") -> None:
        self.hf_model = hf_model.eval()
        self.tokenizer = tokenizer
        self.name = name or getattr(hf_model.config, "name_or_path", "transformers")
        self.config = hf_model.config
        self.dtype = str(next(hf_model.parameters()).dtype).replace("torch.", "")

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
        params = sum(p.numel() for p in self.hf_model.parameters())
        return 2.0 * params

    @torch.inference_mode()
    def forward(
        self,
        cache: TransformersCache,
        tokens: Sequence[Sequence[int]] | torch.Tensor,
        *,
        logits: LogitsMode = "last",
        hidden: bool = False,
    ) -> ForwardOutput:
        from transformers import DynamicCache

        rows = tokens.tolist() if isinstance(tokens, torch.Tensor) else [list(r) for r in tokens]
        if len(rows) != cache.batch_size:
            raise ValueError(f"got tokens for {len(rows)} rows but the cache has {cache.batch_size} rows")
        outputs_logits, outputs_hidden = [], []
        for index, (row, ids) in enumerate(zip(cache.rows, rows)):
            if not ids:
                raise ValueError(f"row {index} has no new tokens; every row needs at least one")
            if row.length + len(ids) > self.max_context:
                raise ValueError(f"row {index} would exceed the model's context of {self.max_context}")
            if row.past is None:
                row.past = DynamicCache()
            positions = torch.arange(row.length, row.length + len(ids))[None]
            out = self.hf_model(
                input_ids=torch.tensor([ids]),
                past_key_values=row.past,
                position_ids=positions,
                use_cache=True,
                output_hidden_states=hidden,
            )
            row.past = out.past_key_values
            row.length += len(ids)
            step_logits = out.logits[0].float()  # (T, V)
            step_hidden = out.hidden_states[-1][0].float() if hidden else None
            if logits == "all":
                outputs_logits.append(step_logits)
                outputs_hidden.append(step_hidden)
            else:
                outputs_logits.append(step_logits[-1])
                outputs_hidden.append(None if step_hidden is None else step_hidden[-1])
        counts = [len(ids) for ids in rows]
        if logits == "all":
            width = max(counts)
            pad = lambda ts: torch.stack([torch.nn.functional.pad(t, (0, 0, 0, width - t.shape[0])) for t in ts])  # noqa: E731
            out_logits = pad(outputs_logits)
            out_hidden = pad(outputs_hidden) if hidden else None
        else:
            out_logits = torch.stack(outputs_logits)
            out_hidden = torch.stack(outputs_hidden) if hidden else None
        if not torch.isfinite(out_logits).all():
            raise FloatingPointError("the model produced NaN or infinite logits")
        return ForwardOutput(None if logits == "none" else out_logits, out_hidden, counts)
