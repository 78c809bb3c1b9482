"""A second model next to the main one, from its spelling: contrastive decoding's amateur,
DExperts' experts, entropy-adaptive decoding's large model, Transfer Q*'s baseline.

    early-exit:L   the main model's own first L layers with its final norm and LM head (no
                   second set of weights; the model must be `DepthTruncatable`)
    main           the main model itself: DExperts with the base as its own expert
                   (`--dexperts main,ANTI`: log p + α·(log p − log p_anti)); its logits are the
                   main model's, with no second forward or cache (`combine.CompanionSlots`)
    embedded       the embedded SmolLM2-135M-Instruct
    anything else  what --model takes (a GGUF file, an HF directory, a hub name OWNER/NAME[:QUANT])

The command line (`cli/contrastive.py`, `cli/mixing.py`) and the strategies that run a second
model (`strategies/transfer_q.py`) load it here, so one spelling means one model everywhere.
"""

from __future__ import annotations

EARLY_EXIT = "early-exit:"
EMBEDDED = "embedded"
MAIN = "main"


def early_exit_layers(spec: str, where: str) -> int | None:
    """L of an `early-exit:L` spelling (ValueError naming `where` when L is not an int >= 1), None
    for a model loaded from a file or a name."""
    if not spec.startswith(EARLY_EXIT):
        return None
    text = spec[len(EARLY_EXIT):]
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"{where} {spec!r}: early-exit:L needs L, the number of layers, an int >= 1")
    return int(text)


def load_companion(spec: str, model, *, dtype: str | None = None, kv_dtype: str | None = None,
                   activations: str | None = None, where: str = "companion"):
    """The model `spec` names next to `model` (see the module): `model` itself for `main`,
    `model.truncated(L)` for
    `early-exit:L` (ValueError naming `where` when `model` has no such form), else a model loaded
    at `dtype` with `kv_dtype` caches and `activations` (`models.load`)."""
    from metagen.models import load
    from metagen.models.base import DepthTruncatable

    if spec == MAIN:
        return model
    layers = early_exit_layers(spec, where)
    if layers is not None:
        if not isinstance(model, DepthTruncatable):
            raise ValueError(f"{where} {spec}: the model ({type(model).__name__}) has no "
                             "early-exit form (DepthTruncatable: the native backend)")
        return model.truncated(layers)
    return load(None if spec == EMBEDDED else spec, dtype, kv_dtype=kv_dtype, activations=activations)
