"""Architecture description of a decoder checkpoint (any family of `models/families/`)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field


def pattern_layer_types(pattern: int, num_layers: int) -> tuple[str, ...]:
    """`layer_types` where every `pattern`-th layer is global and the others slide (a checkpoint's
    `sliding_window_pattern`, `Family.window_pattern`)."""
    return tuple("full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(num_layers))


@dataclass(frozen=True)
class ModelConfig:
    """Hyper-parameters of a pre-norm decoder (Llama, SmolLM2, Mistral, Qwen2, Qwen3, Phi-3, Gemma 3,
    Qwen3-MoE, Mixtral, Qwen2-MoE).

    Attributes mirror HF `config.json` names where one exists.
    """

    architecture: str  # a family of models/families/: "llama", "mistral", "qwen2", "qwen3", "phi3", "gemma3", "qwen3_moe", ...
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
    sliding_window: int | None = None  # a windowed layer attends to the last this-many positions (Mistral, Gemma 3)
    # Per layer "sliding_attention" | "full_attention" (Gemma 3); None: every layer is windowed
    # when sliding_window is set (Mistral), else none.
    layer_types: tuple[str, ...] | None = None
    rope_local_theta: float | None = None  # RoPE base of sliding layers, unscaled (Gemma 3); None: as global
    hidden_activation: str = "silu"  # the gate's activation: "silu" (SwiGLU) | "gelu_pytorch_tanh" (GeGLU)
    embed_scale: float | None = None  # embeddings times this, in the activation dtype (Gemma: sqrt(hidden))
    query_pre_attn_scalar: float | None = None  # attention scale is its −1/2 power (Gemma 3); None: head_dim
    post_norms: bool = False  # RMSNorm of the attention and MLP outputs before each residual add (Gemma 3)
    # A mixture of experts (models/moe.py; 0 experts: a dense MLP of intermediate_size):
    num_experts: int = 0
    num_experts_per_tok: int = 0  # k experts run per token
    moe_intermediate_size: int = 0  # each expert's I
    norm_topk_prob: bool = True  # renormalise the top-k router probabilities (Mixtral: always)
    shared_expert_intermediate_size: int = 0  # Qwen2-MoE's shared expert, run on every token

    def __post_init__(self) -> None:
        if self.layer_types is not None:
            object.__setattr__(self, "layer_types", tuple(self.layer_types))
            if len(self.layer_types) != self.num_hidden_layers:
                raise ValueError(f"layer_types has {len(self.layer_types)} entries, expected num_hidden_layers="
                                 f"{self.num_hidden_layers}")
            unknown = set(self.layer_types) - {"sliding_attention", "full_attention"}
            if unknown:
                raise ValueError(f"layer_types holds {sorted(unknown)}; supported: 'sliding_attention', "
                                 f"'full_attention'")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}"
            )
        if self.num_experts and not 1 <= self.num_experts_per_tok <= self.num_experts:
            raise ValueError(f"num_experts_per_tok={self.num_experts_per_tok} is out of range: must be in "
                             f"[1, num_experts={self.num_experts}]")

    def layer_window(self, index: int) -> int | None:
        """The window of layer `index`: it attends to positions p − W + 1 .. p (transformers'
        `kv > q − W`); None for full causal attention."""
        if self.sliding_window is None:
            return None
        if self.layer_types is None or self.layer_types[index] == "sliding_attention":
            return self.sliding_window
        return None

    def is_local_layer(self, index: int) -> bool:
        """Whether layer `index` is a sliding layer using the local RoPE base (Gemma 3)."""
        return self.layer_types is not None and self.layer_types[index] == "sliding_attention"

    @property
    def cache_window(self) -> int | None:
        """The window when every layer is windowed (its cache can release older slots), else None."""
        windows = {self.layer_window(i) for i in range(self.num_hidden_layers)}
        return windows.pop() if len(windows) == 1 else None

    @property
    def attention_scale(self) -> float:
        return (self.query_pre_attn_scalar or self.head_dim) ** -0.5

    @property
    def num_parameters(self) -> int:
        """Parameter count (embedding counted once when tied)."""
        h, i = self.hidden_size, self.intermediate_size
        q = self.num_attention_heads * self.head_dim
        kv = self.num_key_value_heads * self.head_dim
        per_layer = h * (q + 2 * kv) + q * h + self._mlp_parameters(self.num_experts) + 2 * h
        if self.attention_bias:
            per_layer += q + 2 * kv
        if self.qk_norm:
            per_layer += 2 * self.head_dim
        if self.post_norms:
            per_layer += 2 * h
        embed = self.vocab_size * h
        head = 0 if self.tie_word_embeddings else self.vocab_size * h
        return embed + head + self.num_hidden_layers * per_layer + h

    def _mlp_parameters(self, experts: int) -> int:
        """One layer's MLP parameters counting `experts` experts (and the whole router) when the
        model is a mixture of experts."""
        h = self.hidden_size
        if not self.num_experts:
            return 3 * h * self.intermediate_size
        shared = 3 * h * self.shared_expert_intermediate_size + h if self.shared_expert_intermediate_size else 0
        return experts * 3 * h * self.moe_intermediate_size + self.num_experts * h + shared

    @property
    def non_embedding_parameters(self) -> int:
        """The parameters one token multiplies through, N: every layer (only the k experts a
        token runs, in a mixture of experts), the final norm and the LM head (a V×h matmul
        whether or not it is tied to the embedding); not the input embedding table, a lookup.
        Counted from the architecture, so a quantized checkpoint counts its logical parameters."""
        active = self.num_parameters - self.vocab_size * self.hidden_size
        active -= self.num_hidden_layers * (self._mlp_parameters(self.num_experts)
                                            - self._mlp_parameters(self.num_experts_per_tok))
        if self.tie_word_embeddings:
            active += self.vocab_size * self.hidden_size  # the tied head still multiplies
        return active

    def flops_per_token(self, context_length: int) -> float:
        """Forward FLOPs for one token attending to `context_length` keys:
        2·N + 4·layers·heads·head_dim·context (`models.flops.transformer_flops_per_token`,
        N = `non_embedding_parameters`)."""
        from metagen.models.flops import transformer_flops_per_token

        return transformer_flops_per_token(self.non_embedding_parameters, self.num_hidden_layers,
                                           self.num_attention_heads * self.head_dim, context_length)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "ModelConfig":
        return cls(**json.loads(text))
