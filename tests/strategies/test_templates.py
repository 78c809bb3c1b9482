"""Templates (self-refine's critique and revision, verifier refinement's revision, a chain's steps)
take named fields only: a format spec, a conversion, an attribute, an index or a positional field
is refused by the one checker, naming the option, before anything is formatted."""

from __future__ import annotations

import pytest

from metagen.strategies.chain import CallTool, Chain, Generate, ToolBinding
from metagen.strategies.self_refine import SelfRefineConfig
from metagen.strategies.verifier_refine import VerifierRefineConfig
from metagen.tools import Calculator

HOSTILE = [
    ("{answer:a>20000000}", "format spec"),  # 20 MB of padding per critique: 490 MB and 15 s in a server
    ("{answer:{question}}", "format spec"),  # a nested field inside a spec
    ("{answer!r}", "conversion"),
    ("{answer!s:>9}", "conversion"),
    ("{answer.__class__}", "attribute or index"),
    ("{answer[0]}", "attribute or index"),
    ("{} {answer}", "positional"),
    ("{0} {answer}", "positional"),
]


@pytest.mark.parametrize(("template", "what"), HOSTILE)
def test_self_refine_templates_take_named_fields_only(template, what):
    with pytest.raises(ValueError, match=rf"^critique_template=.* {what}"):
        SelfRefineConfig(critique_template=template)
    with pytest.raises(ValueError, match=rf"^revision_template=.* {what}"):
        SelfRefineConfig(revision_template=template + "{critique}")


@pytest.mark.parametrize(("template", "what"), HOSTILE)
def test_verifier_refine_template_takes_named_fields_only(template, what):
    with pytest.raises(ValueError, match=rf"^revision_template=.* {what}"):
        VerifierRefineConfig(revision_template=template + "{feedback}")


def test_plain_fields_and_escaped_braces_are_accepted():
    config = SelfRefineConfig(critique_template="{{json}} {question}: {answer} -- {stop_phrase}")
    assert config.critique_template.format(question="q", answer="a", stop_phrase="s") == "{json} q: a -- s"


def test_a_served_self_refine_option_is_refused_by_name():
    from metagen.strategies.registry import get_strategy

    with pytest.raises(ValueError, match=r"^metagen\.critique_template='\{answer:a>20000000\}' .*format spec"):
        get_strategy("self_refine").parse({"critique_template": "{answer:a>20000000}"}, "metagen.")


@pytest.mark.parametrize("step", [
    Generate("reasoning", "{question:>99999999}"),
    Generate("reasoning", "{question}", system="{question!r}"),
    Generate("reasoning", "{question}", prefill="{question.upper}"),
    Generate("reasoning", "{question}", tools=(ToolBinding(Calculator(), "<<", ">>", answer="{output:>9999}"),)),
    Generate("reasoning", "{question}", tools=(ToolBinding(Generate("sub", "{input[0]}"), "<<", ">>"),)),
    CallTool("check", Calculator(), "{expression:>99999999}"),
])
def test_chain_templates_are_checked_when_the_chain_is_built(step):
    with pytest.raises(ValueError, match=r"template"):
        Chain([step])


def test_chain_templates_with_named_fields_and_callables_are_accepted():
    Chain([Generate("reasoning", "{question} {{literal}}", system=lambda values: "x", prefill="Let's"),
           CallTool("check", Calculator(), "{reasoning}")])
