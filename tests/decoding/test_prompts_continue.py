"""Continuing the final message of a conversation: the rendered text ends inside that message,
matching transformers' continue_final_message=True, and encode_prompt picks it for conversations
that end with an assistant message."""

from __future__ import annotations

import pytest

from metagen.decoding.prompts import encode_prompt
from metagen.models.chat import ChatTemplateError, render_chat_template

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
PARTIAL = [{"role": "user", "content": "What is 12 * 7?"}, {"role": "assistant", "content": "12 * 7 = <<12*7=84>>"}]


def test_the_text_ends_inside_the_final_message():
    text = render_chat_template(CHATML, PARTIAL, add_generation_prompt=False, continue_final_message=True)
    assert text == "<|im_start|>user\nWhat is 12 * 7?<|im_end|>\n<|im_start|>assistant\n12 * 7 = <<12*7=84>>"
    closed = render_chat_template(CHATML, PARTIAL, add_generation_prompt=False)
    assert closed == text + "<|im_end|>\n"


def test_empty_repeated_and_spaced_final_messages():
    repeated = [{"role": "user", "content": "Yes"}, {"role": "assistant", "content": "Yes"}]
    assert render_chat_template(CHATML, repeated, add_generation_prompt=False, continue_final_message=True).endswith(
        "<|im_start|>assistant\nYes"
    )
    empty = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": ""}]
    assert render_chat_template(CHATML, empty, add_generation_prompt=False, continue_final_message=True).endswith(
        "<|im_end|>\n<|im_start|>assistant\n"
    )
    spaced = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "The answer is "}]
    assert render_chat_template(CHATML, spaced, add_generation_prompt=False, continue_final_message=True).endswith(
        "assistant\nThe answer is "
    )


def test_contradictions_and_templates_that_drop_the_content():
    with pytest.raises(ValueError, match="contradict"):
        render_chat_template(CHATML, PARTIAL, add_generation_prompt=True, continue_final_message=True)
    dropping = "{% for message in messages %}{{ message['role'] }}:{% endfor %}"
    with pytest.raises(ChatTemplateError, match="cannot be continued"):
        render_chat_template(dropping, PARTIAL, add_generation_prompt=False, continue_final_message=True)


@pytest.fixture(scope="module")
def smollm2():
    import gguf

    from metagen.models.embedded import embedded_model_path
    from metagen.models.tokenizer import Tokenizer

    return Tokenizer.from_gguf(gguf.GGUFReader(embedded_model_path()))


def test_encode_prompt_continues_a_final_assistant_message(smollm2):
    ids = encode_prompt(smollm2, PARTIAL)
    text = smollm2.apply_chat_template(PARTIAL, add_generation_prompt=False, continue_final_message=True)
    assert ids == smollm2.encode(text, add_special_tokens=False)
    assert smollm2.decode(ids).endswith("<|im_start|>assistant\n12 * 7 = <<12*7=84>>")
    # a conversation ending with a user message still gets the generation prompt
    assert smollm2.decode(encode_prompt(smollm2, PARTIAL[:1])).endswith("<|im_start|>assistant\n")


@pytest.mark.slow
@pytest.mark.parametrize(
    "messages",
    [
        PARTIAL,
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."},
         {"role": "assistant", "content": "Let's think step by step. The sky is"}],
        [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "Q"},
         {"role": "assistant", "content": "So the final answer is: café ☕"}],
    ],
)
def test_smollm2_continuation_matches_transformers(smollm2, reference, messages):
    theirs = reference.apply_chat_template(messages, tokenize=False, add_generation_prompt=False,
                                           continue_final_message=True)
    assert smollm2.apply_chat_template(messages, add_generation_prompt=False, continue_final_message=True) == theirs
