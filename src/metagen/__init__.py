"""metagen: inference-time algorithms for language models.

    import metagen
    model = metagen.load()                      # embedded SmolLM2-135M-Instruct
    result = metagen.generate(model, "Hi!", metagen.SamplingParams(temperature=0.7, max_tokens=32))
    print(result.text)

Names are imported on first use so `import metagen` stays light.
"""

__version__ = "0.1.0"

from metagen._lazy import lazy_package

# name -> the subpackage that defines it, imported on first use (`metagen._lazy`)
_EXPORTS = {
    "load": "models",
    "LanguageModel": "models",
    "SamplingParams": "sampling",
    "SamplerChain": "sampling",
    "generate": "decoding",
    "generate_batch": "decoding",
    "stream": "decoding",
    "beam_search": "decoding",
    "BeamSearchConfig": "decoding",
    "superposed_decode": "decoding",
}
lazy_package(__name__, _EXPORTS)

__all__ = sorted(_EXPORTS)
