"""`metagen eval` with several --model and --backend: one results file and report over all of
them, remote FLOPs estimated from --parameters (2·N per prompt and generated token) or named as
unplaced without it, and every parsing error naming its flag."""

from __future__ import annotations

import json

import pytest

from metagen.cli import main
from tests.eval.test_eval_cli import BASE, _error, loads  # noqa: F401 - the toy-model load fixture
from tests.remote.fake_server import FakeServer

pytest.importorskip("httpx")


def _weights(path, seed: int):
    path.write_bytes(b"GGUF" + bytes((seed + i) % 256 for i in range(4096)))
    return str(path)


def test_local_and_remote_models_in_one_sweep_with_and_without_parameters(tmp_path, capsys, loads):
    a, b = _weights(tmp_path / "a.gguf", 1), _weights(tmp_path / "b.gguf", 2)
    with FakeServer("vllm", model="served-x") as x, FakeServer("vllm", model="served-y") as y:
        argv = [*BASE, "--model", a, "--model", b, "--backend", x.url, "--backend", y.url,
                "--parameters", "1.5B", "--parameters", "unknown", "--concurrency", "2", "--out", str(tmp_path / "out")]
        assert main(argv) == 0, capsys.readouterr().err
    data = json.loads(capsys.readouterr().out)
    assert [path for path, _ in loads] == [a, b]  # local models loaded in turn
    assert {row["model"] for row in data["results"]} == {"a", "b", "served-x", "served-y"}
    for row in data["results"]:
        cost = row["cost"]
        if row["model"] == "served-x" and row["strategy"] == "greedy":  # one request per problem: exact
            assert cost["flops"] == pytest.approx(2 * 1.5e9 * (cost["prompt_tokens_computed"]
                                                               + cost["generated_tokens"]), rel=1e-12)
        if row["model"] == "served-x":
            assert row["flops_estimate"] == "2·N·tokens with N=1.5e+09 given, attention omitted"
        if row["model"] == "served-y":
            assert cost["flops"] is None and "flops_estimate" not in row
    assert {(row["model"], row["strategy"]) for row in data["unplaced"]} == {
        ("served-y", "greedy"), ("served-y", "self_consistency")}
    summary = (tmp_path / "out" / "summary.txt").read_text()
    assert "not placed (FLOPs unknown): served-y greedy n=1 (chat), served-y self_consistency n=1 (chat)" in summary
    assert "~ served-x: FLOPs estimated as 2·N·tokens" in summary
    assert summary.startswith("model     prompts  strategy")  # the toy models get raw text, the servers chat
    setups = [line for line in (tmp_path / "out" / "results.jsonl").read_text().splitlines() if '"setup"' in line[:20]]
    assert sorted(json.loads(line)["model"] for line in setups) == ["a", "b", "served-x", "served-y"]


def test_a_table_mixing_templated_and_raw_prompts_flags_it(tmp_path, capsys, loads):
    """The toy local model has no chat template (raw text); the server applies its own (chat
    endpoint, by default): the printed table and frontier say the two got different prompts,
    and --no-chat gives both raw text, unflagged."""
    local = _weights(tmp_path / "a.gguf", 1)
    printed = [flag for flag in BASE if flag != "--json"]
    with FakeServer("vllm", model="served-x") as server:
        assert main([*printed, "--model", local, "--backend", server.url, "--parameters", "1B"]) == 0
        table = capsys.readouterr().out
        chat_paths = {path for path, body, _ in server.requests if body and body.get("max_tokens") != 1}
        server.requests.clear()
        assert main([*printed, "--model", local, "--backend", server.url, "--parameters", "1B", "--no-chat"]) == 0
        raw_table = capsys.readouterr().out
        raw_paths = {path for path, body, _ in server.requests if body and body.get("max_tokens") != 1}
    assert chat_paths == {"/v1/chat/completions"} and raw_paths == {"/v1/completions"}
    note = ("! prompts differ: served-x through a chat template, a as raw text; accuracies compare prompt formats "
            "as well as models (--chat or --no-chat gives every model one format)")
    lines = table.splitlines()
    assert lines[0].startswith("model     prompts  strategy") and lines.count(note) == 2  # the table, the frontier
    rows = lines[2:lines.index("")]  # the table's rows: the frontier and the scaling fits follow
    assert [line.split()[1] for line in rows if line.split()[:1] in (["a"], ["served-x"])] == \
        ["raw"] * 5 + ["chat"] * 5  # greedy, self_consistency 1 and 2, pass@1 and 2 per model
    assert "compute-optimal frontier: a greedy n=1 (raw)" in lines
    assert "prompts" not in raw_table and "!" not in raw_table and "(raw)" not in raw_table


