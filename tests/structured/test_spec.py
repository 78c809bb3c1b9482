"""StructuredOutputs and response_format: one kind, clear errors naming the field, compiled up front."""

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

import metagen
from metagen.sampling import SamplingParams
from metagen.structured.spec import StructuredOutputs, from_response_format

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


def test_exactly_one_kind():
    assert StructuredOutputs(regex="a+").kind == "regex"
    assert StructuredOutputs(json_object=True).schema == {"type": "object"}
    with pytest.raises(ValueError, match="exactly one of .*got none"):
        StructuredOutputs()
    with pytest.raises(ValueError, match="exactly one of .*got regex, choice"):
        StructuredOutputs(regex="a", choice=["b"])


def test_schema_text_is_hashable_and_keeps_key_order():
    first = StructuredOutputs(json=SCHEMA)
    second = StructuredOutputs(json='{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}')
    assert first == second and hash(first) == hash(second) and first.cache_key() == second.cache_key()
    assert first.schema == SCHEMA
    # Properties are generated in the schema's order, so a reordered schema is another constraint.
    ordered = StructuredOutputs(json={"properties": {"b": {}, "a": {}}})
    assert list(ordered.schema["properties"]) == ["b", "a"]
    assert ordered != StructuredOutputs(json={"properties": {"a": {}, "b": {}}})


@pytest.mark.parametrize("kwargs, message", [
    ({"json": "{not json"}, r"structured_outputs.json is not valid JSON"),
    ({"json": [1]}, r"structured_outputs.json must be a JSON Schema"),
    ({"regex": 3}, r"structured_outputs.regex must be a str"),
    ({"choice": "ab"}, r"structured_outputs.choice='ab' must be a list of strings"),
    ({"choice": []}, r"structured_outputs.choice is empty"),
    ({"choice": ["a", ""]}, r"non-empty strings"),
    ({"regex": "a", "max_whitespace": -1}, r"max_whitespace=-1"),
])
def test_bad_fields_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        StructuredOutputs(**kwargs)


