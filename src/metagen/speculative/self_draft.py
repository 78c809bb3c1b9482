"""Self-drafting models built from the target itself: its first layers, or a cheaper copy.

`early_exit_model(target, L)` shares the target's weights (first L layers + final norm + LM
head); `quantized_model(target, dtype)` loads the same checkpoint at a lower precision. Either
drafts through `ModelDrafter`.
"""

from __future__ import annotations

from metagen.models.base import DepthTruncatable


def early_exit_model(target, num_layers: int):
    """The target's first `num_layers` layers + its final norm and LM head, as a model.

    Shares every weight tensor with `target` (no copy); it has its own cache. Kangaroo-style
    self-drafting without an adapter: the first layers' residual stream, normalised and read
    out by the LM head, already predicts the easy tokens. Needs a `DepthTruncatable` target (the
    native `DecoderModel`); ValueError naming the target's class otherwise.
    """
    if not isinstance(target, DepthTruncatable):
        raise ValueError(f"early-exit drafting needs a target whose first layers form a model (DepthTruncatable: "
                         f"truncated(num_layers), the native backend), got {type(target).__name__}")
    return target.truncated(num_layers)


def weight_bytes(model) -> int:
    """Bytes of linear weights (with scales) one decode step reads: every layer's and the LM head's."""
    return sum(linear.nbytes for _, linear in model.linears())


def quantized_model(target, dtype: str = "int4"):
    """A lower-precision copy of `target` loaded from the same checkpoint (e.g. int4 drafting
    for an fp32 or bf16 target). Refused unless its decode step reads fewer weight bytes."""
    from metagen.models.loading import load

    formats = ("fp32", "bf16", "int8", "int4")
    if dtype not in formats:
        raise ValueError(f"dtype={dtype!r} is not supported for a draft: choose one of {', '.join(formats)}")
    if not target.source:
        raise ValueError("quantized self-drafting needs a target loaded from a file (target.source is empty)")
    # the target's KV format, so the draft can take the target's prompt keys and values (copy_prefix)
    draft = load(target.source, dtype=dtype, kv_dtype=target.kv_dtype, activations=target.activations)
    if weight_bytes(draft) >= weight_bytes(target):
        raise ValueError(
            f"a {dtype} draft is not cheaper than the {target.dtype} target ({weight_bytes(draft):,} vs "
            f"{weight_bytes(target):,} weight bytes per step): draft with a lower precision than the target "
            f"(e.g. target fp32/bf16, draft int8/int4)"
        )
    return draft
