"""`metagen generate --beam-width` with diverse beam search (--beam-groups, --diversity-penalty,
--diversity, --diversity-ngram) and --n hypotheses, on the enumerable toy model."""

from __future__ import annotations

import json

import pytest

from metagen.cli import common, main
from metagen.decoding import BeamSearchConfig, beam_search

from tests.decoding.toy_model import ToyModel

DIVERSE = ["--beam-width", "4", "--beam-groups", "2", "--diversity-penalty", "0.5"]


@pytest.fixture
def toy(monkeypatch):
    monkeypatch.setattr(common, "load_model", lambda args: ToyModel())


def test_diverse_beam_search_on_the_command_line_is_the_library_call(toy, capsys):
    argv = ["generate", "a", "--no-chat", *DIVERSE, "--n", "4", "--max-tokens", "4", "--length-penalty", "0", "--json"]
    assert main(argv) == 0
    payload = json.loads(capsys.readouterr().out)
    config = BeamSearchConfig(width=4, groups=2, diversity_penalty=0.5, n_best=4, max_tokens=4, length_penalty=0.0)
    library = beam_search(ToyModel(), "a", config, chat=False).completions
    assert [h["tokens"] for h in payload["completions"]] == [h.token_ids for h in library]
    assert [h["score"] for h in payload["completions"]] == pytest.approx([h.score for h in library], abs=1e-6)
    plain = BeamSearchConfig(width=4, n_best=4, max_tokens=4, length_penalty=0.0)
    plain_hypotheses = beam_search(ToyModel(), "a", plain, chat=False).completions
    assert [h.token_ids for h in library] != [h.token_ids for h in plain_hypotheses]
    assert payload["cost"]["model_calls"] == payload["timing"]["model_calls"]


def test_ngram_diversity_and_the_hypotheses_as_text(toy, capsys):
    argv = ["generate", "a", "--no-chat", *DIVERSE, "--diversity", "ngram", "--diversity-ngram", "2", "--n", "2",
            "--max-tokens", "3"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.count("--- hypothesis ") == 2
    config = BeamSearchConfig(width=4, groups=2, diversity_penalty=0.5, diversity="ngram", diversity_ngram=2,
                              n_best=2, max_tokens=3)
    for hypothesis in beam_search(ToyModel(), "a", config, chat=False).completions:
        assert f"score {hypothesis.score:.4f}" in out


@pytest.mark.parametrize(("argv", "message"), [
    (["--beam-groups", "2"], "--beam-groups applies to beam search only: add --beam-width N"),
    (["--diversity-penalty", "0.5", "--diversity", "ngram"],
     "--diversity-penalty, --diversity apply to beam search only"),
    (["--beam-width", "4", "--beam-groups", "3"], "groups=3 is out of range: must divide width=4"),
    (["--beam-width", "4", "--diversity-penalty", "0.5"], "diversity_penalty=0.5 needs groups > 1"),
    ([*DIVERSE, "--diversity-ngram", "3"], "diversity_ngram=3 applies to diversity='ngram' only"),
    ([*DIVERSE, "--n", "5"], "--n 5 is out of range with --beam-width 4"),
    ([*DIVERSE, "--temperature", "0.7"], "--beam-width cannot be combined with --temperature"),
    ([*DIVERSE, "--backend", "http://localhost:1/v1"], "--beam-width configure the local model"),
])
def test_wrong_combinations_are_refused_by_name_before_loading(monkeypatch, capsys, argv, message):
    monkeypatch.setattr(common, "load_model", lambda args: pytest.fail("the model was loaded before the check"))
    assert main(["generate", "a", "--no-chat", *argv]) == 2
    assert message in capsys.readouterr().err
