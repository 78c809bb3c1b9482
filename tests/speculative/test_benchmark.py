"""benchmarks/speculative.py's argument handling: drafters and rules from the registry, bad
combinations refused by name before any model loads; and one tiny run on the embedded model."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from metagen.speculative.registry import DRAFTERS

_BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _module(name: str, as_name: str):
    """benchmarks/`name`.py imported as `as_name` (its own `speculative_plan` import included)."""
    sys.path.insert(0, str(_BENCHMARKS))
    try:
        spec = importlib.util.spec_from_file_location(as_name, _BENCHMARKS / f"{name}.py")
        module = sys.modules[as_name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(_BENCHMARKS))
    return module


plan = _module("speculative_plan", "speculative_plan")
bench = _module("speculative", "speculative_benchmark")


def test_default_drafters_are_the_registry_minus_those_needing_inputs():
    plain = [name for name, spec in DRAFTERS.items() if spec.argument is None]
    assert plan.default_drafters("int4") == [name for name in plain if name != "quantized"]
    assert plan.default_drafters("bf16") == plain
    assert plan.default_drafters("int4", draft_dtype="int8") == [name for name in plain if name != "quantized"]
    assert "model:d.gguf" in plan.default_drafters("fp32", draft_model="d.gguf")
    assert "medusa:d.gguf" not in plan.default_drafters("fp32", draft_model="d.gguf")
    assert "medusa:h.safetensors" in plan.default_drafters("int4", medusa_heads="h.safetensors")
    assert {"recycling", "rasd", "stand", "tree", "spectr", "dyspec"} <= set(plan.default_drafters("int4"))


def test_each_run_takes_the_rule_its_drafter_verifies_with():
    runs, notes = plan.plan_runs("int4", None, None)
    rules = {run.drafter: run.verify for run in runs}
    assert rules == {name: spec.verify for name, spec in DRAFTERS.items() if name in rules}
    assert notes == []
    runs, _ = plan.plan_runs("int4", ["ngram", "recycling"], None, tree={"tree_widths": (2, 2)}, adaptive=True)
    assert [(run.label, run.verify, run.adaptive) for run in runs] == [
        ("ngram (widths 2,2)", "multi-draft", False), ("recycling (widths 2,2)", "multi-draft", False)]
    assert runs[0].options.tree_widths == (2, 2)
    runs, _ = plan.plan_runs("int4", ["ngram"], ["token", "block"], adaptive=True)
    assert [(run.label, run.verify) for run in runs] == [
        ("ngram", "token"), ("ngram, adaptive γ", "token"), ("ngram", "block"), ("ngram, adaptive γ", "block")]


def test_options_reach_only_the_drafters_reading_them():
    runs, _ = plan.plan_runs("int4", ["ngram", "rasd", "early-exit"], None,
                             common={"draft_corpus": "c.txt", "exit_layer": 12})
    options = {run.drafter: run.options for run in runs}
    assert options["ngram"].given() == {}
    assert options["rasd"].given() == {"draft_corpus": "c.txt"}
    assert options["early-exit"].given() == {"exit_layer": 12}
    runs, _ = plan.plan_runs("int4", None, None, tree={"tree_widths": (3,)})
    widths = {run.drafter: run.options.tree_widths for run in runs}
    assert widths["dyspec"] is None and widths["rasd"] is None and widths["stand"] == (3,)


def test_default_list_leaves_out_pairs_the_rule_refuses_and_says_so():
    runs, notes = plan.plan_runs("int4", None, ["token"])
    assert {run.drafter for run in runs} == {"ngram", "early-exit", "s2d"}
    assert any(note.startswith("int4: recycling with verify=token left out") for note in notes)


@pytest.mark.parametrize(("drafters", "verifies", "tree", "message"), [
    (["dyspec"], None, {"tree_widths": (2, 2)}, "tree_widths=.* does not apply to the dyspec drafter"),
    (["ngram"], ["token"], {"tree_nodes": 8}, "ngram drafter with tree_nodes=8 proposes token trees"),
    (["recycling"], ["block"], {}, "recycling drafter proposes token trees, which verify='block'"),
    (["ngram"], ["spectr"], {}, "verify='spectr' needs siblings drawn i.i.d."),
    (["quantized"], None, {}, "quantized drafter on the int4 target"),
    (["bogus"], None, {}, "drafter 'bogus' is unknown: choose one of ngram"),
    (["ngram"], ["nope"], {}, "verify='nope' is not a rule"),
])
def test_named_drafters_with_bad_combinations_are_refused_by_name(drafters, verifies, tree, message):
    with pytest.raises(ValueError, match=message):
        plan.plan_runs("int4", drafters, verifies, tree=tree)


def test_parse_args_plans_every_target_and_refuses_before_loading(monkeypatch, capsys):
    monkeypatch.setattr(bench, "load", lambda *a, **k: pytest.fail("a model was loaded"))
    args, plans = bench.parse_args(["--targets", "int4,bf16", "--drafters", "ngram,recycling",
                                    "--activations", "int16,int8", "--tree-nodes", "8"])
    assert args.activations == ["int16", "int8"] and args.targets == ["int4", "bf16"]
    assert [run.label for run in plans["bf16"]] == ["ngram (8 nodes)", "recycling (8 nodes)"]
    for argv, message in [
        (["--drafters", "dyspec", "--tree-widths", "2,2"], "does not apply to the dyspec drafter"),
        (["--drafters", "ngram", "--verify", "token", "--tree-widths", "2"], "proposes token trees"),
        (["--activations", "int4"], "--activations int4: choose from int16, int8"),
        (["--targets", "int3"], "--targets int3: choose from int4, bf16, fp32"),
        (["--drafters", ","], "--drafters ',' names nothing"),
        (["--prompts", "0"], "--prompts 0 must be >= 1"),
        (["--tree-widths", "2,x"], "--tree-widths '2,x': give comma-separated ints >= 1"),
        (["--tree-widths", "2,0"], "tree_widths=(2, 0) must be a non-empty tuple of ints >= 1"),
        (["--draft-dtype", "int3"], "draft_dtype='int3': choose from fp32, bf16, int8, int4"),
    ]:
        with pytest.raises(SystemExit):
            bench.parse_args(argv)
        assert message in capsys.readouterr().err


def test_the_qwen_pair_is_planned_with_its_draft_file_and_its_own_prompt_kinds(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(bench, "load", lambda *a, **k: pytest.fail("a model was loaded"))
    draft = str(tmp_path / bench.QWEN_DRAFT)
    args, plans = bench.parse_args(["--targets", "int4", "--drafters", "ngram", "--qwen-dir", str(tmp_path)])
    assert f"model:{draft}" in [run.drafter for run in plans["qwen"]]
    assert "quantized" not in [run.drafter for run in plans["qwen"]]  # the Q4 target's int4 copy is no cheaper
    assert args.kinds == ["grounded", "open", "code"] and args.qwen_kinds == ["code", "grounded"]
    _, plans = bench.parse_args(["--qwen-dir", str(tmp_path), "--qwen-drafters", f"model:{draft},ngram",
                                 "--tree-widths", "2,2"])
    assert [(run.label, run.verify) for run in plans["qwen"]] == [
        (f"model:{bench.QWEN_DRAFT} (widths 2,2)", "multi-draft"), ("ngram (widths 2,2)", "multi-draft")]
    for argv, message in [
        (["--qwen-dir", str(tmp_path), "--qwen-drafters", "quantized"], "the quantized drafter on the int4 target"),
        (["--qwen-kinds", "prose"], "--qwen-kinds prose: choose from grounded, open, code"),
    ]:
        with pytest.raises(SystemExit):
            bench.parse_args(argv)
        assert message in capsys.readouterr().err


def test_speedup_compares_rows_with_the_same_activations():
    rows = [plan.Row("metagen", "int4", act, method, "token", 0.0, "open", tokens=tokens, seconds=1.0,
                     target_steps=steps)
            for act, method, tokens, steps in [("int16", "plain", 10, 10), ("int8", "plain", 20, 20),
                                               ("int16", "ngram", 30, 10), ("int8", "ngram", 30, 10)]]
    plan.add_speedups(rows)
    assert [row.speedup for row in rows] == [1.0, 1.0, 3.0, 1.5]
    table = plan.table(rows)
    assert table[0][7:10] == ["tokens / target fwd", "target fwd / token", "acceptance"]
    assert table[3][7:9] == ["3.00", "0.333"]


@pytest.mark.slow
def test_a_tiny_run_reports_each_drafter():
    root = _BENCHMARKS.parent
    env = dict(os.environ, PYTHONPATH=str(root / "src"))
    done = subprocess.run(
        [sys.executable, str(_BENCHMARKS / "speculative.py"), "--targets", "int4", "--temperatures", "0",
         "--drafters", "ngram,recycling", "--skip", "transformers,llama.cpp,qwen", "--tokens", "3", "--prompts", "1",
         "--kinds", "grounded,open", "--markdown"], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr
    rows = [line.split(" | ") for line in done.stdout.splitlines() if line.startswith("| metagen | int4 | int16 |")]
    assert sorted((row[3], row[4], row[6]) for row in rows) == [
        ("ngram", "token", "grounded"), ("ngram", "token", "open"), ("plain", "—", "grounded"),
        ("plain", "—", "open"), ("recycling", "multi-draft", "grounded"), ("recycling", "multi-draft", "open")]
    for row in rows:
        assert float(row[7]) >= 1.0  # tokens per target forward: never below plain decoding's 1
