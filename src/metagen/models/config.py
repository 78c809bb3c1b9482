"""Architecture description of a decoder checkpoint (any family of `models/families/`)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class ModelConfig:
    """Hyper-parameters of a pre-norm decoder (Llama, SmolLM2, Mistral, Qwen2, Qwen3, Phi-3).

    Attributes mirror HF `config.json` names where one exists.
    """

    architecture: str  # a family of models/families/: "llama" | "mistral" | "qwen2" | "qwen3" | "phi3"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict | None = field(default=None, hash=False)
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # q/k/v projections carry a bias (Qwen2)
    name: str = ""
    qk_norm: bool = False  # per-head RMSNorm of q and k before RoPE (Qwen3)
    sliding_window: int | None = None  # keys older than this are outside attention (Mistral); see context_limit

    def __post_init__(self) -> None:
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}"
            )

    @property
    def context_limit(self) -> int:
        """Longest row the native backend runs exactly: the context, or the sliding window when
        smaller (sliding-window attention equals full attention while every key is in the window)."""
        if self.sliding_window is not None and self.sliding_window < self.max_position_embeddings:
            return self.sliding_window
        return self.max_position_embeddings

    @property
    def num_parameters(self) -> int:
        """Parameter count (embedding counted once when tied)."""
        h, i = self.hidden_size, self.intermediate_size
        q = self.num_attention_heads * self.head_dim
        kv = self.num_key_value_heads * self.head_dim
        per_layer = h * (q + 2 * kv) + q * h + 3 * h * i + 2 * h
        if self.attention_bias:
            per_layer += q + 2 * kv
        if self.qk_norm:
            per_layer += 2 * self.head_dim
        embed = self.vocab_size * h
        head = 0 if self.tie_word_embeddings else self.vocab_size * h
        return embed + head + self.num_hidden_layers * per_layer + h

    def flops_per_token(self, context_length: int) -> float:
        """Forward FLOPs for one token attending to `context_length` keys.

        2·(non-embedding params + LM head) for the matmuls plus 4·layers·heads·head_dim·context
        for attention scores and the weighted sum (Kaplan et al. 2020 accounting).
        """
        matmul_params = self.num_parameters - self.vocab_size * self.hidden_size
        if self.tie_word_embeddings:
            matmul_params += self.vocab_size * self.hidden_size  # the head still multiplies
        attention = 4 * self.num_hidden_layers * self.num_attention_heads * self.head_dim * context_length
        return 2.0 * matmul_params + attention

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "ModelConfig":
        return cls(**json.loads(text))
