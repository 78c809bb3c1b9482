"""The per-engine tables agree: every engine of `ENGINES` has its constraint kinds (possibly
none) and a request builder for them, and no table names an engine `ENGINES` lacks — so a new
engine is added where docs/ARCHITECTURE.md says ("A remote engine") and is refused nowhere by
omission."""

from __future__ import annotations

from metagen.remote import constraints
from metagen.remote.engines import ENGINES
from metagen.structured.spec import StructuredOutputs


def test_every_engine_has_its_constraint_kinds_and_builder():
    for name in ENGINES:
        assert name in constraints.KINDS, f"remote/constraints.py KINDS has no entry for engine {name!r}"
        if constraints.KINDS[name]:
            assert name in constraints._BUILDERS, f"remote/constraints.py has no request builder for {name!r}"


def test_no_table_names_an_unknown_engine():
    known = set(ENGINES)
    for table in (constraints.KINDS, constraints._BUILDERS, constraints.LARK_GRAMMARS):
        assert set(table) <= known, sorted(set(table) - known)
    assert {engine for engine, _ in constraints._REASONS} <= known


def test_a_lark_grammar_goes_only_where_the_table_says():
    lark = StructuredOutputs(grammar='start: "yes" | "no"')
    for name in ENGINES:
        if "grammar" not in constraints.KINDS[name]:
            continue
        if name in constraints.LARK_GRAMMARS:
            assert constraints.constraint_fields(lark, name, "chat/completions")
        else:
            try:
                constraints.constraint_fields(lark, name, "chat/completions")
            except ValueError as error:
                assert "Lark" in str(error)
            else:
                raise AssertionError(f"{name} was sent a Lark grammar")


def test_only_engines_that_name_their_stop_tell_stops_without_logprobs():
    assert {name for name, engine in ENGINES.items() if engine.names_stop} == {"vllm", "sglang"}
