"""`metagen generate --adadec`: refusals by name before loading, and a short run of the embedded model."""

from __future__ import annotations

import json

import pytest

from metagen.cli import main

PROMPT = "def add(a, b):"


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--adadec-threshold", "2"], "--adadec-threshold only apply with --adadec"),
        (["--adadec-candidates", "4", "--adadec-lookahead", "3"],
         "--adadec-candidates, --adadec-lookahead only apply with --adadec"),
        (["--adadec"], "--adadec needs --adadec-threshold BITS"),
        (["--adadec", "--adadec-threshold", "-1"], "threshold=-1.0 is out of range"),
        (["--adadec", "--adadec-threshold", "1", "--adadec-candidates", "1"], "candidates=1 is out of range"),
        (["--adadec", "--adadec-threshold", "1", "--adadec-lookahead", "0"], "lookahead=0 is out of range"),
        (["--adadec", "--adadec-threshold", "1", "--beam-width", "2"], "--adadec cannot be combined with --beam-width"),
        (["--adadec", "--adadec-threshold", "1", "--contrastive", "early-exit:4"],
         "--adadec cannot be combined with --contrastive"),
        (["--adadec", "--adadec-threshold", "1", "--entropy-adaptive", "embedded", "--entropy-threshold", "1"],
         "--adadec cannot be combined with --entropy-adaptive"),
        (["--adadec", "--adadec-threshold", "1", "--superposed", "3"], "--adadec cannot be combined with --superposed"),
        (["--adadec", "--adadec-threshold", "1", "--backend", "http://localhost:1"],
         "--adadec cannot be combined with --backend"),
        (["--adadec", "--adadec-threshold", "1", "--speculative", "ngram"],
         "--adadec cannot be combined with --speculative"),
        (["--adadec", "--adadec-threshold", "1", "--strategy", "best_of_n"],
         "--adadec cannot be combined with --strategy"),
    ],
)
def test_adadec_options_are_refused_by_name_before_loading(capsys, argv, named):
    assert main(["generate", PROMPT, *argv]) == 2
    assert named in capsys.readouterr().err


@pytest.mark.slow
def test_embedded_model_with_adadec_reports_its_lookahead_steps(capsys):
    argv = ["generate", PROMPT, "--no-chat", "--temperature", "0", "--max-tokens", "4", "--ignore-eos", "--json",
            "--adadec", "--adadec-threshold", "0", "--adadec-candidates", "2", "--adadec-lookahead", "1"]
    assert main(argv) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["lookahead_steps"] == 4  # τ = 0: every step pauses
    # 1 prefill + 3 decode forwards, and a lookahead forward at each of the first 3 steps (the last
    # step's candidates end their rows at --max-tokens)
    assert payload["cost"]["model_calls"] == 4 + 3
