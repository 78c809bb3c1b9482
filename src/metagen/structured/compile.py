"""From a `StructuredOutputs` to a ready llguidance matcher, with errors that name the field.

`grammar_for(spec, prefix)` writes the llguidance grammar of a spec:

    json / json_object   JSON Schema compiled by llguidance; whitespace between tokens limited to
                         `max_whitespace` characters of [ \\t\\n\\r] (0: none; None: unbounded)
    regex                the regex, matched against the whole output
    choice               the Lark rule  start: "a" | "b" | ...
    grammar              Lark as given, or GBNF converted to Lark by llguidance
    prefix (healing)     start: "<prefix>" @constrained_output, the spec's grammar as a sub-grammar:
                         the text removed from the prompt by token healing, then the constrained text

`compiled_matcher(spec, tokenizer, prefix)` returns a matcher in its initial state; callers
`deep_copy` it per row (microseconds). Compiled matchers are cached per tokenizer object (LRU,
`CACHE_SIZE` entries) under (kind, constraint text, max_whitespace, prefix): a moderate schema
compiles in ~1 ms on SmolLM2's vocabulary, so a repeated request pays it once.

Errors: a spec that does not compile, and one that no text satisfies (a fresh matcher that is
not accepting and allows no token, e.g. the regex `[^\\s\\S]`), raise ValueError naming the field
(`structured_outputs.regex`, `response_format.json_schema.schema`, ...) and quoting llguidance.
A spec that compiles but outgrows llguidance's per-step parser limits (a `choice` of more than
1999 strings, `"a"{100000}`) fails at its first token: `build_matcher` consumes one allowed
token on a copy and raises ValueError naming the field and the limit, so a server answers 400
before decoding starts. `check_compiles(spec)` runs the same checks on a byte vocabulary,
without a model.
"""

from __future__ import annotations

import json
import weakref
from collections import OrderedDict
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import numpy as np

from metagen.structured.engine import byte_tokenizer, engine_tokenizer, llguidance, parser_limits
from metagen.structured.spec import StructuredOutputs

if TYPE_CHECKING:
    from metagen.models.tokenizer import Tokenizer

CACHE_SIZE = 64
JSON_WHITESPACE = r"[\x20\x0A\x0D\x09]"
_SUB_GRAMMAR = "constrained_output"
_CACHES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # tokenizer -> OrderedDict of matchers


def grammar_for(spec: StructuredOutputs, prefix: str = "") -> str:
    """The llguidance grammar text of `spec`, preceded by the literal `prefix` when it is not empty."""
    module = llguidance()
    kind = spec.kind
    if kind in ("json", "json_object"):
        grammar = module.LLMatcher.grammar_from_json_schema(json.dumps(spec.schema), overrides=_whitespace(spec))
    elif kind == "regex":
        grammar = module.LLMatcher.grammar_from_regex(spec.regex)
    elif kind == "choice":
        grammar = module.LLMatcher.grammar_from_lark(
            "start: " + " | ".join(json.dumps(choice, ensure_ascii=False) for choice in spec.choice))
    else:
        try:
            grammar = module.grammar_from("grammar", spec.grammar)
        except ValueError as error:  # GBNF that does not convert
            raise ValueError(f"{spec.kind_field}={_shorten(spec.grammar)} does not compile: {error}") from None
    return _with_prefix(grammar, prefix) if prefix else grammar


def _whitespace(spec: StructuredOutputs) -> dict[str, Any]:
    if spec.max_whitespace is None:
        return {"whitespace_flexible": True}
    if spec.max_whitespace == 0:
        return {"whitespace_flexible": False}
    return {"whitespace_pattern": f"{JSON_WHITESPACE}{{0,{spec.max_whitespace}}}"}


def _with_prefix(grammar: str, prefix: str) -> str:
    """A grammar for `prefix` followed by a text of `grammar` (llguidance's nested grammars)."""
    inner = json.loads(grammar) if grammar.lstrip().startswith("{") else {"grammars": [{"lark_grammar": grammar}]}
    inner["grammars"][0]["name"] = _SUB_GRAMMAR
    top = {"name": "healed_prefix",
           "lark_grammar": f"start: {json.dumps(prefix, ensure_ascii=False)} @{_SUB_GRAMMAR}"}
    return json.dumps({**inner, "grammars": [top, *inner["grammars"]]})


