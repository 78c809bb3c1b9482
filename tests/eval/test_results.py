"""results.jsonl: a resumed run reuses only units of the same work (problem, model, set-up), and
malformed lines are reported with file and line."""

import json

import pytest

from metagen.eval import EvalConfig, Problem, evaluate
from metagen.sampling import SamplingParams
from tests.eval.dice import PROBLEMS, DiceGenerator

CONFIG = EvalConfig(("greedy", "self_consistency"), ns=(1, 2), params=SamplingParams(temperature=1.0))
MODEL = {"name": "m", "class": "LlamaModel", "dtype": "int4", "weights": "aaaa"}


def _run(out, problems=PROBLEMS, config=CONFIG, model=None):
    generator = DiceGenerator()
    report = evaluate(generator, problems, config, out, **({} if model is None else {"model": model}))
    return generator, {(p.strategy, p.n): p.accuracy for p in report.points}


def test_other_problems_under_the_same_ids_are_refused_before_generating(tmp_path):
    """--data d1.jsonl then --data d2.jsonl into one --out: ids are line numbers in both."""
    _run(tmp_path)
    before = (tmp_path / "results.jsonl").read_bytes()
    other_questions = [Problem(p.id, f"another {p.question}", p.answer) for p in PROBLEMS]
    with pytest.raises(ValueError, match=r"results.jsonl:2 holds problem 'p0' with another question than this run's"):
        _run(tmp_path, other_questions)
    other_answers = [Problem(p.id, p.question, "7") for p in PROBLEMS]
    with pytest.raises(ValueError, match=r"results.jsonl:2 holds problem 'p0' with another answer"):
        _run(tmp_path, other_answers)
    changed_last = PROBLEMS[:4] + [Problem("p4", "question 4 changed", PROBLEMS[4].answer)]
    with pytest.raises(ValueError, match=r"results.jsonl:10 holds problem 'p4' with another question"):
        _run(tmp_path, changed_last)
    assert (tmp_path / "results.jsonl").read_bytes() == before  # nothing generated, nothing appended


@pytest.mark.parametrize(("field", "value"), [("dtype", "fp32"), ("weights", "bbbb")])
def test_another_model_is_refused_naming_the_field(tmp_path, field, value):
    """The same model name with another identity; a model of another name joins the directory
    (tests/eval/test_model_sweep.py)."""
    _run(tmp_path, model=MODEL)
    with pytest.raises(ValueError, match=rf"results.jsonl:2 was produced with model.{field}='{MODEL[field]}', "
                                         rf"this run has model.{field}='{value}'; use another output directory"):
        _run(tmp_path, model={**MODEL, field: value})


@pytest.mark.parametrize(("config", "named"), [
    (EvalConfig(("greedy", "self_consistency"), ns=(1, 2), params=SamplingParams(temperature=1.0, top_k=5)),
     "params.top_k=0, this run has params.top_k=5"),
    (EvalConfig(("greedy", "self_consistency"), ns=(1, 2), params=SamplingParams(temperature=1.0), seed=3),
     "seed=0, this run has seed=3"),
    (EvalConfig(("greedy", "self_consistency"), ns=(1, 2), params=SamplingParams(temperature=1.0),
                prompt_suffix=" Think."), "prompt_suffix='', this run has prompt_suffix=' Think.'"),
])
def test_without_run_json_stored_units_are_still_checked(tmp_path, config, named):
    _run(tmp_path)
    (tmp_path / "run.json").unlink()
    with pytest.raises(ValueError, match=named):
        _run(tmp_path, config=config)


def test_run_json_is_a_copy_a_corrupt_one_does_not_block_the_same_run(tmp_path):
    _, first = _run(tmp_path, model=MODEL)
    (tmp_path / "run.json").write_text("{")
    generator, again = _run(tmp_path, model=MODEL)
    assert generator.calls == [] and again == first
    assert json.loads((tmp_path / "run.json").read_text())["model"] == MODEL


def test_units_of_other_ids_are_kept_and_only_missing_ones_generated(tmp_path):
    _run(tmp_path, PROBLEMS[:2])
    generator, _ = _run(tmp_path)
    assert [prompt for prompt, _, _ in generator.calls] == [f"question {i}" for i in (2, 2, 3, 3, 4, 4)]
    generator, _ = _run(tmp_path, PROBLEMS[3:])
    assert generator.calls == []
    setups = [line for line in (tmp_path / "results.jsonl").read_text().splitlines() if '"kind":"setup"' in line]
    assert len(setups) == 1


def _pool_line(tmp_path):
    _run(tmp_path)
    return json.loads((tmp_path / "results.jsonl").read_text().splitlines()[1])


