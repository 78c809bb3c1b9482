"""token_healing is honoured or refused by name in every loop that takes SamplingParams (never
ignored): tree search's expanders, tokenwise controlled decoding and remote servers refuse it;
which prompts end with the chat template's assistant header (where healing is refused)."""

from __future__ import annotations

import pytest
import torch

from metagen.decoding.prompts import ends_with_generation_prompt
from metagen.remote.engines import ENGINES, sampling_fields
from metagen.sampling import SamplingParams
from metagen.scoring.process_reward import FunctionValue
from metagen.strategies.tokenwise_cd import TokenwiseCDConfig, tokenwise_cd
from metagen.strategies.tree.expand import StepConfig, StepExpander
from metagen.strategies.tree.remote_expand import RemoteStepExpander

from .toy_model import BOS, ToyModel

HEAL = SamplingParams(max_tokens=4, token_healing=True)


def test_step_expanders_refuse_token_healing():
    with pytest.raises(ValueError, match="token_healing=True is not supported by tree search"):
        StepExpander(ToyModel(), [BOS], HEAL, StepConfig(delimiter=None, max_step_tokens=1))
    from tests.strategies.tree.toy_server import ToyServer

    with pytest.raises(ValueError, match="token_healing=True is not supported by tree search"):
        RemoteStepExpander(ToyServer(), "a", HEAL, StepConfig(delimiter="b", max_step_tokens=2),
                           generator=torch.Generator().manual_seed(0))


def test_tokenwise_cd_refuses_token_healing():
    config = TokenwiseCDConfig(n=2, top_k=2, params=HEAL)
    with pytest.raises(ValueError, match="token_healing=True is not supported by tokenwise controlled decoding"):
        tokenwise_cd(ToyModel(), [BOS], FunctionValue(lambda prompt, continuation: 0.0), config)


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_remote_engines_refuse_token_healing_by_name(engine):
    with pytest.raises(ValueError, match=r"token_healing=True is not supported by"):
        sampling_fields(HEAL, ENGINES[engine])
    assert "token_healing" not in sampling_fields(SamplingParams(), ENGINES[engine])


def test_token_healing_must_be_a_bool():
    with pytest.raises(ValueError, match="token_healing=1 must be a bool"):
        SamplingParams(token_healing=1)


class _Templated:
    chat_template = "{{ messages }}"


class _Plain:
    chat_template = None


@pytest.mark.parametrize("tokenizer, prompt, chat, expected", [
    (_Templated(), "text", None, True),
    (_Templated(), "text", False, False),
    (_Plain(), "text", None, False),
    (_Plain(), "text", True, True),
    (_Plain(), [{"role": "user", "content": "x"}], None, True),
    (_Plain(), [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}], None, False),
    (_Templated(), [1, 2, 3], None, False),
])
def test_which_prompts_end_with_the_assistant_header(tokenizer, prompt, chat, expected):
    assert ends_with_generation_prompt(tokenizer, prompt, chat) is expected
