"""`metagen eval` through `metagen.cli.main`, on the toy model instead of the 22 s load: a rerun
into the same --out reuses only the same work, and every failure is one line `metagen: error:`
naming the file, line, field or option — before the model is loaded when it can be."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from metagen.cli import common, main
from tests.decoding.toy_model import BOS, ToyModel, ToyTokenizer

BASE = ["eval", "--task", "arithmetic", "--count", "3", "--strategy", "greedy,self_consistency", "--n", "1,2",
        "--max-tokens", "3", "--json"]


class TextToyTokenizer(ToyTokenizer):
    """Reads any text: each character becomes "a", "b" or "c" by its code point."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return ([BOS] if add_special_tokens else []) + [1 + ord(ch) % 3 for ch in text]


class TextToy(ToyModel):
    """The toy chain behind any text, with the attributes of a loaded model (source, dtype,
    activations, config)."""

    def __init__(self, source: str = "", dtype: str = "int4", activations: str = "int16") -> None:
        super().__init__(max_context=512)
        self.tokenizer = TextToyTokenizer()
        self.source, self.dtype, self.config = source, dtype, SimpleNamespace(name="toy")
        self.activations = activations


@pytest.fixture
def loads(monkeypatch, one_thread):
    """`metagen eval` loads a TextToy of --model (a file standing for the weights) and --dtype;
    the list records each load's (--model, --dtype)."""
    seen = []

    def load(args):
        seen.append((args.model, args.dtype))
        return TextToy(args.model or "", args.dtype or "int4", args.activations or "int16")

    monkeypatch.setattr(common, "load_model", load)
    return seen


def _error(capsys) -> str:
    """The one line a failed command writes to stderr."""
    err = capsys.readouterr().err
    assert err.startswith("metagen: error: ") and err.count("\n") == 1, err
    return err


def test_a_rerun_with_the_same_settings_reuses_everything(tmp_path, capsys, loads):
    assert main([*BASE, "--out", str(tmp_path)]) == 0
    first = json.loads(capsys.readouterr().out)["results"]
    results = (tmp_path / "results.jsonl").read_bytes()
    assert main([*BASE, "--out", str(tmp_path)]) == 0
    assert json.loads(capsys.readouterr().out)["results"] == first
    assert (tmp_path / "results.jsonl").read_bytes() == results  # nothing new was generated


@pytest.mark.parametrize(("change", "named"), [
    (["--max-number", "50"], "results.jsonl:2 holds problem 'arithmetic-0-0' with another question"),
    (["--dtype", "fp32"], "results.jsonl:2 was produced with model.dtype='int4', this run has model.dtype='fp32'"),
    (["--activations", "int8"], "results.jsonl:2 was produced with no model.activations, this run has "
                                "model.activations='int8'"),
    (["--temperature", "0.5"], "params.temperature=0.8, this run has params.temperature=0.5"),
    (["--prompt-suffix", " Answer:"], "prompt_suffix='', this run has prompt_suffix=' Answer:'"),
])
def test_other_work_in_the_same_out_is_refused(tmp_path, capsys, loads, change, named):
    assert main([*BASE, "--out", str(tmp_path)]) == 0
    capsys.readouterr()
    results = (tmp_path / "results.jsonl").read_bytes()
    (tmp_path / "run.json").unlink()  # the stored units carry their own fingerprints
    assert main([*BASE, *change, "--out", str(tmp_path)]) == 2
    error = _error(capsys)
    assert named in error and "use another output directory (--out)" in error
    assert capsys.readouterr().out == "" and (tmp_path / "results.jsonl").read_bytes() == results


def test_another_model_file_under_the_same_name_is_refused(tmp_path, capsys, loads):
    """A model is filed under its file's stem: a copy of the weights reuses its units, a file of
    another name joins the directory, other weights under the same name are refused."""
    first, second = tmp_path / "a.gguf", tmp_path / "b.gguf"
    first.write_bytes(b"GGUF" + bytes(range(256)) * 64)
    second.write_bytes(b"GGUF" + bytes(range(255, -1, -1)) * 64)
    out = tmp_path / "out"
    assert main([*BASE, "--model", str(first), "--out", str(out)]) == 0
    written = (out / "results.jsonl").read_bytes()
    copy = tmp_path / "copy.gguf"
    copy.write_bytes(first.read_bytes())  # the same weights elsewhere: the same model
    assert main([*BASE, "--model", str(copy), "--out", str(out)]) == 0
    assert (out / "results.jsonl").read_bytes() == written
    assert main([*BASE, "--model", str(second), "--out", str(out)]) == 0  # another model joins
    capsys.readouterr()
    first.write_bytes(second.read_bytes()[::-1] + b"x")  # other weights under the name 'a'
    assert main([*BASE, "--model", str(first), "--out", str(out)]) == 2
    assert "results.jsonl:2 was produced with model.weights=" in _error(capsys)


