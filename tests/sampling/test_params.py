from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from metagen.sampling import SamplingParams

BAD_VALUES = [
    ("temperature", -0.1),
    ("temperature", math.nan),
    ("temperature", math.inf),
    ("temperature", "hot"),
    ("top_p", 0.0),
    ("top_p", 1.5),
    ("top_k", -2),
    ("top_k", 2.5),
    ("top_k", True),
    ("min_p", -0.1),
    ("min_p", 1.1),
    ("typical_p", 0.0),
    ("typical_p", 2),
    ("epsilon_cutoff", -0.001),
    ("epsilon_cutoff", 1.0),
    ("eta_cutoff", -0.5),
    ("eta_cutoff", 1.0),
    ("repetition_penalty", 0.0),
    ("repetition_penalty", -1.2),
    ("repetition_penalty", math.inf),
    ("frequency_penalty", 2.5),
    ("frequency_penalty", -3.0),
    ("presence_penalty", 2.01),
    ("presence_penalty", -2.01),
    ("no_repeat_ngram_size", -1),
    ("no_repeat_ngram_size", 2.0),
    ("mirostat_tau", 0.0),
    ("mirostat_tau", -3.0),
    ("mirostat_eta", 0.0),
    ("mirostat_eta", 1.5),
    ("seed", -1),
    ("seed", 2**64),
    ("seed", 1.5),
    ("max_tokens", 0),
    ("max_tokens", 10.0),
    ("n", 0),
    ("logprobs", 21),
    ("logprobs", -1),
    ("stop", 5),
    ("stop", [""]),
    ("stop", ["ok", 3]),
    ("stop_token_ids", "12"),
    ("ignore_eos", "yes"),
]
# (field, bad value, the fragment of the message that shows the offending entry)
BAD_ENTRIES = [
    ("logit_bias", {1: 101.0}, "logit_bias[1]=101.0"),
    ("logit_bias", {1: -100.5}, "logit_bias[1]=-100.5"),
    ("logit_bias", {-1: 1.0}, "logit_bias token id=-1"),
    ("logit_bias", {1: math.nan}, "logit_bias[1]=nan"),
    ("stop_token_ids", [3, -1], "stop_token_ids entry=-1"),
]


@pytest.mark.parametrize(("field", "value"), BAD_VALUES)
def test_bad_value_names_field_and_value(field: str, value: object) -> None:
    with pytest.raises(ValueError) as error:
        SamplingParams(**{field: value})
    message = str(error.value)
    assert message.startswith(f"{field}={value!r} "), message


@pytest.mark.parametrize(("field", "value", "fragment"), BAD_ENTRIES)
def test_bad_entry_names_field_and_entry(field: str, value: object, fragment: str) -> None:
    with pytest.raises(ValueError) as error:
        SamplingParams(**{field: value})
    assert str(error.value).startswith(fragment), str(error.value)


def test_message_states_the_range() -> None:
    with pytest.raises(ValueError, match=r"^top_p=1\.5 is out of range: must be in \(0, 1\]$"):
        SamplingParams(top_p=1.5)
    with pytest.raises(ValueError, match=r"logprobs=21 is out of range: must be an int in \[0, 20\]"):
        SamplingParams(logprobs=21)


def test_defaults_match_vllm_and_openai() -> None:
    params = SamplingParams()
    assert (params.temperature, params.top_p, params.top_k, params.min_p) == (1.0, 1.0, 0, 0.0)
    assert (params.repetition_penalty, params.frequency_penalty, params.presence_penalty) == (1.0, 0.0, 0.0)
    assert params.max_tokens == 256 and params.n == 1 and params.logprobs is None
    assert params.is_default_sampling and not params.greedy and not params.has_penalties


@pytest.mark.parametrize(
    "field_value",
    [("top_k", 40), ("top_p", 0.9), ("min_p", 0.05), ("typical_p", 0.9), ("epsilon_cutoff", 3e-4),
     ("eta_cutoff", 3e-4), ("temperature", 0.0)],
)
def test_mirostat_excludes_truncation_naming_both_fields(field_value: tuple[str, float]) -> None:
    field, value = field_value
    with pytest.raises(ValueError, match=rf"mirostat_tau=5\.0 .*{field}={value!r}"):
        SamplingParams(mirostat_tau=5.0, **{field: value})


def test_mirostat_with_temperature_and_penalties_is_fine() -> None:
    params = SamplingParams(mirostat_tau=5.0, temperature=0.8, repetition_penalty=1.1)
    assert params.uses_mirostat and params.mirostat_eta == 0.1


def test_disabled_top_k_values() -> None:
    assert SamplingParams(top_k=-1).active_truncations == ()
    assert SamplingParams(top_k=0).active_truncations == ()
    assert SamplingParams(top_k=1, top_p=0.5).active_truncations == ("top_k", "top_p")


def test_normalisation_and_hashing() -> None:
    params = SamplingParams(stop="###", stop_token_ids=[7, 2], logit_bias={5: 1, 2: -3.5}, temperature=1)
    assert params.stop == ("###",)
    assert params.stop_token_ids == (7, 2)
    assert params.logit_bias == ((2, -3.5), (5, 1.0))
    assert params.logit_bias_map == {2: -3.5, 5: 1.0}
    assert isinstance(params.temperature, float)
    assert hash(params) == hash(SamplingParams(stop=["###"], stop_token_ids=(7, 2), logit_bias={2: -3.5, 5: 1.0}))
    assert SamplingParams(stop=["a", "b"]).stop == ("a", "b")
    assert params.to_dict()["logit_bias"] == {2: -3.5, 5: 1.0}


def test_frozen_and_replace_revalidates() -> None:
    params = SamplingParams(logit_bias={1: 2.0})
    with pytest.raises(dataclasses.FrozenInstanceError):
        params.top_p = 0.5  # type: ignore[misc]
    changed = dataclasses.replace(params, top_p=0.5)
    assert changed.top_p == 0.5 and changed.logit_bias == ((1, 2.0),)
    with pytest.raises(ValueError, match="top_p"):
        dataclasses.replace(params, top_p=2.0)


def test_greedy_and_penalty_flags() -> None:
    assert SamplingParams(temperature=0).greedy
    assert SamplingParams(no_repeat_ngram_size=3).has_penalties
    assert not SamplingParams(top_p=0.9).is_default_sampling


def test_make_generator() -> None:
    first = torch.rand(3, generator=SamplingParams(seed=11).make_generator())
    second = torch.rand(3, generator=SamplingParams(seed=11).make_generator())
    assert torch.equal(first, second)
    assert isinstance(SamplingParams().make_generator(), torch.Generator)
