"""`metagen generate` / `metagen eval` with --json-schema, --json-object, --regex, --choice, --grammar
and --token-healing: the spec each makes, one-line errors naming the flag before the model is
loaded, and one end-to-end JSON-schema generation on the embedded model."""

from __future__ import annotations

import json
import pytest

from metagen.cli import common, main
from metagen.cli.structured import one_line, split_choices
from metagen.sampling import SamplingParams

pytest.importorskip("llguidance")

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "birth_date": {
            "type": "object",
            "properties": {"year": {"type": "integer"}, "month": {"type": "integer", "minimum": 1, "maximum": 12},
                           "day": {"type": "integer", "minimum": 1, "maximum": 31}},
            "required": ["year", "month", "day"], "additionalProperties": False,
        },
    },
    "required": ["name", "birth_date"], "additionalProperties": False,
}


@pytest.fixture
def no_model(monkeypatch):
    monkeypatch.setattr(common, "load_model", lambda args: pytest.fail("the model was loaded before the check"))


def _params(monkeypatch, argv) -> SamplingParams:
    """The SamplingParams `metagen generate` builds from argv (captured where the loop would start)."""
    import metagen.cli.generate as generate

    seen = {}

    def stop(args, model, prompt, params, *rest):
        seen["params"] = params
        return 0

    monkeypatch.setattr(common, "load_model", lambda args: None)
    monkeypatch.setattr(generate, "_sample", stop)
    assert main(["generate", "hi", *argv]) == 0
    return seen["params"]


@pytest.mark.parametrize(("typed", "meant"), [
    (["a,b,c"], ["a", "b", "c"]),
    (["yes", "no"], ["yes", "no"]),
    (["1\\,000,2\\,000"], ["1,000", "2,000"]),
    (["back\\\\slash,x"], ["back\\slash", "x"]),
    (["\\d"], ["\\d"]),
])
def test_choice_values_split_at_unescaped_commas(typed, meant):
    assert split_choices(typed) == meant


def test_each_flag_makes_its_spec(monkeypatch, tmp_path):
    schema_file = tmp_path / "person.json"
    schema_file.write_text(json.dumps(PERSON))
    grammar_file = tmp_path / "yes.gbnf"
    grammar_file.write_text('root ::= "yes" | "no"\n')
    assert _params(monkeypatch, ["--json-schema", str(schema_file)]).structured_outputs.schema == PERSON
    assert _params(monkeypatch, ["--json-schema", json.dumps(PERSON)]).structured_outputs.schema == PERSON
    spec = _params(monkeypatch, ["--json-object", "--max-whitespace", "0"]).structured_outputs
    assert (spec.kind, spec.max_whitespace) == ("json_object", 0)
    assert _params(monkeypatch, ["--json-object", "--max-whitespace", "-1"]).structured_outputs.max_whitespace is None
    assert _params(monkeypatch, ["--regex", "[0-9]+"]).structured_outputs.regex == "[0-9]+"
    assert _params(monkeypatch, ["--choice", "a,b", "--choice", "c"]).structured_outputs.choice == ("a", "b", "c")
    assert _params(monkeypatch, ["--grammar", str(grammar_file)]).structured_outputs.grammar.startswith("root ::=")
    assert _params(monkeypatch, []).structured_outputs is None


