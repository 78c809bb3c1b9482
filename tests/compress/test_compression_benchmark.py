"""benchmarks/compression.py's logic: saved copies reused or refused, interleaved timing and its
ratio, self-draft acceptance counted through metagen's speculative loop."""

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from metagen.models import load

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "compression.py"
_spec = importlib.util.spec_from_file_location("compression_benchmark", _PATH)
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


@pytest.fixture
def tiny(tiny_checkpoint):
    return load(tiny_checkpoint, "fp32", use_cache=False)


def test_slugs_and_row_names():
    assert bench.slug("GPTQ int4") == "gptq-int4"
    assert bench.slug("SparseGPT 2:4") == "sparsegpt-2-4"
    assert bench.slug("magnitude 50%") == "magnitude-50"
    assert len({bench.slug(name) for name in bench.ROWS}) == len(bench.ROWS)
    assert bench.row_names(" RTN int3 , GPTQ int3") == ["RTN int3", "GPTQ int3"]
    with pytest.raises(ValueError, match="row 'GPTQ int2' is not in the table"):
        bench.row_names("RTN int3,GPTQ int2")
    with pytest.raises(ValueError, match="no rows"):
        bench.row_names(" , ")


def test_interleaved_alternates_which_model_runs_first_after_one_warm_up_each():
    calls = []
    clock = iter(range(100))

    def timed(label):
        def run():
            calls.append(label)
            return float(next(clock))
        return run

    a, b = bench.interleaved(timed("dense"), timed("model"), 3)
    assert calls == ["dense", "model", "dense", "model", "model", "dense", "dense", "model"]
    assert a == [2.0, 5.0, 6.0] and b == [3.0, 4.0, 7.0]
    with pytest.raises(ValueError, match="rounds=0"):
        bench.interleaved(timed("dense"), timed("model"), 0)


def test_speed_ratio_is_the_median_of_per_round_ratios():
    assert bench.speed_ratio([2.0, 4.0, 6.0], [1.0, 1.0, 2.0]) == 3.0  # ratios 2, 4, 3
    assert bench.speed_ratio([1.0, 1.0], [2.0, 4.0]) == pytest.approx(0.375)  # 0.5, 0.25
    with pytest.raises(ValueError):
        bench.speed_ratio([1.0], [1.0, 2.0])


def test_excerpts_spread_over_long_paragraphs():
    text = "\n\n".join(f"{i:02d}" + "x" * (10 + 5 * (i % 2)) for i in range(8))  # odd ones are 17 chars
    assert bench.excerpts(text, 2, characters=12) == ["01" + "x" * 10, "05" + "x" * 10]
    with pytest.raises(ValueError, match="fewer than 5"):
        bench.excerpts(text, 5, characters=12)


def test_a_saved_copy_is_reused_and_one_of_another_recipe_refused(tiny, tmp_path):
    first, facts = bench.obtain(tiny, "RTN int3", [], tmp_path)
    assert not facts["reused"] and (tmp_path / "rtn-int3" / "recipe.json").is_file()
    again, facts_again = bench.obtain(tiny, "RTN int3", [], tmp_path)
    assert facts_again == {"seconds": facts["seconds"], "calibration_tokens": 0, "reused": True}
    ids = [[1, 2, 3, 4]]
    logits = [m.forward(m.new_cache(1), ids, logits="all").logits for m in (first, again)]
    assert torch.equal(*logits)
    record = json.loads((tmp_path / "rtn-int3" / "recipe.json").read_text())
    record["recipe"]["clip"] = True
    (tmp_path / "rtn-int3" / "recipe.json").write_text(json.dumps(record))
    with pytest.raises(ValueError, match="rtn-int3 holds another compression"):
        bench.obtain(tiny, "RTN int3", [], tmp_path)


def test_calibration_tokens_are_part_of_what_a_saved_copy_must_match(tiny, tmp_path):
    generator = torch.Generator().manual_seed(0)
    rows = torch.randint(0, 49152, (2, 16), generator=generator).tolist()
    _, facts = bench.obtain(tiny, "GPTQ int3", rows, tmp_path)
    assert facts["calibration_tokens"] == 32
    with pytest.raises(ValueError, match="holds another compression"):
        bench.obtain(tiny, "GPTQ int3", rows[:1], tmp_path)


