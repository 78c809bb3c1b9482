"""The argument checks shared by the caches, the models and encode_prompt."""

import numpy as np
import pytest
import torch

from metagen.models import checks


@pytest.mark.parametrize("value", [3, np.int64(3), np.uint8(3), torch.tensor(3)])
def test_integers_of_any_library_are_ints(value):
    assert checks.integer("n", value) == 3 and type(checks.integer("n", value)) is int


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (True, "n must be an int, got the bool True"),
        (np.bool_(False), "got the bool np.False_"),
        (torch.tensor(True), "got the bool"),
        (3.0, r"n must be an int, got 3\.0 \(float\)"),
        (np.float32(3), r"\(float32\)"),
        (torch.tensor(3.0), r"\(Tensor\)"),
        ("3", r"got '3' \(str\)"),
        (None, r"\(NoneType\)"),
    ],
)
def test_bools_floats_and_others_are_type_errors(value, message):
    with pytest.raises(TypeError, match=message):
        checks.integer("n", value)


def test_ranges_are_named_in_the_message():
    assert checks.bounded("length", 4, 0, 4) == 4
    with pytest.raises(ValueError, match=r"length=5 is out of range: must be in \[0, 4\]"):
        checks.bounded("length", 5, 0, 4)
    with pytest.raises(ValueError, match="batch_size=0 is out of range: must be >= 1"):
        checks.bounded("batch_size", 0, 1)
    with pytest.raises(ValueError, match="row=0 is out of range: the cache has no rows"):
        checks.row("row", 0, 0)


def test_row_lists():
    assert checks.rows("indices", [], 0).tolist() == []
    assert checks.rows("indices", np.zeros(0), 3).tolist() == []  # an empty float array holds no float
    assert checks.rows("indices", (2, np.int32(0)), 3).tolist() == [2, 0]
    with pytest.raises(ValueError, match=r"must be a flat sequence of row numbers, got shape \(1, 2\)"):
        checks.rows("indices", np.array([[0, 1]]), 3)
    with pytest.raises(TypeError, match="indices must hold ints, got dtype torch.bool"):
        checks.rows("indices", torch.tensor([True, False]), 3)
    with pytest.raises(TypeError, match="must be a sequence of row numbers, got int"):
        checks.rows("indices", 1, 3)


def test_text_must_be_encodable_as_utf8():
    assert checks.utf8_text("prompt", "café ☕") == "café ☕"
    with pytest.raises(ValueError, match=r"prompt is not valid Unicode text: character 2 is the lone surrogate '\\udcff'"):
        checks.utf8_text("prompt", "ab\udcffc")