@pytest.mark.parametrize(("argv", "message"), [
    (["--json-schema", "{not json"], "--json-schema (read as inline JSON text, since it starts with '{') is not valid JSON"),
    (["--json-schema", "missing.json"], "--json-schema 'missing.json': no such file (a file path was meant; inline JSON must start"),
    (["--json-schema", '{"type": "frobnicate"}'], "--json-schema='{\"type\": \"frobnicate\"}' does not compile: Invalid type"),
    (["--json-schema", '{"type": "string"}', "--regex", "a"], "--json-schema, --regex cannot be combined"),
    (["--json-object", "--choice", "a"], "--json-object, --choice cannot be combined"),
    (["--regex", "("], "--regex='(' does not compile:"),
    (["--regex", "a(?=b)"], "look-around"),
    (["--regex", "[^\\s\\S]"], "cannot be satisfied"),
    (["--choice", "a,,b"], "--choice 'a,,b' has an empty choice (at position 2)"),
    (["--grammar", "missing.lark"], "--grammar 'missing.lark': no such file"),
    (["--max-whitespace", "2", "--regex", "a"], "--max-whitespace applies to --json-schema and --json-object only"),
    (["--max-whitespace", "-2", "--json-object"], "--max-whitespace -2 is out of range"),
    (["--json-object", "--ignore-eos"], "--ignore-eos cannot be combined with --json-object"),
    (["--beam-width", "2", "--regex", "a", "--temperature", "0.5"],
     "--beam-width cannot be combined with --temperature"),
    (["--beam-width", "2", "--json-object", "--ignore-eos"], "--ignore-eos cannot be combined with --json-object"),
])
def test_bad_constraints_are_one_line_errors_naming_the_flag(capsys, no_model, argv, message):
    assert main(["generate", "hi", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("metagen: error: ") and err.count("\n") == 1
    assert message in err


@pytest.mark.parametrize(("text", "kind"), [("start: start start\n", "Lark"), ('root ::= "a" (\n', "GBNF")])
def test_grammar_syntax_errors_name_the_flag_and_the_file_kind(capsys, no_model, tmp_path, text, kind):
    path = tmp_path / "bad.grammar"
    path.write_text(text)
    assert main(["generate", "hi", "--grammar", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("metagen: error: --grammar=") and err.count("\n") == 1
    assert ("GBNF" in err) == (kind == "GBNF")


def test_one_line_keeps_the_message_and_drops_the_source_diagram():
    message = "--regex='(' does not compile: at 1(8): invalid regex\n    (\n    ^\nerror: unclosed group\n   1 | start: /(/\n"
    assert one_line(message) == "--regex='(' does not compile: at 1(8): invalid regex ( error: unclosed group"


def test_token_healing_sets_the_field(monkeypatch):
    assert _params(monkeypatch, ["--token-healing"]).token_healing is True
    assert _params(monkeypatch, []).token_healing is False


@pytest.mark.slow
def test_generate_with_token_healing_continues_the_prompt_text(capsys):
    argv = ["generate", "The url is http:", "--no-chat", "--token-healing", "--temperature", "0",
            "--max-tokens", "6", "--json"]
    assert main(argv) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["text"].startswith("//")  # ":" was healed into "://", and is not repeated


@pytest.mark.slow
def test_token_healing_under_the_chat_template_is_refused_by_name(capsys):
    assert main(["generate", "The url is http:", "--chat", "--token-healing", "--max-tokens", "4"]) == 2
    assert "token_healing=True needs a prompt that ends with its own text" in capsys.readouterr().err


def test_eval_takes_a_constraint_for_every_sample(monkeypatch, tmp_path):
    import metagen.eval.running as running

    seen = {}

    def stop(models, problems, config, *args, **kwargs):
        seen["params"] = config.params
        raise KeyboardInterrupt

    monkeypatch.setattr(common, "load_model", lambda args: None)
    monkeypatch.setattr(running, "evaluate_models", stop)
    assert main(["eval", "--task", "arithmetic", "--count", "2", "--strategy", "self_consistency", "--n", "1",
                 "--regex", "[0-9]+"]) == 130
    assert seen["params"].structured_outputs.regex == "[0-9]+"


def test_eval_refuses_a_bad_constraint_naming_the_flag(capsys, no_model):
    assert main(["eval", "--task", "arithmetic", "--strategy", "self_consistency", "--choice", ","]) == 2
    assert "--choice ',' has an empty choice" in capsys.readouterr().err


@pytest.mark.slow
def test_generate_with_a_json_schema_file_prints_valid_json(capsys, tmp_path):
    jsonschema = pytest.importorskip("jsonschema")
    path = tmp_path / "person.json"
    path.write_text(json.dumps(PERSON))
    argv = ["generate", "Taylor Swift was born December 13, 1989. Give her name and birth date as JSON.",
            "--json-schema", str(path), "--temperature", "0", "--max-tokens", "80", "--json"]
    assert main(argv) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["finish_reason"] == "stop"
    person = json.loads(payload["text"])
    jsonschema.validate(person, PERSON)
    assert person["name"] == "Taylor Swift"


@pytest.mark.slow
@pytest.mark.parametrize("as_json", [False, True])
def test_an_output_cut_before_the_constraint_accepts_exits_3_and_says_so(capsys, as_json):
    argv = ["generate", "Reply in JSON.", "--json-object", "--temperature", "0", "--max-tokens", "3"]
    assert main(argv + (["--json"] if as_json else [])) == 3
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1
    assert "metagen: warning: the output ended (finish_reason 'length') before the constraint accepted it" in captured.err
    if as_json:
        payload = json.loads(captured.out)
        assert payload["complete"] is False and payload["finish_reason"] == "length"


def test_beam_width_takes_the_constraint_flags(monkeypatch):
    import metagen.cli.generate as generate

    seen = {}
    monkeypatch.setattr(common, "load_model", lambda args: None)
    monkeypatch.setattr(generate, "_beam_search",
                        lambda args, model, prompt, config, load, combiner=None: seen.setdefault("c", config) and 0)
    assert main(["generate", "hi", "--beam-width", "3", "--regex", "[ab]+", "--max-tokens", "7"]) == 0
    config = seen["c"]
    assert (config.width, config.max_tokens, config.structured_outputs.regex) == (3, 7, "[ab]+")


@pytest.mark.slow
def test_beam_search_with_a_json_schema_prints_valid_json_and_a_cut_one_exits_3(capsys):
    jsonschema = pytest.importorskip("jsonschema")
    argv = ["generate", "Taylor Swift was born December 13, 1989. Give her name and birth date as JSON.",
            "--json-schema", json.dumps(PERSON), "--beam-width", "2", "--max-tokens", "60", "--json"]
    assert main(argv) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["complete"] is True and payload["finish_reason"] == "stop"
    jsonschema.validate(json.loads(payload["text"]), PERSON)
    assert main(["generate", "Reply in JSON.", "--json-object", "--beam-width", "2", "--max-tokens", "3"]) == 3
    assert "before the constraint accepted it" in capsys.readouterr().err


@pytest.mark.slow
def test_n_outputs_say_which_were_cut(capsys):
    argv = ["generate", "Pick one.", "--choice", "yes,no,a much longer answer that needs many tokens",
            "--temperature", "1", "--seed", "0", "--n", "8", "--max-tokens", "2", "--json"]
    code = main(argv)
    captured = capsys.readouterr()
    completions = json.loads(captured.out)["completions"]
    cut = [i for i, c in enumerate(completions) if c["complete"] is False]
    assert all(c["text"] in ("yes", "no") for c in completions if c["complete"])
    assert cut and code == 3  # the long choice takes more than 2 tokens; the model starts it here
    assert f"completions {', '.join(map(str, cut))} ended" in captured.err


def test_a_constraint_reaches_a_backend_and_a_kind_it_lacks_is_refused(capsys):
    pytest.importorskip("httpx")
    from tests.remote.fake_server import FakeServer

    with FakeServer("llama.cpp") as server:  # llama-cpp-python: response_format on chat, GBNF grammar
        server.constrained_text = '{"ok": true}'
        assert main(["generate", "--backend", server.url, "Reply in JSON.", "--chat", "--json-object",
                     "--max-tokens", "8"]) == 0
        assert server.posts()[-1]["response_format"] == {"type": "json_object"}
        assert capsys.readouterr().out == '{"ok": true}\n'
        server.constrained_finish = "length"
        assert main(["generate", "--backend", server.url, "Reply in JSON.", "--chat", "--json-object",
                     "--max-tokens", "8"]) == 3
        assert "before the constraint accepted it" in capsys.readouterr().err
        assert main(["generate", "--backend", server.url, "Reply.", "--regex", "[a-z]+"]) == 2
        err = capsys.readouterr().err
    assert err.startswith("metagen: error: --regex is not supported by llama.cpp's OpenAI-compatible server")
    assert err.count("\n") == 1


def test_answer_field_needs_a_strategy_and_excludes_pattern(capsys, no_model):
    assert main(["generate", "hi", "--answer-field", "answer"]) == 2
    assert "--answer-field applies to --strategy" in capsys.readouterr().err
    assert main(["eval", "--task", "arithmetic", "--strategy", "self_consistency", "--pattern", "x",
                 "--answer-field", "answer"]) == 2
    assert "pattern='x' and answer_field='answer' both say where the answer is" in capsys.readouterr().err


@pytest.mark.slow
def test_self_consistency_over_a_json_field_from_the_command_line(capsys):
    schema = {"type": "object", "properties": {"answer": {"type": "integer", "minimum": 0, "maximum": 20}},
              "required": ["answer"], "additionalProperties": False}
    argv = ["generate", "What is 2 + 3? Reply as JSON with the field answer.", "--strategy", "self_consistency",
            "--n", "4", "--seed", "0", "--json-schema", json.dumps(schema), "--answer-field", "answer",
            "--max-tokens", "24", "--json"]
    assert main(argv) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["chosen"]["complete"] is True
    assert payload["chosen"]["answer"] == str(json.loads(payload["chosen"]["text"])["answer"])
    assert sum(payload["votes"].values()) == sum(1 for c in payload["candidates"] if c["complete"])
