"""`metagen generate --contrastive AMATEUR`: refusals by name, and one run of the embedded model
with its own first layers as the amateur."""

from __future__ import annotations

import json

import pytest

from metagen.cli import main

PROMPT = "The capital of France is"


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--alpha", "0.2"], "--alpha only apply with --contrastive AMATEUR"),
        (["--amateur-temperature", "0.5"], "--amateur-temperature only apply with --contrastive"),
        (["--beta", "0.5"], "--beta only apply with --contrastive AMATEUR"),
        (["--alpha", "0.2", "--beta", "0.5"], "--alpha, --beta only apply with --contrastive"),
        (["--contrastive", "early-exit:8", "--beta", "-1"], "beta=-1.0 is out of range: must be None or a finite"),
        (["--contrastive", "early-exit:8", "--backend", "http://localhost:1"],
         "--contrastive cannot be combined with --backend"),
        (["--contrastive", "early-exit:8", "--speculative", "ngram"], "--contrastive cannot be combined with --speculative"),
        (["--contrastive", "early-exit:8", "--strategy", "best_of_n"], "--contrastive cannot be combined with --strategy"),
        (["--contrastive", "early-exit:8", "--alpha", "1.5"], "alpha=1.5 is out of range"),
        (["--contrastive", "early-exit:8", "--amateur-temperature", "0"], "amateur_temperature=0.0 is out of range"),
        (["--contrastive", "early-exit:x"], "early-exit:L needs L"),
    ],
)
def test_contrastive_options_are_refused_by_name_before_loading(capsys, argv, named):
    assert main(["generate", PROMPT, *argv]) == 2
    assert named in capsys.readouterr().err


@pytest.mark.slow
def test_embedded_model_with_its_early_exit_amateur_runs_end_to_end(capsys):
    argv = ["generate", PROMPT, "--no-chat", "--contrastive", "early-exit:8", "--alpha", "0.1",
            "--temperature", "0", "--max-tokens", "4", "--json"]
    assert main(argv) == 0
    payload = json.loads(capsys.readouterr().out)
    assert 1 <= len(payload["tokens"]) <= 4 and payload["text"]
    cost = payload["cost"]
    # two models per forward (expert and amateur), the expert's target steps
    assert cost["model_calls"] == 2 * cost["target_steps"] == 2 * len(payload["tokens"])
    assert main(["generate", PROMPT, "--contrastive", "early-exit:99", "--max-tokens", "2"]) == 2
    assert "num_layers=99 is out of range" in capsys.readouterr().err


def test_beta_reaches_the_combiner(monkeypatch):
    import metagen.cli.contrastive as cli_contrastive
    from metagen.cli import build_parser

    args = build_parser().parse_args(["generate", PROMPT, "--contrastive", "other", "--beta", "0.5"])
    options = cli_contrastive.contrastive_options(args)
    assert options["beta"] == 0.5
    amateur = object()
    monkeypatch.setattr(cli_contrastive, "load_companion", lambda flag, spec, model, args: amateur)
    combiner = cli_contrastive.make_combiner(options, None, args)
    assert (combiner.amateur, combiner.alpha, combiner.beta) == (amateur, 0.1, 0.5)
    plain = build_parser().parse_args(["generate", PROMPT, "--contrastive", "other"])
    assert cli_contrastive.contrastive_options(plain)["beta"] is None