def build_matcher(spec: StructuredOutputs, engine_tokenizer_: Any, prefix: str = "") -> Any:
    """A fresh matcher of `spec` over an llguidance tokenizer, or ValueError naming the field."""
    module = llguidance()
    matcher = module.LLMatcher(engine_tokenizer_, grammar_for(spec, prefix), log_level=0, limits=parser_limits())
    if matcher.is_error():
        raise ValueError(f"{spec.kind_field}={_shorten(_spec_text(spec))} does not compile: "
                         f"{_engine_message(matcher.get_error())}")
    probe = matcher.deep_copy()
    mask = probe.compute_bitmask()  # the first step: an empty language stops here, with no token allowed
    eos_only = probe.is_stopped() and not probe.is_accepting()
    if probe.is_error() or eos_only or not any(mask):
        reason = _engine_message(probe.get_error()) or "no token can start it"
        raise ValueError(f"{spec.kind_field}={_shorten(_spec_text(spec))} cannot be satisfied: no text matches it "
                         f"(llguidance: {reason})")
    _check_first_step(spec, probe, mask, engine_tokenizer_)
    return matcher


def _check_first_step(spec: StructuredOutputs, probe: Any, mask: bytes, engine_tokenizer_: Any) -> None:
    """ValueError naming the field when the first token the mask allows fails in the matcher: the
    grammar compiled but its parse outgrows llguidance's per-step limits (`parser_limits`:
    max_items_in_row = 2000 Earley items in one row, e.g. a choice of more than 1999 strings, and
    step_max_items = 50000, e.g. `"a"{100000}`). Both show at the first step, when the parser
    predicts every alternative; a request would otherwise fail only once decoding started.
    Cost: one token consumed on a copy, O(first Earley row)."""
    words = np.frombuffer(mask, dtype=np.uint32)  # bit i of word w: token 32·w + i allowed
    allowed = np.flatnonzero(np.unpackbits(words.view(np.uint8), bitorder="little"))
    first = next((int(token) for token in allowed[:64] if not engine_tokenizer_.is_special_token(int(token))), None)
    if first is None or (probe.try_consume_tokens([first]) == 1 and not probe.is_error()):
        return
    reason = _engine_message(probe.get_error()) or f"token {first}, which the mask allows, is refused"
    if spec.kind == "choice":
        limit = parser_limits().max_items_in_row
        raise ValueError(f"{spec.kind_field} has {len(spec.choice)} strings, over the constraint engine's limit of "
                         f"{limit - 1} (llguidance's max_items_in_row is {limit}: {reason})")
    raise ValueError(f"{spec.kind_field}={_shorten(_spec_text(spec))} is beyond the constraint engine's limits: "
                     f"llguidance: {reason}")


def compiled_matcher(spec: StructuredOutputs, tokenizer: Tokenizer, prefix: str = "") -> Any:
    """The cached initial-state matcher of `spec` for `tokenizer` (deep_copy it before use)."""
    engine = engine_tokenizer(tokenizer)
    cache = _CACHES.get(tokenizer)
    if cache is None:
        cache = _CACHES[tokenizer] = OrderedDict()
    key = (*spec.cache_key(), prefix)
    matcher = cache.get(key)
    if matcher is None:
        matcher = build_matcher(spec, engine, prefix)
        cache[key] = matcher
        if len(cache) > CACHE_SIZE:
            cache.popitem(last=False)
    else:
        cache.move_to_end(key)
    return matcher


def check_compiles(spec: StructuredOutputs) -> None:
    """Compile `spec` on a byte vocabulary: ValueError naming the field if it fails or is unsatisfiable."""
    _check(spec)


@lru_cache(maxsize=256)
def _check(spec: StructuredOutputs) -> None:  # a spec that compiled once is not compiled again
    build_matcher(spec, byte_tokenizer())


def _spec_text(spec: StructuredOutputs) -> str:
    value = {"json_object": '{"type": "object"}', "choice": json.dumps(spec.choice)}.get(spec.kind)
    return value if value is not None else getattr(spec, spec.kind)


def _shorten(text: str, limit: int = 80) -> str:
    return repr(text if len(text) <= limit else text[: limit - 3] + "...")


def _engine_message(message: str) -> str:
    """llguidance's error text without its trailing state markers."""
    return message.replace("<non-verbose/>", "").strip()
