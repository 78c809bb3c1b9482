"""Structured generation: outputs constrained to a JSON Schema, a regex, a choice or a grammar.

    spec.py        `StructuredOutputs` (json / json_object / regex / choice / grammar) and
                   OpenAI's `response_format`
    engine.py      llguidance, imported lazily; metagen's tokenizer in llguidance's terms
    compile.py     spec -> llguidance grammar -> cached matcher; errors naming the field
    bitmask.py     (B, ceil(V / 32)) int32 token bitmasks applied to logits (fused C++ kernel)
    healing.py     token healing: `heal_prompt` (which prompt text to back up)
    span.py        `span_of(passage)`: outputs that are a span of a passage (a suffix automaton)

The processors that apply them while decoding are on the sampling floor, with every other
`LogitsProcessor`: `metagen.sampling.constraint.StructuredProcessor` (per-row matchers),
`metagen.sampling.span.SpanProcessor` (per-row automaton states) and
`metagen.sampling.token_healing.TokenHealingProcessor`; this package imports nothing of sampling.

Which law masked decoding samples. Each step keeps the model's next-token distribution on the
tokens the constraint allows and renormalises it there:

    q(y) = prod_t  p(y_t | y_<t) · 1[y_t allowed after y_<t] / Z_t,   Z_t = sum of p over allowed tokens

(the mask comes before temperature and truncation, see `metagen.sampling.chain`). This is NOT the
model conditioned on validity, p(y) · 1[y valid] / sum_y' p(y') 1[y' valid], in general: per-step
renormalisation gives a prefix the full mass of its first token even when its valid
continuations carry little model mass. The two coincide when every allowed prefix keeps all of
its mass (Z_t = 1 at every step: the constraint never removes probability), and sampling the
conditioned law exactly needs lookahead (rejection, SMC), not a mask. Greedy decoding under a
constraint takes the argmax over the allowed tokens at each step. Jump-forward
(`decoding.jump_forward`) and speculative decoding (`speculative.loop`) sample the same q.
tests/decoding/test_jump_forward.py checks q by chi-square on the toy model and shows that the
conditioned law differs.

Names are imported on first use (`metagen._lazy`), so importing this package does not import
llguidance.
"""

from metagen._lazy import lazy_package

# name -> the submodule that defines it
_EXPORTS = {
    "StructuredOutputs": "spec",
    "from_response_format": "spec",
    "heal_prompt": "healing",
    "strip_healed_prefix": "healing",
    "apply_token_bitmask": "bitmask",
    "check_compiles": "compile",
    "Span": "span",
    "SpanIndex": "span",
    "span_of": "span",
}
lazy_package(__name__, _EXPORTS)

__all__ = sorted(_EXPORTS)