@pytest.mark.parametrize(("line", "named"), [
    ('{"foo": 1}', "field 'kind' is missing"),
    ("[1, 2]", "expected a JSON object, got list"),
    ('{"kind": "sample"}', "field 'kind' is 'sample', expected 'setup', 'pool' or 'live'"),
    ('{"kind": "pool", "id": "p0", "pool": {}}', "field 'fingerprint' is missing or incomplete"),
    ("POOL without samples", "field 'pool.samples' is missing"),
    ("POOL with empty samples", "field 'pool.samples' is empty"),
    ("POOL with a sample without text", r"field 'pool.samples\[0\].text' is missing"),
    ("LIVE without cost", "field 'cost' must be an object of numbers"),
    ('{"kind": "pool", "id": "p0", "po', "not valid JSON"),  # not the last line: not a torn write
])
def test_malformed_lines_are_reported_with_file_and_line(tmp_path, line, named):
    pool = _pool_line(tmp_path)
    lines = (tmp_path / "results.jsonl").read_text().splitlines()
    if line == "POOL without samples":
        del pool["pool"]["samples"]
    elif line == "POOL with empty samples":
        pool["pool"]["samples"] = []
    elif line == "POOL with a sample without text":
        del pool["pool"]["samples"][0]["text"]
    elif line == "LIVE without cost":
        pool = json.loads(lines[2])
        del pool["cost"]
    if line.startswith(("POOL", "LIVE")):
        line = json.dumps(pool)
    lines.insert(3, line)
    (tmp_path / "results.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=rf"results.jsonl:4: {named}"):
        _run(tmp_path)


def test_a_file_of_an_older_metagen_or_edited_set_up_is_refused(tmp_path):
    _run(tmp_path)
    path = tmp_path / "results.jsonl"
    text = path.read_text().splitlines()
    setup = json.loads(text[0])
    setup["setup"]["params"]["temperature"] = 0.5
    path.write_text("\n".join([json.dumps(setup), *text[1:]]) + "\n")
    with pytest.raises(ValueError, match="results.jsonl:1: field 'fingerprint' does not match its 'setup'"):
        _run(tmp_path)
    old = [json.loads(line) for line in text[1:]]
    for record in old:
        del record["fingerprint"]
    path.write_text("".join(json.dumps(record) + "\n" for record in old))
    with pytest.raises(ValueError, match="results.jsonl:1: field 'fingerprint' is missing"):
        _run(tmp_path)


def test_a_line_that_is_not_utf8_is_named(tmp_path):
    _run(tmp_path)
    with open(tmp_path / "results.jsonl", "ab") as handle:
        handle.write(b'{"kind": "caf\xe9"}\n')
    with pytest.raises(ValueError, match=r"results.jsonl:12: not UTF-8 text \(byte 0xe9 at column 14\)"):
        _run(tmp_path)


def test_a_prompt_longer_than_the_context_is_named_before_generating(tmp_path, one_thread):
    from metagen.decoding import LocalGenerator
    from tests.decoding.toy_model import ToyModel

    model = ToyModel(max_context=8)
    problems = [Problem("short", "ab", "a"), Problem("long", "abcabcab", "a")]  # BOS + 8 tokens
    config = EvalConfig(("greedy",), ns=(1,), params=SamplingParams(max_tokens=2), options=CONFIG.options)
    with pytest.raises(ValueError, match=r"problem 'long' \(9 tokens\) does not fit the model's context of 8 "
                                         r"tokens .*stopped before generating anything"):
        evaluate(LocalGenerator(model), problems, config, tmp_path)
    assert model.calls == [] and not (tmp_path / "results.jsonl").exists()


def test_an_error_while_running_a_problem_names_it(tmp_path):
    class Failing(DiceGenerator):
        def generate(self, prompt, params, *, generator=None):
            if prompt == "question 3":
                raise ValueError("no room")
            return super().generate(prompt, params, generator=generator)

    with pytest.raises(ValueError, match="problem 'p3': no room"):
        evaluate(Failing(), PROBLEMS, CONFIG, tmp_path)


def test_a_file_written_when_the_native_class_was_llama_model_still_resumes(tmp_path):
    """The native backend's class was renamed LlamaModel -> DecoderModel; its identity keeps the
    recorded name, so a results file of the same model and set-up written before reuses every unit."""
    from metagen.eval.fingerprint import model_identity

    class DecoderModel:  # stands for metagen.models.decoder.DecoderModel (matched by class name)
        name, dtype, source = "m", "int4", ""

    written_before = {**MODEL, "weights": "source:x"}
    _, first = _run(tmp_path, model=written_before)
    DecoderModel.source = "x"
    identity = model_identity(DecoderModel())
    assert identity == written_before
    generator, again = _run(tmp_path, model=identity)
    assert generator.calls == [] and again == first
