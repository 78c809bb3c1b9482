"""What produces logits: the LanguageModel interface, the native decoder (every family of
`models/families/`), loaders.

Names are imported on first use (`metagen._lazy`): `from metagen.models import load` imports
the loader (and torch) then, and `TransformersModel` imports transformers only when asked.
"""

from metagen._lazy import lazy_package

# name -> the submodule that defines it
_EXPORTS = {
    "DEFAULT_DTYPE": "loading",
    "DEFAULT_KV_DTYPE": "cache",
    "DTYPES": "loading",
    "KV_DTYPES": "cache",
    "DecoderModel": "decoder",
    "ForwardOutput": "base",
    "KVCache": "cache",
    "LanguageModel": "base",
    "ModelConfig": "config",
    "TransformersModel": "transformers_adapter",  # optional extra
    "embedded_model_path": "embedded",
    "load": "loading",
}
lazy_package(__name__, _EXPORTS)

__all__ = sorted(_EXPORTS)