def test_a_target_drafting_for_itself_accepts_every_token_and_a_coarse_copy_does_not(tiny):
    prompts = ["The light of the sun", "Colours of thin plates"]
    for temperature in (0.0, 1.0):
        same = bench.acceptance_of(tiny, tiny, prompts, temperature, new_tokens=9, gamma=4)
        assert same["acceptance_rate"] == 1.0 and same["accepted_tokens"] == same["draft_tokens"] > 0
        assert same["generated_tokens"] == 2 * 9
    coarse, _ = bench.obtain(tiny, "RTN int3", [], None)
    other = bench.acceptance_of(tiny, coarse, prompts, 1.0, new_tokens=9, gamma=4)
    assert 0.0 < other["acceptance_rate"] < 1.0
    assert other["generated_tokens"] == 2 * 9
    assert other["block_efficiency"] == pytest.approx(other["generated_tokens"] / other["target_steps"], abs=1e-3)


def test_layer_rows_add_obc_to_the_methods_of_the_table_but_not_to_its_rows():
    assert bench.row_names("OBC int4,GPTQ int4", bench.LAYER_ROWS) == ["OBC int4", "GPTQ int4"]
    assert "dense" not in bench.LAYER_ROWS
    assert bench.row_names(bench.LAYER_DEFAULT, bench.LAYER_ROWS)
    with pytest.raises(ValueError, match="row 'OBC int4' is not in the table"):
        bench.row_names("OBC int4")
    assert bench.int_list("0, 15", "--layers") == [0, 15]
    with pytest.raises(ValueError, match="--layers='a' must be"):
        bench.int_list("a", "--layers")


def test_weight_rows_take_the_first_rows_of_each_projection():
    weight = torch.arange(12.0).reshape(6, 2)  # projections of 3, 2 and 1 rows
    sub, parts = bench.weight_rows(weight, (3, 2, 1), 1)
    assert parts == (1, 1, 1) and sub.tolist() == [[0.0, 1.0], [6.0, 7.0], [10.0, 11.0]]
    assert bench.weight_rows(weight, None, 2)[0].tolist() == weight[:2].tolist()
    assert bench.weight_rows(weight, None, None) == (weight, (6,))
    with pytest.raises(ValueError, match=r"weight rows=2 is out of range: must be an int in \[1, 1\]"):
        bench.weight_rows(weight, (3, 2, 1), 2)


def test_relative_error_is_the_layer_output_error_over_the_output():
    from metagen.compress.hessian import HessianAccumulator, layer_error

    generator = torch.Generator().manual_seed(0)
    weight, noise = torch.randn(5, 7, generator=generator), 0.1 * torch.randn(5, 7, generator=generator)
    inputs = torch.randn(30, 7, generator=generator)
    accumulator = HessianAccumulator(7)
    accumulator.add(inputs[:10])
    accumulator.add(inputs[10:])
    output = float((weight.double() @ inputs.double().t()).square().sum())
    expected = layer_error(weight, weight + noise, inputs) / output
    assert bench.relative_error(weight, weight + noise, accumulator.hessian) == pytest.approx(expected, rel=1e-9)
    assert bench.relative_error(weight, weight, accumulator.hessian) == 0.0


def test_layer_errors_measure_each_method_on_a_subset_of_rows(tiny):
    generator = torch.Generator().manual_seed(0)
    calibration = torch.randint(0, 49152, (2, 32), generator=generator).tolist()
    heldout = torch.randint(0, 49152, (2, 32), generator=generator).tolist()
    rows = []
    names = ["RTN int4", "OBC int4", "GPTQ int4", "magnitude 50%", "OBC 50%"]
    bench.layer_errors(tiny, calibration, heldout, [1], ["qkv", "down"], names, 4, rows.append)
    assert [(r["linear"], r["row"]) for r in rows] == [(linear, name) for linear in ("qkv", "down") for name in names]
    qkv = {r["row"]: r for r in rows if r["linear"] == "qkv"}
    assert qkv["RTN int4"]["rows"] == 3 * 4 and qkv["RTN int4"]["of_rows"] == tiny.layers[1].qkv.weight.shape[0]
    # the second-order methods beat their data-free counterparts on the loss they minimize
    assert qkv["OBC int4"]["relative_error"] < qkv["RTN int4"]["relative_error"]
    assert qkv["GPTQ int4"]["relative_error"] < qkv["RTN int4"]["relative_error"]
    assert qkv["OBC 50%"]["relative_error"] < qkv["magnitude 50%"]["relative_error"]
    assert all(r["heldout_relative_error"] > 0 for r in rows)
    assert all(r["seconds_all_rows_estimate"] == pytest.approx(r["seconds"] * r["of_rows"] / r["rows"], abs=0.1)
               for r in rows)
    with pytest.raises(ValueError, match="linear 'mlp' is not in layer 1"):
        bench.layer_errors(tiny, calibration, heldout, [1], ["mlp"], names, 4, rows.append)
