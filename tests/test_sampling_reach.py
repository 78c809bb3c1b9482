"""Every `SamplingParams` field reaches the user everywhere it should: a `metagen generate` flag,
a request field of `metagen serve`, a row of the sampling guide and of the engines table. A new
sampling adapter added to `SamplingParams` alone fails here, naming the place it is missing
(docs/ARCHITECTURE.md, "A sampling adapter")."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

import pytest

from metagen.cli import build_parser
from metagen.remote.engines import ENGINES, GENERATOR_FIELDS
from metagen.sampling import SamplingParams
from metagen.serve.request_fields import SAMPLING_FIELDS

ROOT = Path(__file__).resolve().parents[1]
NAMES = [field.name for field in fields(SamplingParams)]
# fields set by other flags than --<name>: the constraint flags build structured_outputs; the
# OpenAI response_format is a server-side spelling of the same; --stop-token-id is repeatable
CLI_SPELLINGS = {"structured_outputs": "--json-schema", "response_format": None, "stop_token_ids": "--stop-token-id"}
SERVER_SPELLINGS = {"max_tokens": "max_tokens", "logprobs": "logprobs"}  # per-endpoint fields (completion_request.py)
# what the guide documents elsewhere than its adapters table: request shape, not token choice
GUIDE_ELSEWHERE = {"seed", "max_tokens", "stop", "stop_token_ids", "ignore_eos", "n", "logprobs",
                   "structured_outputs", "response_format", "token_healing"}


def _generate_flags() -> set[str]:
    parser = build_parser()
    generate = next(action for action in parser._subparsers._group_actions if action.choices).choices["generate"]
    return {flag for action in generate._actions for flag in action.option_strings}


@pytest.mark.parametrize("name", NAMES)
def test_every_field_has_a_generate_flag(name):
    flag = CLI_SPELLINGS.get(name, "--" + name.replace("_", "-"))
    if flag is None:
        return  # response_format: the server's spelling only
    assert flag in _generate_flags(), f"SamplingParams.{name} has no `metagen generate` flag {flag} (cli/sampling.py)"


@pytest.mark.parametrize("name", NAMES)
def test_every_field_is_a_request_field(name):
    assert name in SAMPLING_FIELDS or name in SERVER_SPELLINGS, (
        f"SamplingParams.{name} is not a request field of metagen serve (serve/request_fields.py SAMPLING_FIELDS)")


@pytest.mark.parametrize("name", [name for name in NAMES if name not in GUIDE_ELSEWHERE])
def test_every_adapter_has_a_row_in_the_sampling_guide(name):
    table = (ROOT / "docs/guides/sampling.md").read_text()
    assert re.search(rf"^\| [^|]*`{name}`", table, re.M), f"docs/guides/sampling.md has no row for `{name}`"


@pytest.mark.parametrize("name", [name for name in NAMES if name not in GENERATOR_FIELDS | {"token_healing"}])
def test_every_field_is_in_the_engines_table(name):
    """The table says, per engine, whether the field is sent or refused; metagen serve takes all."""
    rows = [line for line in (ROOT / "docs/engines/index.md").read_text().splitlines()
            if line.startswith("| ") and re.search(rf"\b{name}\b", line.split("|")[1])]
    assert rows, f"docs/engines/index.md's sampling table has no row naming {name}"
    assert name in ENGINES["metagen"].fields, f"the metagen engine does not send {name} (remote/engines.py)"
