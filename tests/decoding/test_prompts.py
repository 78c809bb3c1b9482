"""encode_prompt refuses what cannot be a prompt with a ValueError that says what is wrong, so
every entry point (generate, stream, beam_search, speculative decoding, the CLI) reports it the
same way. The real tokenizer's cases (OverflowError, TypeError before) are in test_generate_real."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from metagen.decoding import beam_search, generate
from metagen.decoding.prompts import encode_prompt
from metagen.sampling import SamplingParams

from .toy_model import BOS, VOCAB, A, ToyModel, ToyTokenizer

BAD_PROMPTS = [
    pytest.param([-1], r"prompt token id -1 \(item 0\) is out of range: must be in \[0, 5\)", id="negative-id"),
    pytest.param([BOS, VOCAB], r"prompt token id 5 \(item 1\) is out of range: must be in \[0, 5\)", id="id-past-vocab"),
    pytest.param([BOS, 1.0], r"prompt item 1 is 1\.0 \(float\): a prompt is a string", id="float-id"),
    pytest.param([True], r"prompt item 0 is True \(bool\)", id="bool-id"),
    pytest.param(["a"], r"prompt item 0 is 'a' \(str\)", id="list-of-str"),
    pytest.param([BOS, {"role": "user", "content": "a"}], r"prompt item 1 is \{", id="ids-and-a-message"),
    pytest.param(b"ab", r"prompt is bytes: decode it to str first", id="bytes"),
    pytest.param("a\udcff", r"prompt is not valid Unicode text: character 1 is the lone surrogate '\\udcff'",
                 id="lone-surrogate"),
    pytest.param([{"role": "user", "content": "\ud800b"}], r"messages\[0\]\['content'\] is not valid Unicode text",
                 id="surrogate-in-a-message"),
    pytest.param(7, r"prompt has type int: a prompt is a string", id="an-int"),
]


@pytest.mark.parametrize(("prompt", "message"), BAD_PROMPTS)
def test_bad_prompts_raise_value_errors_that_name_the_problem(prompt, message):
    """Regression: b"ab" was taken as the ids [97, 98]; the surrogate, negative and float cases
    raised a TypeError / OverflowError from the tokenizer or the detokenizer."""
    model = ToyModel()
    with pytest.raises(ValueError, match=message):
        generate(model, prompt, SamplingParams(max_tokens=2))
    assert model.calls == []  # refused before the model ran


@pytest.mark.parametrize(("prompt", "message"), BAD_PROMPTS[:3])
def test_beam_search_refuses_them_the_same_way(prompt, message):
    with pytest.raises(ValueError, match=message):
        beam_search(ToyModel(), prompt)


def test_integer_scalars_are_token_ids_and_the_vocabulary_bound_is_optional():
    tokenizer = ToyTokenizer()
    assert encode_prompt(tokenizer, [np.int64(BOS), torch.tensor(A)], vocab_size=VOCAB) == [BOS, A]
    assert encode_prompt(tokenizer, torch.tensor([BOS, A])) == [BOS, A]
    assert encode_prompt(tokenizer, [BOS, 99]) == [BOS, 99]  # the model's forward checks V then
    with pytest.raises(ValueError, match="must be >= 0"):
        encode_prompt(tokenizer, [-3])