def test_models_of_the_same_file_name_are_told_apart_by_their_directory(tmp_path, capsys, loads):
    (tmp_path / "q4").mkdir()
    (tmp_path / "q8").mkdir()
    first, second = _weights(tmp_path / "q4" / "m.gguf", 1), _weights(tmp_path / "q8" / "m.gguf", 2)
    assert main([*BASE, "--model", first, "--model", second]) == 0
    assert {row["model"] for row in json.loads(capsys.readouterr().out)["results"]} == {"q4/m", "q8/m"}
    assert main([*BASE, "--model", first, "--model", first]) == 2
    assert f"--model {first} and --model {first} are one model or share the name 'q4/m'" in _error(capsys)


@pytest.mark.parametrize(("argv", "named"), [
    (["--backend", "http://h:1/v1", "--parameters", "1.5X"], "argument --parameters: --parameters '1.5X' is not a "
                                                             "parameter count"),
    (["--backend", "http://h:1/v1", "--parameters", "-3"], "--parameters '-3' is out of range"),
    (["--backend", "http://h:1/v1", "--parameters", "1B", "--parameters", "2B"],
     "--parameters is given 2 time(s) for 1 --backend"),
    (["--backend", "http://h:1/v1", "--backend", "http://h:2/v1", "--served-model", "x"],
     "--served-model is given 1 time(s) for 2 --backend"),
    (["--parameters", "1B"], "--parameters configure a remote server: add --backend URL"),
    (["--backend", "http://h:1/v1", "--dtype", "fp32"], "--dtype configure a local model, and no --model is given"),
    (["--backend", "h:1/v1"], "--backend URL 'h:1/v1' must start with http:// or https://"),
    (["--model", "missing.gguf"], "--model missing.gguf: no such file or directory"),
    (["--concurrency", "2"], "--concurrency 2 needs --backend"),
    (["--backend", "http://h:1/v1", "--backend", "http://h:2/v1", "--engine", "vllm"],
     "--engine is given 1 time(s) for 2 --backend"),
    (["--engine", "vllm"], "--engine configure a remote server: add --backend URL"),
    (["--backend", "http://h:1/v1", "--engine", "tgi"], "argument --engine: invalid choice: 'tgi'"),
])
def test_parsing_errors_name_the_flag(capsys, loads, argv, named):
    try:
        code = main([*BASE, *argv])
    except SystemExit as exit:  # argparse's own usage errors
        code = exit.code
    assert code == 2 and named in capsys.readouterr().err
    assert loads == []  # nothing loaded


@pytest.mark.slow
def test_the_embedded_model_and_a_tiny_checkpoint_in_one_sweep(tmp_path, capsys, one_thread):
    """Two real local models loaded in turn: rows of both, each model's greedy FLOPs those of the
    one formula on its own architecture (the tiny one's far fewer per token)."""
    pytest.importorskip("transformers")
    from tests.models.families.tiny_checkpoints import build_hf_model, save_hf

    tiny = save_hf(build_hf_model("llama"), tmp_path / "tiny")
    argv = ["eval", "--task", "arithmetic", "--count", "2", "--strategy", "greedy", "--n", "1", "--max-tokens", "4",
            "--model", "embedded", "--model", str(tiny), "--json", "--out", str(tmp_path / "out")]
    assert main(argv) == 0, capsys.readouterr().err
    rows = {row["model"]: row for row in json.loads(capsys.readouterr().out)["results"]}
    assert set(rows) == {"SmolLM2-135M-Instruct.Q4_1", "tiny"}
    per_token = {name: row["cost"]["flops"] / (row["cost"]["prompt_tokens_computed"] + row["cost"]["generated_tokens"])
                 for name, row in rows.items()}
    assert per_token["tiny"] * 20 < per_token["SmolLM2-135M-Instruct.Q4_1"]  # N: 3.2M (mostly its LM head) vs 134.5M
    assert main(argv) == 0  # resumed: nothing generated again
    assert {row["model"]: row for row in json.loads(capsys.readouterr().out)["results"]}.keys() == rows.keys()
