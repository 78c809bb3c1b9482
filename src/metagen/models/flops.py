"""The forward FLOPs of a decoder per token: the one formula every local model's cost follows
(`LanguageModel.flops_per_token`; summed over positions by `decoding.cost.forward_flops`)."""

from __future__ import annotations


def transformer_flops_per_token(non_embedding_parameters: float, layers: int, attention_width: int,
                                context_length: int) -> float:
    """Forward FLOPs of one token of a decoder attending to `context_length` keys, the one
    formula every local model's FLOPs follow (Kaplan et al. 2020, "Scaling laws", Table 1):

        2·N  +  4·layers·attention_width·context_length

    N: the parameters the token multiplies through (all but the input embedding table, the LM
    head included; `ModelConfig.non_embedding_parameters`), 2 FLOPs per multiply-add; the
    attention term is QKᵀ and the weighted sum of V, 2 FLOPs each per key and query channel
    (attention_width = heads·head_dim). Prompt tokens count when computed, not when served
    from a cache; a remote model with only N known drops the attention term (an estimate)."""
    return 2.0 * non_embedding_parameters + 4.0 * layers * attention_width * context_length
