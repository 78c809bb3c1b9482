"""`metagen eval --cascade SMALL,LARGE --cascade-threshold TAU,...` and `--difficulty-round K`: the
policies' points and figures in the report, and every bad use refused by its flag before any model loads."""

from __future__ import annotations

import json

import pytest

from metagen.cli import main
from tests.eval.test_eval_cli import BASE, _error, loads  # noqa: F401 - the toy-model load fixture


def _weights(path, seed: int) -> str:
    path.write_bytes(b"GGUF" + bytes((seed + i) % 256 for i in range(4096)))
    return str(path)


def test_a_cascade_of_two_swept_models_is_reported_per_threshold(tmp_path, capsys, loads):
    a, b = _weights(tmp_path / "a.gguf", 1), _weights(tmp_path / "b.gguf", 2)
    argv = [*BASE, "--model", a, "--model", b, "--cascade", "a,b", "--cascade-threshold", "0.5,1"]
    assert main(argv) == 0, capsys.readouterr().err
    rows = json.loads(capsys.readouterr().out)["results"]
    cascades = {(row["strategy"], row["n"]): row for row in rows if row["strategy"].startswith("cascade")}
    assert set(cascades) == {(f"cascade(a→b, τ {tau})", n) for tau in ("0.5", "1") for n in (1, 2)}
    for row in cascades.values():
        assert 0.0 <= row["escalated"] <= 1.0 and row["cost"]["flops"] > 0
    small = {row["n"]: row for row in rows if row["model"] == "a" and row["strategy"] == "self_consistency"}
    # τ 1 escalates every vote short of unanimity: never cheaper than the small model alone
    assert cascades[("cascade(a→b, τ 1)", 2)]["cost"]["flops"] >= small[2]["cost"]["flops"] * (1 - 1e-12)


@pytest.mark.parametrize("argv, named", [
    (["--cascade", "a,b"], "--cascade needs at least two models in the sweep"),
    (["--cascade-threshold", "0.5"], "--cascade-threshold applies with --cascade SMALL,LARGE"),
    (["--model", "A", "--model", "B", "--cascade", "a"], "--cascade 'a' must be two model labels, SMALL,LARGE"),
    (["--model", "A", "--model", "B", "--cascade", "a,a"], "--cascade 'a,a' names one model twice"),
    (["--model", "A", "--model", "B", "--cascade", "a,b", "--cascade-threshold", "1.5"],
     "--cascade-threshold 1.5 is out of range: must be in (0, 1]"),
    (["--model", "A", "--model", "B", "--cascade", "a,b", "--cascade-threshold", "x"],
     "--cascade-threshold 'x' must be a comma-separated list"),
])
def test_bad_cascades_are_refused_by_flag(tmp_path, capsys, loads, argv, named):
    argv = [str(tmp_path / a) if a in ("A", "B") else a for a in argv]
    for path in argv:
        if path.startswith(str(tmp_path)):
            _weights(tmp_path / path.rsplit("/", 1)[1], 1)
    assert main([*BASE, *argv]) == 2
    assert named in _error(capsys)
    assert loads == []


def test_a_cascade_of_a_model_not_swept_is_refused_before_loading(tmp_path, capsys, loads):
    a, b = _weights(tmp_path / "a.gguf", 1), _weights(tmp_path / "b.gguf", 2)
    assert main([*BASE, "--model", a, "--model", b, "--cascade", "a,c"]) == 2
    assert "cascade large model 'c' is not a model of this sweep: give two of 'a', 'b'" in _error(capsys)
    assert loads == []


def test_the_difficulty_policy_is_printed_and_in_the_json(tmp_path, capsys, loads):
    a, b = _weights(tmp_path / "a.gguf", 1), _weights(tmp_path / "b.gguf", 2)
    argv = [*BASE, "--n", "1,2", "--model", a, "--model", b, "--difficulty-round", "2", "--difficulty-bins", "2"]
    assert main(argv) == 0, capsys.readouterr().err
    policy = json.loads(capsys.readouterr().out)["difficulty_policy"]
    assert policy["model"] == "a" and policy["bins"] == 2 and policy["round"] == 2
    assert all(len(choice["per_bin"]) == 2 for choice in policy["choices"])
    printed = [flag for flag in argv if flag != "--json"]
    assert main(printed) == 0
    assert "per-difficulty policy (2 bins by first-round agreement, 2 held-out problems" in capsys.readouterr().out
    assert main([*argv, "--difficulty-probe", "b"]) == 0  # the second model's samples estimate difficulty
    assert json.loads(capsys.readouterr().out)["difficulty_policy"]["model"] == "b"
    loads.clear()
    assert main([*argv, "--difficulty-probe", "c"]) == 2
    assert "difficulty probe 'c' is not a model of this sweep: give one of 'a', 'b'" in _error(capsys)
    assert loads == []


@pytest.mark.parametrize("argv, named", [
    (["--difficulty-bins", "2"], "--difficulty-bins applies with --difficulty-round K"),
    (["--difficulty-probe", "a"], "--difficulty-probe applies with --difficulty-round K"),
    (["--difficulty-round", "5"], "difficulty_round=5 (--difficulty-round) is out of range"),
    (["--difficulty-round", "2", "--difficulty-bins", "0"], "difficulty_bins=0 (--difficulty-bins) is out of range"),
])
def test_bad_policy_flags_are_refused_by_name(capsys, loads, argv, named):
    assert main([*BASE, *argv]) == 2
    assert named in _error(capsys)
    assert loads == []
