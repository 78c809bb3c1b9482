"""`metagen compress` then the saved model through `perplexity`, `generate` and `info`."""

import json

import pytest

from metagen.cli import main

TEXT = ("It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of "
        "foolishness, it was the epoch of belief, it was the epoch of incredulity. ") * 8


@pytest.fixture
def texts(tmp_path):
    calibration, data = tmp_path / "calibration.txt", tmp_path / "data.txt"
    calibration.write_text(TEXT)
    data.write_text("Call me Ishmael. Some years ago, never mind how long precisely, having little money. " * 4)
    return calibration, data


def test_compress_then_use_the_model_everywhere(tiny_checkpoint, texts, tmp_path, capsys):
    calibration, data = texts
    out = tmp_path / "gptq"
    assert main(["compress", str(tiny_checkpoint), "--method", "gptq", "--bits", "4", "--calibration",
                 str(calibration), "--samples", "3", "--seq-len", "32", "--out", str(out)]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["recipe"]["method"] == "gptq" and record["calibration"]["samples"] == 3
    assert json.loads((out / "recipe.json").read_text())["calibration_tokens"] == 96
    assert main(["perplexity", "--model", str(out), "--data", str(data), "--window", "32", "--stride", "16",
                 "--json"]) == 0
    facts = json.loads(capsys.readouterr().out)
    assert facts["perplexity"] > 1 and facts["tokens"] > 16
    assert main(["generate", "Hello", "--model", str(out), "--no-chat", "--temperature", "0", "--max-tokens", "3"]) == 0
    assert main(["info", "--model", str(out), "--json"]) == 0
    info = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert info["dtype"] == "int4" and "int4 from gptq int4" in info["weights"]["qkv"]


@pytest.mark.parametrize("argv,named", [
    (["--method", "gptq", "--bits", "4"], "needs --calibration"),
    (["--method", "rtn", "--bits", "4", "--calibration", "CAL"], "data-free"),
    (["--method", "magnitude", "--sparsity", "half"], "--sparsity 'half'"),
    (["--method", "magnitude", "--sparsity", "1.5"], "sparsity=1.5"),
    (["--method", "sparsegpt", "--sparsity", "4:2", "--calibration", "CAL"], "N:M = 4:2"),
])
def test_bad_options_exit_2_naming_them(tiny_checkpoint, texts, tmp_path, capsys, argv, named):
    argv = [str(texts[0]) if part == "CAL" else part for part in argv]
    assert main(["compress", str(tiny_checkpoint), *argv, "--out", str(tmp_path / "o")]) == 2
    assert named in capsys.readouterr().err


def test_perplexity_refuses_a_missing_file(capsys):
    assert main(["perplexity", "--data", "/nonexistent.txt"]) == 2
    assert "--data '/nonexistent.txt' is not a file" in capsys.readouterr().err
