"""metagen: inference-time algorithms for language models.

    import metagen
    model = metagen.load()                      # embedded SmolLM2-135M-Instruct
    result = metagen.generate(model, "Hi!", metagen.SamplingParams(temperature=0.7, max_tokens=32))
    print(result.text)

Names are imported on first use so `import metagen` stays light.
"""

__version__ = "0.1.0"

_EXPORTS = {
    "load": "metagen.models",
    "LanguageModel": "metagen.models",
    "SamplingParams": "metagen.sampling",
    "SamplerChain": "metagen.sampling",
    "generate": "metagen.decoding",
    "generate_batch": "metagen.decoding",
    "stream": "metagen.decoding",
    "beam_search": "metagen.decoding",
    "BeamSearchConfig": "metagen.decoding",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'metagen' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
