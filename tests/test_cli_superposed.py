"""`metagen generate --superposed K`: refusals by name before loading, and one run of the
embedded model whose drafts and Cost are the library call's."""

from __future__ import annotations

import json

import pytest

from metagen.cli import main

PROMPT = "The history of the printing press begins in"


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--lm-weight", "0.5"], "--lm-weight only apply with --superposed K"),
        (["--ngram-corpus", "x.txt", "--no-prompt-ngrams"], "--ngram-corpus, --prompt-ngrams only apply with --superposed"),
        (["--ngram-weights", "1,2"], "--ngram-weights only apply with --superposed K"),
        (["--superposed", "0"], "--superposed 0 is out of range: must be >= 1"),
        (["--superposed", "3", "--temperature", "0.7"], "--superposed cannot be combined with --temperature"),
        (["--superposed", "3", "--n", "3"], "--superposed cannot be combined with --n"),
        (["--superposed", "3", "--json-object"], "--superposed cannot be combined with --json-object"),
        (["--superposed", "3", "--beam-width", "2"], "--superposed cannot be combined with --beam-width"),
        (["--superposed", "3", "--contrastive", "early-exit:8"], "--superposed cannot be combined with --contrastive"),
        (["--superposed", "3", "--speculative", "ngram"], "--superposed cannot be combined with --speculative"),
        (["--superposed", "3", "--strategy", "best_of_n"], "--superposed cannot be combined with --strategy"),
        (["--superposed", "3", "--backend", "http://localhost:1"], "--superposed cannot be combined with --backend"),
        (["--superposed", "3", "--lm-weight", "1.5"], "lm_weight=1.5 is out of range"),
        (["--superposed", "3", "--ngram-weights", "0.5,x"], "--ngram-weights '0.5,x' must be comma-separated numbers"),
        (["--superposed", "3", "--ngram-weights", "0,0"], "order_weights=(0.0, 0.0) is out of range"),
        (["--superposed", "3", "--ngram-corpus", "/no/such/file.txt"], "--ngram-corpus '/no/such/file.txt' does not exist"),
        (["--superposed", "3", "--lm-weight", "1", "--ngram-corpus", "x.txt"],
         "--ngram-corpus has no effect with --lm-weight 1"),
    ],
)
def test_superposed_options_are_refused_by_name_before_loading(capsys, argv, named):
    assert main(["generate", PROMPT, *argv]) == 2
    assert named in capsys.readouterr().err


@pytest.mark.slow
def test_the_command_line_prints_the_library_calls_drafts(capsys, tmp_path, model):
    from metagen.decoding import SuperposedConfig, superposed_decode

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("The printing press was invented by Johannes Gutenberg.\nBooks became cheaper.\n")
    argv = ["generate", PROMPT, "--no-chat", "--superposed", "3", "--max-tokens", "6", "--lm-weight", "0.5",
            "--ngram-corpus", str(corpus), "--ngram-weights", "0.2,0.8", "--json"]
    assert main(argv) == 0
    payload = json.loads(capsys.readouterr().out)
    expected = superposed_decode(model, PROMPT, 3, corpus=corpus, chat=False,
                                 config=SuperposedConfig(lm_weight=0.5, order_weights=(0.2, 0.8), max_tokens=6))
    assert [d["tokens"] for d in payload["completions"]] == [c.token_ids for c in expected.completions]
    assert [d["score"] for d in payload["completions"]] == pytest.approx([c.score for c in expected.completions])
    assert payload["cost"]["model_calls"] == expected.cost.model_calls <= 6
