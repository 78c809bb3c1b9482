"""What one request may ask of the engine, against a real `metagen serve`: a constraint past the
constraint engine's limits is a 400 naming the field and the limit (it was a 500 once decoding
started), and `--prefill-chunk` is checked before the model loads."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")

pytestmark = pytest.mark.slow

MANY_OBJECTS = {"anyOf": [{"type": "object", "properties": {f"k{i}": {"type": "integer"}}, "required": [f"k{i}"]}
                          for i in range(3000)]}


@pytest.mark.parametrize("extra, param, message", [
    ({"structured_outputs": {"choice": [f"option {i}" for i in range(3000)]}}, "structured_outputs.choice",
     "has 3000 strings, over the constraint engine's limit of 1999"),
    ({"structured_outputs": {"grammar": 'start: "a"{100000}'}}, "structured_outputs.grammar", "limit 50000"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": MANY_OBJECTS}}},
     "response_format.json_schema.schema", "max is 2000"),
])
def test_constraints_past_the_engine_limits_are_400_naming_the_field(client, served_model, extra, param, message):
    with pytest.raises(openai.BadRequestError) as raised:
        client.completions.create(model=served_model, prompt="Pick one:", max_tokens=4, extra_body=extra)
    error = raised.value
    assert error.status_code == 400 and error.body["type"] == "invalid_request_error"
    assert error.param == param and message in error.message and "limit" in error.message
    answer = client.completions.create(model=served_model, prompt="Pick one:", max_tokens=3,
                                       extra_body={"structured_outputs": {"choice": ["red", "green"]}})
    assert answer.choices[0].text in ("red", "green")  # the server goes on answering


def test_prefill_chunk_is_checked_before_the_model_loads(monkeypatch, capsys):
    from metagen.cli import common, main

    monkeypatch.setattr(common, "load_model", lambda args: pytest.fail("the model was loaded"))
    assert main(["serve", "--prefill-chunk", "0"]) == 2
    assert "--prefill-chunk 0 must be >= 1" in capsys.readouterr().err
    assert main(["serve", "--backend", "http://127.0.0.1:9/v1", "--prefill-chunk", "64"]) == 2
    assert "--prefill-chunk configure the local model" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--speculative", "nope"], "speculative drafter 'nope' is unknown"),
    (["--speculative", "ngram", "--exit-layer", "4"], "exit_layer=4 does not apply to the ngram drafter"),
    (["--speculative", "recycling", "--verify", "token"], "verify='token' cannot verify"),
    (["--num-draft-tokens", "3"], "--num-draft-tokens only apply with --speculative DRAFTER"),
    (["--speculative", "ngram", "--contrastive", "early-exit:8"], "--speculative ngram cannot be combined with "
                                                                  "--contrastive"),
    (["--speculative", "ngram", "--dexperts", "early-exit:8,early-exit:4"], "cannot be combined with --dexperts"),
    (["--speculative", "ngram", "--backend", "http://127.0.0.1:9/v1"], "--speculative configure the local model"),
])
def test_what_serve_cannot_draft_with_is_refused_by_name_before_the_model_loads(monkeypatch, capsys, argv, message):
    """The engine drafts with the model-free drafters only (a drafter's own model would need its
    cache to follow the batch), not with a combiner, and not in proxy mode; each is refused with
    the reason before any model loads."""
    from metagen.cli import common, main

    monkeypatch.setattr(common, "load_model", lambda args: pytest.fail("the model was loaded"))
    assert main(["serve", *argv]) == 2
    assert message in capsys.readouterr().err