def test_data_files_with_the_same_ids_are_not_mixed(tmp_path, capsys, loads):
    """--data d1.jsonl then --data d2.jsonl: ids default to line numbers in both."""
    d1, d2 = tmp_path / "d1.jsonl", tmp_path / "d2.jsonl"
    d1.write_text('{"question": "What is 1 + 1?", "answer": "2"}\n{"question": "What is 2 + 2?", "answer": "4"}\n')
    d2.write_text('{"question": "What is 3 + 3?", "answer": "6"}\n{"question": "What is 4 + 4?", "answer": "8"}\n')
    argv = ["eval", "--strategy", "greedy", "--n", "1", "--max-tokens", "3", "--out", str(tmp_path / "out")]
    assert main([*argv, "--data", str(d1)]) == 0
    capsys.readouterr()
    assert main([*argv, "--data", str(d2)]) == 2
    assert "results.jsonl:2 holds problem '1' with another question than this run's problem '1'" in _error(capsys)


def test_a_malformed_results_line_is_named(tmp_path, capsys, loads):
    assert main([*BASE, "--out", str(tmp_path)]) == 0
    capsys.readouterr()
    with open(tmp_path / "results.jsonl", "a") as handle:
        handle.write('{"foo": 1}\n')
    assert main([*BASE, "--out", str(tmp_path)]) == 2
    assert f"{tmp_path / 'results.jsonl'}:8: field 'kind' is missing" in _error(capsys)


def test_an_over_long_problem_is_named_before_generating(tmp_path, capsys, loads):
    data = tmp_path / "data.jsonl"
    data.write_text('{"question": "What is 1 + 1?", "answer": "2"}\n'
                    + json.dumps({"id": "essay", "question": "x" * 600, "answer": "1"}) + "\n")
    out = tmp_path / "out"
    assert main(["eval", "--data", str(data), "--strategy", "greedy", "--n", "1", "--out", str(out)]) == 2
    error = _error(capsys)
    assert "problem 'essay' (601 tokens) does not fit the model's context of 512 tokens" in error
    assert "stopped before generating anything" in error and not (out / "results.jsonl").exists()


@pytest.mark.parametrize("case", ["data is a directory", "data is Latin-1", "bad pattern", "out is a file",
                                  "out under a file", "out is read-only", "out under a read-only directory"])
def test_failures_are_one_line_before_the_model_loads(tmp_path, capsys, loads, request, case):
    data = tmp_path / "data.jsonl"
    data.write_text('{"question": "What is 1 + 1?", "answer": "2"}\n')
    argv, named = ["eval", "--data", str(data), "--strategy", "greedy", "--n", "1"], None
    if case == "data is a directory":
        argv[2], named = str(tmp_path), f"{tmp_path} is a directory, not a JSONL file"
    elif case == "data is Latin-1":
        data.write_bytes('{"question": "Ça fait 1 + 1?", "answer": "2"}\n'.encode("latin-1"))
        named = f"{data}:1: not UTF-8 text (byte 0xc7 at column 15)"
    elif case == "bad pattern":
        argv, named = [*argv, "--pattern", "("], "pattern='(' is not a valid regular expression"
    elif case in ("out is a file", "out under a file"):
        out = data if case == "out is a file" else data / "out"
        argv = [*argv, "--out", str(out)]
        named = (f"--out {str(out)!r} exists and is not a directory" if case == "out is a file" else
                 f"--out {str(out)!r} cannot be created: {str(data)!r} is a file, not a directory")
    else:
        read_only = request.getfixturevalue("read_only_dir")
        out = read_only if case == "out is read-only" else read_only / "out"
        argv = [*argv, "--out", str(out)]
        named = (f"--out {str(out)!r} is not writable" if case == "out is read-only" else
                 f"--out {str(out)!r} cannot be created in {str(read_only)!r}")
    assert main(argv) == 2
    assert named in _error(capsys)
    assert loads == []


