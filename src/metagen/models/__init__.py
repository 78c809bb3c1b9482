"""What produces logits: the LanguageModel interface, the native decoder (every family of
`models/families/`), loaders."""

from metagen.models.base import ForwardOutput, LanguageModel
from metagen.models.cache import DEFAULT_KV_DTYPE, KV_DTYPES, KVCache
from metagen.models.config import ModelConfig
from metagen.models.decoder import DecoderModel
from metagen.models.embedded import embedded_model_path
from metagen.models.loading import DEFAULT_DTYPE, DTYPES, load

__all__ = [
    "DEFAULT_DTYPE",
    "DEFAULT_KV_DTYPE",
    "DTYPES",
    "KV_DTYPES",
    "DecoderModel",
    "ForwardOutput",
    "KVCache",
    "LanguageModel",
    "ModelConfig",
    "TransformersModel",
    "embedded_model_path",
    "load",
]


def __getattr__(name: str):
    if name == "TransformersModel":  # optional extra: imports transformers only when asked
        from metagen.models.transformers_adapter import TransformersModel

        return TransformersModel
    raise AttributeError(f"module 'metagen.models' has no attribute {name!r}")
