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
