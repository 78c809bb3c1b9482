"""Structured generation: outputs constrained to a JSON Schema, a regex, a choice or a grammar.

    spec.py        `StructuredOutputs` (json / json_object / regex / choice / grammar) and
                   OpenAI's `response_format`
    engine.py      llguidance, imported lazily; metagen's tokenizer in llguidance's terms
    compile.py     spec -> llguidance grammar -> cached matcher; errors naming the field
    bitmask.py     (B, ceil(V / 32)) int32 token bitmasks applied to logits (fused C++ kernel)
    processor.py   `StructuredProcessor`: per-row matchers behind the stateful processor interface
    healing.py     token healing: `heal_prompt` and `TokenHealingProcessor`

Names are imported on first use, so importing this package does not import llguidance.
"""

_EXPORTS = {
    "StructuredOutputs": "metagen.structured.spec",
    "from_response_format": "metagen.structured.spec",
    "StructuredProcessor": "metagen.structured.processor",
    "TokenHealingProcessor": "metagen.structured.healing",
    "heal_prompt": "metagen.structured.healing",
    "strip_healed_prefix": "metagen.structured.healing",
    "apply_token_bitmask": "metagen.structured.bitmask",
    "check_compiles": "metagen.structured.compile",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'metagen.structured' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