def test_the_output_answers_which_configuration_to_use_per_budget(tmp_path, capsys, loads):
    """--json: rows keyed by model, strategy, n with an interval; frontier, per_budget and unplaced at
    the top; --out: the frontier plot and the "at budget C use X" table in summary.txt."""
    assert main([*BASE, "--out", str(tmp_path)]) == 0
    data = json.loads(capsys.readouterr().out)
    name = "SmolLM2-135M-Instruct.Q4_1"  # the default (embedded) model's label: its file's stem
    assert {(row["model"], row["strategy"], row["n"]) for row in data["results"]} >= {
        (name, "greedy", 1), (name, "self_consistency", 1), (name, "self_consistency", 2)}
    assert all(len(row["interval"]) == 2 and row["cost"]["flops"] > 0 for row in data["results"])
    assert data["frontier"] and all(row in data["results"] and row["strategy"] != "pass@k" for row in data["frontier"])
    assert len(data["per_budget"]) == 8 and data["unplaced"] == []
    last = data["per_budget"][-1]  # the dearest budget affords every configuration
    assert last["budget_flops"] == max(row["cost"]["flops"] for row in data["results"] if row["strategy"] != "pass@k")
    assert last["best"]["accuracy"] == max(row["accuracy"] for row in data["results"] if row["strategy"] != "pass@k")
    assert (tmp_path / "frontier.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    summary = (tmp_path / "summary.txt").read_text()
    assert f"compute-optimal frontier: {name} " in summary and "budget TFLOPs" in summary
    assert main(BASE[:-1]) == 0  # the text output carries the same table
    assert "budget TFLOPs" in capsys.readouterr().out


def test_markdown_prints_the_same_summary_as_pipe_tables(tmp_path, capsys, loads):
    """--markdown: the results table and the per-budget table as pipe tables with the same cells
    as the text; --out holds summary.md either way; with --json it is refused before any load."""
    text_argv = [*BASE[:-1], "--out", str(tmp_path)]
    assert main(text_argv) == 0
    text = capsys.readouterr().out
    assert main([*text_argv, "--markdown"]) == 0
    markdown = capsys.readouterr().out
    assert markdown.strip() == (tmp_path / "summary.md").read_text().strip()
    assert text.strip() == (tmp_path / "summary.txt").read_text().strip()
    lines = markdown.splitlines()
    header = lines.index("| strategy | n | accuracy [95% interval] | gen tokens | TFLOPs | s/problem |")
    assert lines[header + 1] == "|---|---:|---:|---:|---:|---:|"
    rows = [line.split(" | ") for line in lines[header + 2:] if line.startswith("| ")]
    greedy = next(row for row in rows if row[0] == "| greedy")
    text_greedy = next(line for line in text.splitlines() if line.startswith("greedy "))
    assert " ".join(cell.strip(" |") for cell in greedy[:4]) == " ".join(text_greedy.split()[:6])
    assert "| budget TFLOPs | use | runner-up | overlap | paired difference [95%] | p_best |" in lines
    assert not any(line.startswith("-----") for line in lines)  # no text rules in Markdown
    loads.clear()
    assert main([*BASE, "--markdown"]) == 2
    assert "--json and --markdown both choose what is printed" in _error(capsys) and loads == []


def test_another_value_reuses_the_pools_and_reruns_only_the_value_guided_units(tmp_path, capsys, loads):
    """A stored sweep given a value (--value steps) generates only the value-guided strategy's
    units: the pools and greedy stored without a value are reused; a later run with another
    step delimiter reruns that strategy's units alone. Other set-up changes are still refused."""
    base = [*BASE, "--out", str(tmp_path)]

    def units():
        records = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
        return [(r["kind"], r.get("strategy"), r["fingerprint"]["setup"]) for r in records if r["kind"] != "setup"]

    assert main(base) == 0
    first = {(row["strategy"], row["n"]): row["accuracy"] for row in json.loads(capsys.readouterr().out)["results"]}
    stored = units()
    valued = [*base[:base.index("--strategy") + 1], "greedy,self_consistency,rebase",
              *base[base.index("--strategy") + 2:], "--value", "steps"]
    assert main(valued) == 0
    again = {(row["strategy"], row["n"]): row["accuracy"] for row in json.loads(capsys.readouterr().out)["results"]}
    assert {key: value for key, value in again.items() if key[0] != "rebase"} == first  # the same units
    added = units()[len(stored):]
    assert added and {kind for kind, _, _ in added} == {"live"} and {name for _, name, _ in added} == {"rebase"}
    assert len({setup for _, _, setup in added} | {setup for _, _, setup in stored}) == 2  # a setup of its own
    assert main([*valued, "--step-delimiter", ";"]) == 0
    capsys.readouterr()
    third = units()[len(stored) + len(added):]
    assert len(third) == len(added) and {name for _, name, _ in third} == {"rebase"}
    assert main([*valued, "--temperature", "0.5"]) == 2  # a sampling change still refuses
    error = _error(capsys)
    assert "params.temperature=0.8, this run has params.temperature=0.5" in error and "options.value" not in error
    assert main([*valued, "--dtype", "fp32"]) == 2  # so does another model, named without the value
    error = _error(capsys)
    assert "model.dtype='int4', this run has model.dtype='fp32'" in error and "options.value" not in error


def test_progress_in_a_log_is_one_line_per_twentieth_of_the_problems(capsys):
    """stderr redirected (a run in the background): no bar redrawn with carriage returns, but a
    line at every 5% of the problems and at the end, with the time left."""
    from metagen.cli.eval import _progress

    started = [__import__("time").perf_counter()]
    for done in range(1, 41):
        _progress(done, 40, started)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 20 and "\r" not in "".join(lines)
    assert lines[0].startswith("metagen eval: 2/40 problems, ") and lines[-1].startswith("metagen eval: 40/40 problems")
    assert all(line.endswith(" s left") for line in lines)
    _progress(7, 7, started)  # fewer problems than twenty: a line each
    assert capsys.readouterr().err.startswith("metagen eval: 7/7 problems")
