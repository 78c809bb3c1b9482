"""A sweep of several models into one results directory (`evaluate_models`): one file holding
the units of every model, each filed under its own set-up; resumable after a kill and when
models are added; a unit of the same model name with another fingerprint refused by file, line
and field; one model open at a time."""

from __future__ import annotations

import json
from contextlib import contextmanager

import pytest

from metagen.eval import EvalConfig, evaluate, format_table
from metagen.eval.config import ModelRun
from metagen.eval.running import evaluate_models
from metagen.sampling import SamplingParams
from tests.eval.dice import PROBLEMS, DiceGenerator

CONFIG = EvalConfig(("greedy", "self_consistency"), ns=(1, 2), params=SamplingParams(temperature=1.0))
UNITS_PER_MODEL = 5 + 5  # a pool and a greedy record per problem


class Models:
    """ModelRuns over DiceGenerators, counting how many are open at once (`peak`) and the calls
    each model received (`calls[label]`)."""

    def __init__(self) -> None:
        self.open = self.peak = 0
        self.calls: dict[str, list] = {}

    def run(self, label: str, weights: str = "w") -> ModelRun:
        @contextmanager
        def opened():
            generator = DiceGenerator()
            self.calls[label] = generator.calls
            self.open += 1
            self.peak = max(self.peak, self.open)
            try:
                yield generator, {"name": label, "class": "Dice", "dtype": "fp32", "weights": weights}
            finally:
                self.open -= 1

        return ModelRun(label, opened)


def _sweep(out, labels, config=CONFIG, weights=None):
    models = Models()
    runs = [models.run(label, (weights or {}).get(label, "w")) for label in labels]
    return models, evaluate_models(runs, PROBLEMS, config, out)


def _lines(out) -> list[dict]:
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]


def _units_by_model(out) -> dict[str, int]:
    lines = _lines(out)
    labels = {line["fingerprint"]: line["model"] for line in lines if line["kind"] == "setup"}
    counts: dict[str, int] = {}
    for line in lines:
        if line["kind"] != "setup":
            counts[labels[line["fingerprint"]["setup"]]] = counts.get(labels[line["fingerprint"]["setup"]], 0) + 1
    return counts


def test_two_models_write_one_file_with_units_of_both_and_rows_per_model(tmp_path):
    models, report = _sweep(tmp_path, ["a", "b"])
    assert _units_by_model(tmp_path) == {"a": UNITS_PER_MODEL, "b": UNITS_PER_MODEL}
    assert models.peak == 1  # one model open at a time
    rows = {(point.model, point.strategy, point.n) for point in report.points}
    per_model = {("greedy", 1), ("self_consistency", 1), ("self_consistency", 2), ("pass@k", 1), ("pass@k", 2)}
    assert rows == {(model, *row) for model in "ab" for row in per_model}
    table = format_table(report).splitlines()
    assert table[0].startswith("model  strategy") and table[2].startswith("a      greedy")
    alone = evaluate(DiceGenerator(), PROBLEMS, CONFIG, tmp_path / "alone", label="a")
    assert format_table(alone).startswith("strategy")  # one model: no model column
    assert set(json.loads((tmp_path / "run.json").read_text())["models"]) == {"a", "b"}


def test_resume_after_a_kill_redoes_only_the_missing_units(tmp_path):
    _, first = _sweep(tmp_path, ["a", "b"])
    raw = (tmp_path / "results.jsonl").read_bytes()
    lines = raw.splitlines(keepends=True)
    kept = sum(len(line) for line in lines[:-4]) + len(lines[-4]) // 2  # killed while writing a line of b
    (tmp_path / "results.jsonl").write_bytes(raw[:kept])
    models, again = _sweep(tmp_path, ["a", "b"])
    assert models.calls["a"] == []
    assert [prompt for prompt, _, _ in models.calls["b"]] == ["question 3"] * 2 + ["question 4"] * 2  # pool, greedy
    assert _units_by_model(tmp_path) == {"a": UNITS_PER_MODEL, "b": UNITS_PER_MODEL}
    assert [(p.key, p.accuracy) for p in again.points] == [(p.key, p.accuracy) for p in first.points]


def test_a_third_model_later_reuses_the_two_and_a_subset_reuses_its_own(tmp_path):
    _sweep(tmp_path, ["a", "b"])
    models, report = _sweep(tmp_path, ["a", "b", "c"])
    assert models.calls["a"] == models.calls["b"] == [] and len(models.calls["c"]) == UNITS_PER_MODEL
    assert {point.model for point in report.points} == {"a", "b", "c"}
    before = (tmp_path / "results.jsonl").read_bytes()
    models, report = _sweep(tmp_path, ["c"])
    assert models.calls["c"] == [] and {point.model for point in report.points} == {"c"}
    assert (tmp_path / "results.jsonl").read_bytes() == before


def test_a_unit_of_the_same_model_name_with_another_fingerprint_is_refused(tmp_path):
    _sweep(tmp_path, ["a", "b"])
    before = (tmp_path / "results.jsonl").read_bytes()
    first_of_b = 1 + 1 + UNITS_PER_MODEL + 1  # a's setup line, a's units, b's setup line, then b's first unit
    with pytest.raises(ValueError, match=rf"results.jsonl:{first_of_b} was produced with model.weights='w', "
                                         rf"this run has model.weights='other'; use another output directory "
                                         rf"\(--out\) or delete .*results.jsonl \(model 'b'\)"):
        _sweep(tmp_path, ["a", "b"], weights={"b": "other"})
    assert (tmp_path / "results.jsonl").read_bytes() == before


def test_another_shared_set_up_is_refused_before_any_model_opens(tmp_path):
    _sweep(tmp_path, ["a", "b"])
    other = EvalConfig(("greedy", "self_consistency"), ns=(1, 2), params=SamplingParams(temperature=0.5))
    models = Models()
    with pytest.raises(ValueError, match=r"results.jsonl:2 was produced with params.temperature=1.0, this run "
                                         r"has params.temperature=0.5"):
        evaluate_models([models.run("c")], PROBLEMS, other, tmp_path)
    assert models.calls == {}


def test_a_file_written_before_labels_still_resumes_and_refuses_by_model_name(tmp_path):
    model = {"name": "m", "class": "Dice", "dtype": "fp32", "weights": "w"}
    evaluate(DiceGenerator(), PROBLEMS, CONFIG, tmp_path, model=model)
    lines = _lines(tmp_path)
    del lines[0]["model"]  # a setup line as metagen wrote it before sweeps
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    generator = DiceGenerator()
    evaluate(generator, PROBLEMS, CONFIG, tmp_path, model=model, label="m.Q4")
    assert generator.calls == []
    with pytest.raises(ValueError, match=r"results.jsonl:2 was produced with model.dtype='fp32', this run has "
                                         r"model.dtype='bf16'"):
        evaluate(DiceGenerator(), PROBLEMS, CONFIG, tmp_path, model={**model, "dtype": "bf16"}, label="m.Q4")


def test_labels_must_be_distinct_and_named(tmp_path):
    models = Models()
    with pytest.raises(ValueError, match=r"model label\(s\) 'a' given more than once"):
        evaluate_models([models.run("a"), models.run("a")], PROBLEMS, CONFIG, tmp_path)
    assert models.calls == {}
