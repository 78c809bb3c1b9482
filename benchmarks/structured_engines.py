"""llguidance against xgrammar on the embedded tokenizer: compile time, mask time, special tokens.

    .venv/bin/python benchmarks/structured_engines.py               # both engines (xgrammar if installed)
    .venv/bin/python benchmarks/structured_engines.py --repeats 1   # quick check that it runs

`benchmarks/structured.py` runs the same measurements as its engine section; this script runs
them alone (seconds, no model weights). `SCHEMAS` is the schema set of both: six realistic
extractions (the structured-outputs guide's Taylor Swift birth date, an order with patterns and bounded numbers, a
support ticket with enums and optional fields, a weather reading with bounded numbers, a contact
with a nested address, a calendar event with a date pattern and a nullable field), each with
the text to extract from and one valid answer.

For each JSON schema (the same set for both engines) and each engine:
  * compile: from the schema to the first mask, caches off (llguidance: grammar + `LLMatcher` +
    first mask, as it builds its lexer lazily; xgrammar: `compile_json_schema` + `GrammarMatcher`
    + first mask, as it precomputes masks while compiling); best of `--repeats`;
  * mask: mean time to compute one token bitmask over the later tokens of a valid document
    walked token by token (encoded with the model's tokenizer; each step computes the mask, then
    accepts the token); best mean over `--repeats` walks;
  * special tokens: how many of the tokenizer's special tokens (<|im_start|>, <|im_end|>, ...)
    each engine allows inside a JSON string, and at any step of the six documents before the
    value is complete (the right answer is 0 for both; EOS only where the value is complete).

Also printed: the tokenizer adapters' build time, llguidance's fork (deep_copy) and rollback
costs, a whole `StructuredProcessor` step (masks of every row + kernel + accept) at B = 1 and 16,
and metagen's bitmask application (fused C++ kernel against torch ops) at B = 1 and 16.

Both engines bound JSON whitespace to 8 characters (metagen's default). xgrammar is installed with
`pip install --no-deps xgrammar apache-tvm-ffi` (its torch / transformers / triton requirements
are only for GPU kernels and Hugging Face tokenizers, not used here).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass

import torch

@dataclass(frozen=True)
class Case:
    """A realistic extraction: the schema, a text to extract from (the user turn), one valid answer."""

    schema: dict
    prompt: str
    document: dict


MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December"]
SCHEMAS = {
    # the guide's example: name and birth date, bounded integers, no other properties
    "taylor_swift": Case(
        {"type": "object", "properties": {
            "name": {"type": "string"},
            "birth_date": {"type": "object", "properties": {
                "year": {"type": "integer", "minimum": 1900, "maximum": 2100},
                "month": {"type": "integer", "minimum": 1, "maximum": 12},
                "day": {"type": "integer", "minimum": 1, "maximum": 31}},
                "required": ["year", "month", "day"], "additionalProperties": False}},
         "required": ["name", "birth_date"], "additionalProperties": False},
        "Taylor Swift was born December 13, 1989. Give her name and birth date as JSON.",
        {"name": "Taylor Swift", "birth_date": {"year": 1989, "month": 12, "day": 13}}),
    # an array of objects with patterns and bounded numbers
    "order": Case(
        {"type": "object", "properties": {
            "order_id": {"type": "string", "pattern": "^ORD-[0-9]{6}$"},
            "items": {"type": "array", "minItems": 1, "maxItems": 5, "items": {"type": "object", "properties": {
                "sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
                "quantity": {"type": "integer", "minimum": 1, "maximum": 99},
                "unit_price": {"type": "number", "minimum": 0, "maximum": 10000}},
                "required": ["sku", "quantity", "unit_price"], "additionalProperties": False}},
            "express": {"type": "boolean"}},
         "required": ["order_id", "items", "express"], "additionalProperties": False},
        "Order ORD-204517: two boxes of pens (SKU PEN-0042) at 3.49 each and one stapler (SKU STP-1100) "
        "at 12.99. Standard shipping. Give the order as JSON.",
        {"order_id": "ORD-204517", "items": [{"sku": "PEN-0042", "quantity": 2, "unit_price": 3.49},
                                             {"sku": "STP-1100", "quantity": 1, "unit_price": 12.99}],
         "express": False}),
    # enums, a bounded string, optional fields
    "ticket": Case(
        {"type": "object", "properties": {
            "category": {"enum": ["billing", "technical", "account", "shipping", "other"]},
            "priority": {"type": "string", "enum": ["low", "medium", "high", "urgent"]},
            "summary": {"type": "string", "maxLength": 80},
            "refund_requested": {"type": "boolean"},
            "order_id": {"type": "string", "pattern": "^ORD-[0-9]{6}$"}},
         "required": ["category", "priority", "summary"], "additionalProperties": False},
        "Classify this support email as JSON. Email: 'Hi, I was charged twice for order ORD-118230 "
        "this morning. Please fix this today and refund the second charge. - Dana'",
        {"category": "billing", "priority": "high", "summary": "Charged twice for one order",
         "refund_requested": True, "order_id": "ORD-118230"}),
    # numbers with bounds (exclusive and inclusive, integer and real)
    "weather": Case(
        {"type": "object", "properties": {
            "station": {"type": "string", "maxLength": 40},
            "temperature_c": {"type": "number", "minimum": -60, "maximum": 60},
            "humidity_percent": {"type": "integer", "minimum": 0, "maximum": 100},
            "wind_kmh": {"type": "number", "minimum": 0, "exclusiveMaximum": 400},
            "visibility_km": {"type": "number", "exclusiveMinimum": 0, "maximum": 50}},
         "required": ["station", "temperature_c", "humidity_percent", "wind_kmh"], "additionalProperties": False},
        "Report from Oslo Blindern at 14:00: 4.5 degrees Celsius, humidity 81%, wind 14 km/h, visibility "
        "10 km. Give the reading as JSON.",
        {"station": "Oslo Blindern", "temperature_c": 4.5, "humidity_percent": 81, "wind_kmh": 14,
         "visibility_km": 10}),
    # nested objects, a format-like pattern, optional fields
    "contact": Case(
        {"type": "object", "properties": {
            "name": {"type": "string", "maxLength": 60},
            "email": {"type": "string", "pattern": "^[a-z0-9._-]+@[a-z0-9-]+(\\.[a-z0-9-]+)+$"},
            "phone": {"type": "string", "pattern": "^\\+?[0-9 ]{7,15}$"},
            "address": {"type": "object", "properties": {
                "street": {"type": "string"}, "city": {"type": "string"},
                "postal_code": {"type": "string", "pattern": "^[0-9]{5}$"},
                "country": {"type": "string", "enum": ["US", "CA", "GB", "DE", "FR", "other"]}},
                "required": ["city", "country"], "additionalProperties": False}},
         "required": ["name", "address"], "additionalProperties": False},
        "Extract the contact as JSON: 'Maria Lopez, 1200 Pine Street, Seattle, WA 98101, USA. "
        "maria.lopez@example.com'",
        {"name": "Maria Lopez", "email": "maria.lopez@example.com",
         "address": {"street": "1200 Pine Street", "city": "Seattle", "postal_code": "98101", "country": "US"}}),
    # a date pattern, an array of strings, a nullable field (anyOf)
    "event": Case(
        {"type": "object", "properties": {
            "title": {"type": "string", "maxLength": 60},
            "date": {"type": "string", "pattern": "^20[0-9]{2}-[01][0-9]-[0-3][0-9]$"},
            "attendees": {"type": "array", "items": {"type": "string", "maxLength": 30}, "maxItems": 6},
            "location": {"anyOf": [{"type": "string", "maxLength": 40}, {"type": "null"}]}},
         "required": ["title", "date", "attendees", "location"], "additionalProperties": False},
        "Put this in the calendar as JSON: budget review with Ana, Raj and Lee on 2025-03-14, room not yet "
        "booked.",
        {"title": "Budget review", "date": "2025-03-14", "attendees": ["Ana", "Raj", "Lee"], "location": None}),
}
MAX_WHITESPACE = 8


def embedded_tokenizer():
    import gguf

    from metagen.models.embedded import embedded_model_path
    from metagen.models.tokenizer import Tokenizer

    return Tokenizer.from_gguf(gguf.GGUFReader(embedded_model_path()))


def timed(function, *args):
    start = time.perf_counter()
    value = function(*args)
    return value, time.perf_counter() - start


class Llguidance:
    name = "llguidance"

    def __init__(self, tokenizer):
        import llguidance

        from metagen.structured.engine import engine_tokenizer

        self.module = llguidance
        self.engine = engine_tokenizer(tokenizer)
        self.words = (tokenizer.vocab_size + 31) // 32

    def compile(self, schema):
        from metagen.structured.compile import grammar_for, parser_limits
        from metagen.structured.spec import StructuredOutputs

        grammar = grammar_for(StructuredOutputs(json=schema, max_whitespace=MAX_WHITESPACE))
        matcher = self.module.LLMatcher(self.engine, grammar, log_level=0, limits=parser_limits())
        assert not matcher.is_error(), matcher.get_error()
        return matcher

    def new_bitmask(self):
        return torch.zeros(1, self.words, dtype=torch.int32)

    def fill(self, matcher, bitmask):
        matcher.unsafe_compute_mask_ptr(bitmask.data_ptr(), self.words * 4)

    def accept(self, matcher, token):
        assert matcher.consume_token(token), matcher.get_error()


class Xgrammar:
    name = "xgrammar"

    def __init__(self, tokenizer):
        import xgrammar

        self.module = xgrammar
        vocab = [tokenizer.id_to_token(token_id) for token_id in range(tokenizer.vocab_size)]
        self.info = xgrammar.TokenizerInfo(vocab, xgrammar.VocabType.BYTE_LEVEL, vocab_size=tokenizer.vocab_size,
                                           stop_token_ids=sorted(tokenizer.eos_token_ids))
        self.vocab_size = tokenizer.vocab_size

    def compile(self, schema):
        compiler = self.module.GrammarCompiler(self.info, max_threads=2, cache_enabled=False)
        compiled = compiler.compile_json_schema(json.dumps(schema), any_whitespace=True,
                                                max_whitespace_cnt=MAX_WHITESPACE)
        return self.module.GrammarMatcher(compiled)

    def new_bitmask(self):
        return self.module.allocate_token_bitmask(1, self.vocab_size)

    def fill(self, matcher, bitmask):
        matcher.fill_next_token_bitmask(bitmask)

    def accept(self, matcher, token):
        assert matcher.accept_token(token)


def allowed_ids(bitmask, vocab_size):
    from metagen.structured.bitmask import bitmask_to_bool

    return set(bitmask_to_bool(bitmask, vocab_size)[0].nonzero().flatten().tolist())


def measure_engine(engine, tokenizer, repeats, cases=None):
    """Per schema: compile to the first mask (ms), then the mean mask time of the later tokens (us)."""
    rows = {}
    for name, case in (cases or SCHEMAS).items():
        schema, document = case.schema, case.document
        tokens = tokenizer.encode(json.dumps(document), add_special_tokens=False)
        bitmask = engine.new_bitmask()
        compiles, means = [], []
        for _ in range(repeats):
            start = time.perf_counter()
            matcher = engine.compile(schema)
            engine.fill(matcher, bitmask)  # llguidance builds its lexer lazily: count the first mask here
            compiles.append(time.perf_counter() - start)
            engine.accept(matcher, tokens[0])
            spent = 0.0
            for token in tokens[1:]:
                start = time.perf_counter()
                engine.fill(matcher, bitmask)
                spent += time.perf_counter() - start
                engine.accept(matcher, token)
            means.append(spent / (len(tokens) - 1))
        rows[name] = {"compile_ms": min(compiles) * 1e3, "mask_us": min(means) * 1e6, "tokens": len(tokens)}
    return rows


def special_tokens_in_strings(engine, tokenizer):
    """Special token ids the engine allows right after '{"name": "Tay' (inside a JSON string)."""
    matcher = engine.compile(SCHEMAS["taylor_swift"].schema)
    for token in tokenizer.encode('{"name": "Tay', add_special_tokens=False):
        engine.accept(matcher, token)
    bitmask = engine.new_bitmask()
    engine.fill(matcher, bitmask)
    return sorted(allowed_ids(bitmask, tokenizer.vocab_size) & set(tokenizer.special_token_ids))


def special_tokens_before_complete(engine, tokenizer, cases=None):
    """Special token ids the engine allows at some step of a valid document before it is complete."""
    special = set(tokenizer.special_token_ids)
    leaked: set[int] = set()
    for case in (cases or SCHEMAS).values():
        matcher = engine.compile(case.schema)
        bitmask = engine.new_bitmask()
        for token in tokenizer.encode(json.dumps(case.document), add_special_tokens=False):
            engine.fill(matcher, bitmask)
            leaked |= allowed_ids(bitmask, tokenizer.vocab_size) & special
            engine.accept(matcher, token)
    return sorted(leaked)


def llguidance_state_costs(tokenizer, repeats=2000):
    engine = Llguidance(tokenizer)
    matcher = engine.compile(SCHEMAS["taylor_swift"].schema)
    tokens = tokenizer.encode(json.dumps(SCHEMAS["taylor_swift"].document), add_special_tokens=False)
    for token in tokens[:10]:
        engine.accept(matcher, token)
    start = time.perf_counter()
    for _ in range(repeats):
        matcher.deep_copy()
    fork = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(repeats):
        matcher.rollback(3)
        matcher.consume_tokens(tokens[7:10])
    rollback = time.perf_counter() - start
    return fork / repeats * 1e6, rollback / repeats * 1e6


def processor_step_costs(tokenizer, repeats):
    """StructuredProcessor apply + accept per decoding step (us), B = 1 and 16, along a valid document."""
    from metagen.sampling.constraint import StructuredProcessor
    from metagen.structured.spec import StructuredOutputs

    schema, document = SCHEMAS["taylor_swift"].schema, SCHEMAS["taylor_swift"].document
    tokens = tokenizer.encode(json.dumps(document), add_special_tokens=False)
    spec = StructuredOutputs(json=schema)
    results = {}
    for batch in (1, 16):
        logits = torch.randn(batch, tokenizer.vocab_size)
        best = float("inf")
        for _ in range(repeats):
            processor = StructuredProcessor(spec, tokenizer, batch)
            start = time.perf_counter()
            for token in tokens:
                processor.apply(logits)
                processor.accept(torch.full((batch,), token))
            best = min(best, (time.perf_counter() - start) / len(tokens))
        results[batch] = best * 1e6
    return results


def bitmask_application(repeats=200):
    from metagen.structured.bitmask import apply_token_bitmask, apply_token_bitmask_torch, bool_to_bitmask

    results = {}
    generator = torch.Generator().manual_seed(0)
    for batch in (1, 16):
        logits = torch.randn(batch, 49152, generator=generator)
        allowed = torch.zeros(batch, 49152, dtype=torch.bool)
        allowed[:, 1000:9000] = True  # a typical JSON mask: runs of allowed tokens
        allowed[:, 20011:20013] = True
        mask = bool_to_bitmask(allowed)
        for label, function in (("kernel", apply_token_bitmask), ("torch", apply_token_bitmask_torch)):
            for _ in range(5):
                function(logits, mask)
            start = time.perf_counter()
            for _ in range(repeats):  # outputs dropped at once, as in decoding (no fresh pages per call)
                function(logits, mask)
            results[(batch, label)] = (time.perf_counter() - start) / repeats * 1e6
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (bitmask application)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    tokenizer = embedded_tokenizer()

    engines = []
    engine, seconds = timed(Llguidance, tokenizer)
    print(f"llguidance tokenizer adapter: {seconds * 1e3:.0f} ms")
    engines.append(engine)
    try:
        engine, seconds = timed(Xgrammar, tokenizer)
        print(f"xgrammar tokenizer info:      {seconds * 1e3:.0f} ms")
        engines.append(engine)
    except ImportError:
        print("xgrammar is not installed: only llguidance is measured")

    results = {engine.name: measure_engine(engine, tokenizer, args.repeats) for engine in engines}
    print("\n| schema | tokens | " + " | ".join(f"{e.name} compile ms | {e.name} mask us/token" for e in engines) + " |")
    print("|---|---:|" + "---:|---:|" * len(engines))
    for name in SCHEMAS:
        cells = [f"{results[e.name][name]['compile_ms']:.2f} | {results[e.name][name]['mask_us']:.1f}" for e in engines]
        print(f"| {name} | {results[engines[0].name][name]['tokens']} | " + " | ".join(cells) + " |")

    print(f"\nSpecial tokens ({len(tokenizer.special_token_ids)} in the vocabulary) allowed inside a JSON string / "
          "anywhere before the value is complete (should be none):")
    for engine in engines:
        leaked = special_tokens_in_strings(engine, tokenizer)
        anywhere = special_tokens_before_complete(engine, tokenizer)
        names = [tokenizer.id_to_token(token_id) for token_id in leaked]
        print(f"  {engine.name}: {len(leaked)} / {len(anywhere)} {names}")

    fork, rollback = llguidance_state_costs(tokenizer)
    print(f"\nllguidance deep_copy: {fork:.1f} us; rollback 3 tokens + re-consume them: {rollback:.1f} us")
    for batch, micros in processor_step_costs(tokenizer, args.repeats).items():
        print(f"StructuredProcessor apply + accept per step, B={batch:2d}: {micros:7.1f} us ({micros / batch:.1f} per row)")
    print("\nBitmask application, V = 49152 (us per call):")
    for (batch, label), micros in bitmask_application().items():
        print(f"  B={batch:2d} {label:6s} {micros:8.1f}")


if __name__ == "__main__":
    main()
