"""Chat templates: rendering rules, message validation, and equality with transformers for SmolLM2."""

from __future__ import annotations

import json

import pytest

from metagen.models.chat import ChatTemplateError, render_chat_template, validate_messages

CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "What is 2+2?"},
    ],
    [
        {"role": "user", "content": "Hi!"},
        {"role": "assistant", "content": "Hello! How can I help you today?"},
        {"role": "user", "content": "Write a haiku about café ☕ and 中文.\nTwo lines are fine."},
    ],
    [
        {"role": "system", "content": "Answer in French."},
        {"role": "user", "content": "Good morning"},
        {"role": "assistant", "content": "Bonjour"},
        {"role": "user", "content": "  spaces around  "},
        {"role": "assistant", "content": "<|im_end|> in content"},
        {"role": "user", "content": ""},
    ],
]


@pytest.fixture(scope="module")
def smollm2():
    import gguf

    from metagen.models.embedded import embedded_model_path
    from metagen.models.tokenizer import Tokenizer

    return Tokenizer.from_gguf(gguf.GGUFReader(embedded_model_path()))


@pytest.mark.slow
@pytest.mark.parametrize("messages", CONVERSATIONS)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_smollm2_rendering_matches_transformers(smollm2, reference, messages, add_generation_prompt):
    ours = smollm2.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)
    theirs = reference.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    assert ours == theirs


@pytest.mark.slow
@pytest.mark.parametrize("messages", CONVERSATIONS)
def test_smollm2_encode_chat_matches_transformers(smollm2, reference, messages):
    expected = reference.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, return_dict=False)
    assert smollm2.encode_chat(messages) == expected


@pytest.mark.slow
def test_smollm2_template_by_hand(smollm2):
    text = smollm2.apply_chat_template([{"role": "user", "content": "Hi"}])
    assert text == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    ids = smollm2.encode_chat([{"role": "user", "content": "Hi"}])
    assert ids[0] == 1 and ids[-4:] == smollm2.encode("<|im_start|>assistant\n")
    assert ids.count(2) == 2  # two <|im_end|>, one per finished turn


# -- rendering rules, no model file -----------------------------------------------------------------


def _render(template, messages=({"role": "user", "content": "hi"},), **kwargs):
    return render_chat_template(template, list(messages), **kwargs)


def test_trim_blocks_and_lstrip_blocks():
    # trim_blocks drops the newline after a block tag; lstrip_blocks drops the indentation before it.
    template = (
        "{% for m in messages %}\n    {% if m['role'] == 'user' %}\n"
        "[{{ m['content'] }}]\n    {% endif %}\n{% endfor %}"
    )
    pairs = [("user", "a"), ("assistant", "b"), ("user", "c")]
    messages = [{"role": role, "content": content} for role, content in pairs]
    assert _render(template, messages) == "[a]\n[c]\n"


def test_variables_generation_prompt_and_special_tokens():
    template = "{{ bos_token }}{{ messages[0]['content'] }}{% if add_generation_prompt %}>{% endif %}{{ eos_token }}"
    assert _render(template, bos_token="<s>", eos_token="</s>") == "<s>hi></s>"
    assert _render(template, add_generation_prompt=False, bos_token="<s>", eos_token="</s>") == "<s>hi</s>"
    assert _render("{{ tools is none }} {{ documents is none }} {{ extra }}", extra=7) == "True True 7"


def test_raise_exception_becomes_chat_template_error():
    template = "{% if messages[0]['role'] != 'system' %}{{ raise_exception('system first') }}{% endif %}"
    with pytest.raises(ChatTemplateError, match="system first"):
        _render(template)
    assert issubclass(ChatTemplateError, ValueError)
    with pytest.raises(ChatTemplateError, match="does not compile"):
        _render("{% for %}")


def test_tojson_keeps_unicode_and_html():
    value = {"text": "café <b>&</b> 中", "n": [1, 2]}
    assert _render("{{ x | tojson }}", x=value) == json.dumps(value, ensure_ascii=False)
    assert _render("{{ x | tojson(indent=2) }}", x={"a": 1}) == '{\n  "a": 1\n}'


def test_strftime_now_and_loop_controls_and_generation_block():
    assert len(_render("{{ strftime_now('%Y-%m-%d') }}")) == len("2024-01-01")
    template = "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}{{ m['content'] }}{% endfor %}"
    assert _render(template, [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]) == "a"
    assert _render("<{% generation %}{{ messages[0]['content'] }}{% endgeneration %}>") == "<hi>"


def test_sandbox_blocks_attribute_escapes():
    with pytest.raises(ChatTemplateError, match="unsafe"):
        _render("{{ messages.__class__.__mro__ }}")


def test_none_valued_keys_are_dropped():
    template = "{% for m in messages %}{{ 'name' in m }}{% endfor %}"
    assert _render(template, [{"role": "user", "content": "x", "name": None}]) == "False"


@pytest.mark.parametrize(
    ("messages", "message"),
    [
        ([], "empty"),
        ("hello", "list"),
        ([("user", "hi")], r"messages\[0\] must be a dict"),
        ([{"role": "robot", "content": "hi"}], r"messages\[0\]\['role'\] must be one of"),
        ([{"content": "hi"}], "role"),
        ([{"role": "user", "content": "a"}, {"role": "user"}], r"messages\[1\] has no 'content'"),
        ([{"role": "user", "content": ["a", "b"]}], r"'content'\] must be a str, got list"),
    ],
)
def test_invalid_messages_raise_value_error(messages, message):
    with pytest.raises(ValueError, match=message):
        validate_messages(messages)


def test_assistant_tool_call_may_omit_content():
    messages = [{"role": "assistant", "tool_calls": [{"name": "f"}]}, {"role": "tool", "content": "42"}]
    assert validate_messages(messages) == messages
    original = [{"role": "user", "content": "x", "name": None}]
    assert validate_messages(original) == [{"role": "user", "content": "x"}]
    assert original[0]["name"] is None  # the input is not modified