@pytest.mark.parametrize("schema, message", [
    ("{not json", r"^response_format.json_schema.schema is not valid JSON: Expecting"),
    ("[" * 100_000, r"^response_format.json_schema.schema nests arrays and objects 100000 deep, more than the limit"),
])
def test_a_response_format_schema_is_named_as_the_request_spells_it(schema, message):
    with pytest.raises(ValueError, match=message):
        from_response_format({"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})


def test_a_schema_nested_too_deep_is_a_value_error():
    deep: dict = {}
    for _ in range(100_000):
        deep = {"items": deep}
    with pytest.raises(ValueError, match=r"^structured_outputs.json cannot be written as JSON"):
        StructuredOutputs(json=deep)


def test_response_format_mapping():
    assert from_response_format(None) is None and from_response_format({"type": "text"}) is None
    assert from_response_format({"type": "json_object"}).kind == "json_object"
    spec = from_response_format({"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA, "strict": True}})
    assert spec.kind == "json" and spec.schema == SCHEMA and spec.kind_field == "response_format.json_schema.schema"
    with pytest.raises(ValueError, match="response_format.type='xml'"):
        from_response_format({"type": "xml"})
    with pytest.raises(ValueError, match="response_format.json_schema must be a mapping with a 'schema'"):
        from_response_format({"type": "json_schema", "json_schema": {"name": "x"}})
    with pytest.raises(ValueError, match=r"unknown keys \['shema'\]"):
        from_response_format({"type": "json_schema", "json_schema": {"schema": SCHEMA, "shema": 1}})


# A spec that does not compile is a ValueError naming the field and quoting llguidance.
@pytest.mark.parametrize("structured, message", [
    ({"json": {"type": "objectx"}}, r"structured_outputs.json=.* does not compile: Invalid type: objectx"),
    ({"json": {"type": "integer", "minimum": 5, "maximum": 3}}, r"structured_outputs.json=.*minimum \(5\) is greater"),
    ({"json": {"$ref": "#/definitions/missing"}}, r"structured_outputs.json=.* does not compile: .*missing"),
    ({"regex": "a(b"}, r"structured_outputs.regex='a\(b' does not compile: .*unclosed group"),
    ({"regex": "(?=a)b"}, r"structured_outputs.regex=.* does not compile: .*look-around"),
    ({"regex": r"[^\s\S]"}, r"structured_outputs.regex=.* cannot be satisfied: no text matches it"),
    ({"regex": r"ab[^\s\S]"}, r"structured_outputs.regex=.* cannot be satisfied"),
    ({"grammar": "start: foo"}, r"structured_outputs.grammar='start: foo' does not compile: .*unknown name"),
    ({"grammar": 'start: "a" ( '}, r"structured_outputs.grammar=.* does not compile"),
    ({"grammar": "root ::= foo"}, r"structured_outputs.grammar='root ::= foo' does not compile: .*GBNF.*'foo'"),
    ({"grammar": 'root := "a"'}, r"structured_outputs.grammar=.* does not compile: .*Expected ::="),
])
def test_compile_errors_name_the_field(structured, message):
    with pytest.raises(ValueError, match=f"(?s){message}"):  # llguidance's messages span lines
        SamplingParams(structured_outputs=structured)


def test_response_format_errors_name_response_format():
    bad = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}
    with pytest.raises(ValueError, match=r"response_format.json_schema.schema=.* Invalid type: nope"):
        SamplingParams(response_format=bad)


def test_sampling_params_fields():
    params = SamplingParams(response_format={"type": "json_object"})
    assert params.structured_outputs.kind == "json_object" and params.response_format is None
    assert replace(params, n=3).structured_outputs == params.structured_outputs  # replace re-validates
    assert SamplingParams(structured_outputs={"choice": ["yes", "no"]}).structured_outputs.choice == ("yes", "no")
    grammar = SamplingParams(structured_outputs={"grammar": 'root ::= "a" | "b"'}).structured_outputs
    assert grammar.kind == "grammar"  # GBNF converts
    with pytest.raises(ValueError, match="not both"):
        SamplingParams(structured_outputs={"regex": "a"}, response_format={"type": "json_object"})
    with pytest.raises(ValueError, match=r"unknown fields \['regexp'\]"):
        SamplingParams(structured_outputs={"regexp": "a"})
    with pytest.raises(ValueError, match="ignore_eos=True cannot be combined with structured_outputs"):
        SamplingParams(structured_outputs={"regex": "a"}, ignore_eos=True)
    with pytest.raises(ValueError, match="must be a StructuredOutputs or a mapping"):
        SamplingParams(structured_outputs="a+")


def test_import_stays_light():
    # Neither `import metagen` nor building plain SamplingParams imports llguidance; neither the
    # package, the server's engine and request parsers nor the CLI's parser (serve included) imports
    # the serve extra (fastapi, uvicorn) or an HTTP client.
    code = ("import sys, metagen; from metagen.sampling import SamplingParams; SamplingParams(temperature=0.5); "
            "import metagen.structured, metagen.serve, metagen.serve.engine, metagen.serve.completion_request, "
            "metagen.serve.chat_request, metagen.cli; "
            "metagen.cli.build_parser(); "
            "print([name for name in ('llguidance', 'fastapi', 'starlette', 'uvicorn', 'httpx', 'openai') "
            "if name in sys.modules])")
    src = str(Path(metagen.__file__).parents[1])
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env={"PYTHONPATH": src, "PATH": "/usr/bin:/bin"}, check=True)
    assert result.stdout.strip() == "[]"


# Past llguidance's parser limits (max_items_in_row 2000, step_max_items 50000) a spec compiles but
# its first token fails in the matcher: refused up front, naming the field and the limit.
@pytest.mark.parametrize("structured, message", [
    ({"choice": [f"option {i}" for i in range(3000)]},
     r"structured_outputs.choice has 3000 strings, over the constraint engine's limit of 1999 "
     r".* max_items_in_row is 2000"),
    ({"grammar": 'start: "a"{100000}'}, r"structured_outputs.grammar='start: \"a\"\{100000\}' is beyond the "
                                        r"constraint engine's limits: .*limit 50000"),
    ({"grammar": 'root ::= "x" "a"{100000}'}, r"structured_outputs.grammar=.* is beyond .*limit 50000"),
])
def test_specs_past_the_engine_limits_are_refused_naming_the_field_and_the_limit(structured, message):
    with pytest.raises(ValueError, match=f"(?s){message}"):
        SamplingParams(structured_outputs=structured)
    assert SamplingParams(structured_outputs={"choice": [f"option {i}" for i in range(1999)]})  # at the limit


def test_response_format_past_the_engine_limits_names_response_format():
    schema = {"anyOf": [{"type": "object", "properties": {f"k{i}": {"type": "integer"}}, "required": [f"k{i}"]}
                        for i in range(3000)]}
    bad = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    with pytest.raises(ValueError, match=r"(?s)response_format.json_schema.schema=.* is beyond the "
                                                r"constraint engine's limits: .*max is 2000"):
        SamplingParams(response_format=bad)


def test_the_grammar_syntax_of_many_blank_lines_is_read_in_linear_time():
    """A request's grammar of 200,000 newlines: the Lark test rescanned every following blank line
    from each line start (O(L^2): 20,000 newlines took 5 s, this size minutes, holding the server).
    The bound is generous (linear time takes milliseconds); the syntax read is unchanged."""
    import time

    started = time.perf_counter()
    assert StructuredOutputs(grammar="\n" * 200_000 + "root ::= \"a\"").grammar_syntax == "gbnf"
    assert time.perf_counter() - started < 10
    assert StructuredOutputs(grammar="\n\n  start : \"a\"").grammar_syntax == "lark"
    assert StructuredOutputs(grammar="x: y\n \t%llguidance {}\nstart: x").grammar_syntax == "lark"
    assert StructuredOutputs(grammar="root ::= \"start:\"").grammar_syntax == "gbnf"
