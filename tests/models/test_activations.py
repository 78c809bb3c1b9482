"""The kernels' activation codes as a load option (`load(..., activations=)`, `--activations`):
refused by name when unknown, set on every linear of the model, not stored by the conversion
cache, part of the model's identity, and batch-invariant under either setting: a row's logits
alone and inside a batch of 4 are the same bits (prefill, a 1-token step, a 5-token verification)."""

from __future__ import annotations

import json

import pytest
import torch

from metagen.cli import main
from metagen.eval.fingerprint import model_identity
from metagen.models import load
from metagen.models.kernel_backend import ACTIVATIONS

PROMPTS = ["The capital of France is", "Once upon a time there", "def add(a, b):", "1, 2, 3, 4,"]


@pytest.fixture(scope="module")
def model_int8():
    return load(activations="int8")


@pytest.fixture(params=["int16", "int8"])
def either(request, model, model_int8):
    return model if request.param == "int16" else model_int8


def test_an_unknown_setting_is_refused_by_name_before_anything_loads(tmp_path):
    with pytest.raises(ValueError, match="activations='fp8' is not supported: choose one of int16, int8"):
        load(tmp_path / "missing.gguf", activations="fp8")


def test_every_linear_runs_the_setting_and_a_truncated_model_keeps_it(model, model_int8):
    assert model.activations == "int16" and model_int8.activations == "int8"
    for loaded, wide in ((model, True), (model_int8, False)):
        kernels = [linear for _, linear in loaded.linears() if linear.backend != "torch"]
        assert kernels, "the embedded model runs metagen's kernels"
        assert all(linear._wide is wide for linear in kernels)
        parts = [part for linear in kernels for part in getattr(linear, "parts", ())]
        assert all(part._wide is wide for part in parts)
    assert model_int8.truncated(10).activations == "int8"


def test_the_settings_give_different_logits_and_the_cache_keeps_neither(model, model_int8):
    """int8 codes change the logits slightly; loading int16 again after int8 (the same conversion
    cache entry) gives the int16 model's bits."""
    ids = [model.tokenizer.encode(PROMPTS[0])]
    wide = model.forward(model.new_cache(1), ids).logits
    narrow = model_int8.forward(model_int8.new_cache(1), ids).logits
    assert not torch.equal(wide, narrow)
    assert torch.equal(wide.argmax(-1), narrow.argmax(-1))
    again = load(activations="int16")
    assert torch.equal(again.forward(again.new_cache(1), ids).logits, wide)


def test_the_setting_is_part_of_the_identity_only_when_not_the_default(model, model_int8):
    assert "activations" not in model_identity(model)  # set-ups stored before the option keep their digest
    narrow = model_identity(model_int8)
    assert narrow.pop("activations") == "int8" and narrow == model_identity(model)


def test_a_rows_logits_do_not_depend_on_its_batch(either):
    """Row 0 alone and inside a batch of 4 rows of other lengths: prefill, a decode step and a
    5-token verification give the same bits."""
    ids = [either.tokenizer.encode(prompt) for prompt in PROMPTS]
    alone, batch = either.new_cache(1), either.new_cache(4)
    prefill = either.forward(alone, ids[:1], logits="all").logits  # (1, T0, V)
    assert torch.equal(prefill[0], either.forward(batch, ids, logits="all").logits[0, : len(ids[0])])
    step = either.forward(alone, [[42]]).logits
    assert torch.equal(step[0], either.forward(batch, [[42], [7], [42], [99]]).logits[0])
    verify = either.forward(alone, [[5, 6, 7, 8, 9]], logits="all").logits
    assert torch.equal(verify[0], either.forward(batch, [[5, 6, 7, 8, 9], [1, 2, 3, 4, 5]] * 2, logits="all").logits[0])


def test_the_cli_flag_reaches_the_model(capsys):
    assert main(["info", "--activations", "int8", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["activations"] == "int8"
    assert main(["info", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["activations"] == "int16"


def test_the_cli_refuses_an_unknown_setting(capsys):
    with pytest.raises(SystemExit):
        main(["info", "--activations", "fp8"])
    error = capsys.readouterr().err
    assert "argument --activations: invalid choice: 'fp8'" in error
    assert all(f"{name}" in error.split("choose from")[1] for name in ACTIVATIONS)
