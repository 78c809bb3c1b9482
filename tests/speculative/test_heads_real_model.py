"""Medusa heads and SpecDec++ stop heads on the embedded SmolLM2-135M: greedy output equals
plain greedy output, saved files refuse another model or draft, and the training commands
write files that `metagen generate --speculative` reads."""

from __future__ import annotations

import json

import pytest

from metagen.cli import main
from metagen.speculative import SpeculativeConfig, SpeculativeGenerator, early_exit_model, make_drafter
from metagen.speculative.medusa import MedusaHeads
from metagen.speculative.medusa_training import train_medusa_heads
from metagen.speculative.stop_head import StopHead
from metagen.speculative.stop_training import train_stop_head

from tests.speculative.test_real_model import PROMPTS, assert_same_greedy

pytestmark = pytest.mark.slow

EXIT_LAYER = 12
TEXTS = ["The sky is blue because sunlight scatters off air molecules, and blue light scatters most.",
         "def add(a, b):\n    return a + b\n\nprint(add(2, 3))",
         "Photosynthesis turns light, water and carbon dioxide into sugar and oxygen in plants.",
         "To make pancakes, mix flour, milk, eggs and a pinch of salt, then fry in a hot pan.",
         "The French Revolution began in 1789 with the storming of the Bastille in Paris.",
         "A prime number has exactly two divisors: one and itself. Two is the only even prime."]


@pytest.fixture(scope="module")
def medusa_file(model_fp32, tmp_path_factory):
    heads, report = train_medusa_heads(model_fp32, TEXTS, num_heads=3, held_out=0.34)
    assert report.train_positions > 0 and len(report.agreement_after) == 3
    path = tmp_path_factory.mktemp("medusa") / "heads.safetensors"
    heads.save(path)
    return str(path)


@pytest.fixture(scope="module")
def stop_file(model_fp32, tmp_path_factory):
    sequences = [model_fp32.tokenizer.encode(text) for text in TEXTS]
    head, _ = train_stop_head(model_fp32, early_exit_model(model_fp32, EXIT_LAYER), sequences, steps=30,
                              held_out=0.34)
    path = tmp_path_factory.mktemp("stop") / "stop.safetensors"
    head.save(path)
    return str(path)


def test_medusa_greedy_equals_plain_greedy(model_fp32, medusa_file):
    drafter = make_drafter(f"medusa:{medusa_file}", model_fp32)
    spec = assert_same_greedy(model_fp32, drafter, PROMPTS["grounded"],
                              SpeculativeConfig(num_draft_tokens=3, verify="multi-draft"), max_tokens=32)
    assert spec.cost.draft_tokens > 0


def test_stop_head_greedy_equals_plain_greedy(model_fp32, stop_file):
    drafter = make_drafter("early-exit", model_fp32, exit_layer=EXIT_LAYER, stop_head=stop_file, stop_threshold=0.7)
    assert drafter.stop_head is not None and drafter.stop_threshold == 0.7
    spec = assert_same_greedy(model_fp32, drafter, PROMPTS["grounded"], SpeculativeConfig(num_draft_tokens=8),
                              max_tokens=32)
    assert spec.cost.draft_tokens > 0


def test_files_refuse_another_model_or_draft(model, model_fp32, medusa_file, stop_file):
    with pytest.raises(ValueError, match="dtype='fp32'"):
        MedusaHeads.load(medusa_file, model)
    with pytest.raises(ValueError, match="first 12 layers.*first 10 layers"):
        StopHead.load(stop_file, model_fp32, early_exit_model(model_fp32, 10))
    with pytest.raises(ValueError, match="dtype='fp32'"):
        make_drafter("early-exit", model, exit_layer=EXIT_LAYER, stop_head=stop_file)
    with pytest.raises(ValueError, match="not a metagen Medusa heads file"):
        MedusaHeads.load(stop_file, model_fp32)


def test_generator_by_name_verifies_medusa_with_the_tree_rule(model_fp32, medusa_file):
    generator = SpeculativeGenerator.by_name(model_fp32, f"medusa:{medusa_file}")
    assert generator.config.verify == "multi-draft" and generator.drafter.proposes_trees
    with pytest.raises(ValueError, match="cannot verify"):
        SpeculativeGenerator.by_name(model_fp32, f"medusa:{medusa_file}", SpeculativeConfig(verify="token"))


def test_cli_trains_heads_that_generate_reads(tmp_path, capsys):
    medusa, stop = tmp_path / "medusa.safetensors", tmp_path / "stop.safetensors"
    assert main(["train-medusa", "--heads", "2", "--out", str(medusa), "--tokens-per-prompt", "3"]) == 0
    assert "head 2:" in capsys.readouterr().out
    assert main(["train-stop-head", "--exit-layer", "12", "--out", str(stop), "--tokens-per-prompt", "3",
                 "--steps", "5"]) == 0
    assert "stop head for" in capsys.readouterr().out
    for argv in (["--speculative", f"medusa:{medusa}"],
                 ["--speculative", "early-exit", "--exit-layer", "12", "--draft-stop-head", str(stop),
                  "--stop-threshold", "0.6", "--num-draft-tokens", "8"]):
        assert main(["generate", "Name a colour.", "--temperature", "0", "--max-tokens", "8", "--json", *argv]) == 0
        summary = json.loads(capsys.readouterr().out)["speculative"]
        assert summary["target_steps"] >= 1 and summary["draft_tokens"] >= 0
    assert main(["train-stop-head", "--speculative", "ngram", "--out", str(stop)]) == 2
    assert "does not draft chains from a model" in capsys.readouterr().err
    assert main(["generate", "Hi", "--stop-threshold", "0.5"]) == 2
    assert "--stop-threshold only apply with --speculative" in capsys.readouterr().err
