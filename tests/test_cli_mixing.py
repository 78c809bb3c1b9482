"""`metagen generate --dexperts EXPERT,ANTI` and `--entropy-adaptive LARGE`: refusals by name, and
short runs of the embedded model with its own first layers as the other models."""

from __future__ import annotations

import json

import pytest

from metagen.cli import main

PROMPT = "The capital of France is"


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--dexperts-alpha", "2"], "--dexperts-alpha only apply with --dexperts EXPERT,ANTI"),
        (["--entropy-threshold", "2"], "--entropy-threshold only apply with --entropy-adaptive LARGE"),
        (["--entropy-window", "3"], "--entropy-window only apply with --entropy-adaptive LARGE"),
        (["--dexperts", "early-exit:8"], "needs two models, EXPERT,ANTI"),
        (["--dexperts", "early-exit:8,"], "needs two models, EXPERT,ANTI"),
        (["--dexperts", "early-exit:8,early-exit:x"], "--dexperts 'early-exit:x': early-exit:L needs L"),
        (["--dexperts", "early-exit:8,early-exit:4", "--dexperts-alpha", "-1"], "alpha=-1.0 is out of range"),
        (["--dexperts", "early-exit:8,early-exit:4", "--contrastive", "early-exit:4"],
         "--dexperts cannot be combined with --contrastive"),
        (["--dexperts", "early-exit:8,early-exit:4", "--entropy-adaptive", "embedded", "--entropy-threshold", "1"],
         "--dexperts cannot be combined with --entropy-adaptive"),
        (["--dexperts", "early-exit:8,early-exit:4", "--backend", "http://localhost:1"],
         "--dexperts cannot be combined with --backend"),
        (["--dexperts", "early-exit:8,early-exit:4", "--speculative", "ngram"],
         "--dexperts cannot be combined with --speculative"),
        (["--dexperts", "early-exit:8,early-exit:4", "--strategy", "best_of_n"],
         "--dexperts cannot be combined with --strategy"),
        (["--entropy-adaptive", "main", "--entropy-threshold", "1"],
         "--entropy-adaptive main: needs another model than --model (the model would hand over to itself)"),
        (["--contrastive", "main"], "--contrastive main: needs another model than --model"),
        (["--entropy-adaptive", "embedded"], "--entropy-adaptive needs --entropy-threshold"),
        (["--entropy-adaptive", "embedded", "--entropy-threshold", "-1"], "threshold=-1.0 is out of range"),
        (["--entropy-adaptive", "embedded", "--entropy-threshold", "1", "--entropy-window", "0"],
         "window=0 is out of range"),
        (["--entropy-adaptive", "early-exit:0", "--entropy-threshold", "1"], "early-exit:L needs L"),
        (["--entropy-adaptive", "embedded", "--entropy-threshold", "1", "--contrastive", "early-exit:4"],
         "--entropy-adaptive cannot be combined with --contrastive"),
        (["--entropy-adaptive", "embedded", "--entropy-threshold", "1", "--backend", "http://localhost:1"],
         "--entropy-adaptive cannot be combined with --backend"),
        (["--entropy-adaptive", "embedded", "--entropy-threshold", "1", "--speculative", "ngram"],
         "--entropy-adaptive cannot be combined with --speculative"),
        (["--entropy-adaptive", "embedded", "--entropy-threshold", "1", "--strategy", "best_of_n"],
         "--entropy-adaptive cannot be combined with --strategy"),
        (["--entropy-adaptive", "embedded", "--entropy-threshold", "1", "--beam-width", "2"],
         "--entropy-adaptive cannot be combined with --beam-width"),
    ],
)
def test_mixing_options_are_refused_by_name_before_loading(capsys, argv, named):
    assert main(["generate", PROMPT, *argv]) == 2
    assert named in capsys.readouterr().err


@pytest.mark.slow
def test_embedded_model_steered_by_its_early_exit_experts_runs_end_to_end(capsys):
    argv = ["generate", PROMPT, "--no-chat", "--dexperts", "early-exit:20,early-exit:8", "--dexperts-alpha", "0.5",
            "--temperature", "0", "--max-tokens", "3", "--json"]
    assert main(argv) == 0
    payload = json.loads(capsys.readouterr().out)
    assert 1 <= len(payload["tokens"]) <= 3 and payload["text"]
    cost = payload["cost"]
    assert cost["model_calls"] == 3 * cost["target_steps"] == 3 * len(payload["tokens"])


@pytest.mark.slow
def test_dexperts_with_the_model_as_its_own_expert_runs_one_forward_less_per_step(capsys):
    argv = ["generate", PROMPT, "--no-chat", "--dexperts", "main,early-exit:8", "--dexperts-alpha", "0.5",
            "--temperature", "0", "--max-tokens", "3", "--json"]
    assert main(argv) == 0
    payload = json.loads(capsys.readouterr().out)
    cost = payload["cost"]
    assert 1 <= len(payload["tokens"]) <= 3
    assert cost["model_calls"] == 2 * cost["target_steps"] == 2 * len(payload["tokens"])


@pytest.mark.slow
def test_early_exit_small_model_with_the_embedded_model_as_large_runs_end_to_end(capsys):
    # the small model is the embedded model's first 8 layers: --model embedded --entropy-adaptive
    # names the large one, so the small one is loaded as --model's early-exit form here
    from metagen.decoding import EntropyAdaptiveConfig, generate
    from metagen.models import load
    from metagen.sampling import SamplingParams

    large = load(None)
    small = large.truncated(8)
    config = EntropyAdaptiveConfig(large, threshold=2.0, window=2)
    result = generate(small, PROMPT, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True), chat=False,
                      combiner=config)
    tokens = result.completions[0].token_ids
    assert sum(result.model_tokens.values()) == len(tokens) == 6
    assert result.model_tokens["small"] > 0 and result.model_tokens["large"] > 0  # both models gave tokens
    # the small model ran at every step; the large one only at the steps it gave a token (its
    # first time the prompt too), so fewer calls than a forward per step
    large_calls = result.cost.model_calls - len(tokens)
    assert 1 < large_calls <= result.model_tokens["large"] + 1 < len(tokens) + 1
    argv = ["generate", PROMPT, "--no-chat", "--entropy-adaptive", "embedded", "--entropy-threshold", "0",
            "--temperature", "0", "--max-tokens", "3", "--json"]
    assert main(argv) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["model_tokens"] == {"small": 0, "large": len(payload["tokens"])}
