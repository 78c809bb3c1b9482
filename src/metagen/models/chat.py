"""Chat templates: a conversation (list of messages) rendered to the prompt text a chat model expects.

A chat template is a Jinja2 program shipped with the model (`tokenizer.chat_template` in a GGUF,
`chat_template` in `tokenizer_config.json` or a `chat_template.jinja` file). metagen renders it the way
the Hugging Face reference does, so the prompt matches the one the model was trained on:

- a sandboxed, immutable Jinja environment (templates are untrusted code),
- `trim_blocks=True, lstrip_blocks=True` (a block tag eats its newline and the indentation before it),
- the `loopcontrols` extension (`{% break %}`, `{% continue %}`) and a no-op `{% generation %}` block,
- the globals `raise_exception(message)` and `strftime_now(format)`, and a `tojson` filter that
  keeps non-ASCII characters and HTML as they are,
- the variables `messages`, `add_generation_prompt`, `bos_token`, `eos_token` and any extra ones
  (`tools`, `documents`, `enable_thinking`, ...).

Messages are dicts with a `role` and a string `content`; keys whose value is None are dropped before
rendering (many templates print a literal "None" for them but handle a missing key).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROLES = ("system", "developer", "user", "assistant", "tool")


class ChatTemplateError(ValueError):
    """The template did not compile, or it rejected the conversation (`raise_exception`)."""


def validate_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Check a conversation and return it as plain dicts without None-valued keys.

    Each message needs a `role` in `ROLES` and a string `content`; an assistant message that carries
    `tool_calls` may leave `content` out. Other keys are passed to the template unchanged.
    Raises ValueError naming the offending message.
    """
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise ValueError(f"messages must be a list of {{'role', 'content'}} dicts, got {type(messages).__name__}")
    if not messages:
        raise ValueError("messages is empty: a chat needs at least one message")
    cleaned = []
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise ValueError(
                f"messages[{index}] must be a dict with 'role' and 'content', got {type(message).__name__}"
            )
        role = message.get("role")
        if role not in ROLES:
            raise ValueError(f"messages[{index}]['role'] must be one of {ROLES}, got {role!r}")
        content = message.get("content")
        if content is None and not (role == "assistant" and message.get("tool_calls")):
            raise ValueError(f"messages[{index}] has no 'content'")
        if content is not None and not isinstance(content, str):
            raise ValueError(f"messages[{index}]['content'] must be a str, got {type(content).__name__}")
        cleaned.append({key: value for key, value in message.items() if value is not None})
    return cleaned


class _GenerationBlock(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` renders its body unchanged.

    Some templates mark the assistant's text with it so that training code can mask the loss; for
    rendering a prompt it is transparent.
    """

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> list[jinja2.nodes.Node]:
        next(parser.stream)  # the `generation` name
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(f"chat template rejected the conversation: {message}")


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators=None, sort_keys=False) -> str:
    # Jinja's own `tojson` escapes <, >, & and ' for HTML, which would change the prompt.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


@lru_cache(maxsize=32)
def compile_chat_template(template: str) -> jinja2.Template:
    """Compile a chat template once (cached by its text). Raises ChatTemplateError on a syntax error."""
    environment = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationBlock, jinja2.ext.loopcontrols]
    )
    environment.filters["tojson"] = _tojson
    environment.globals["raise_exception"] = _raise_exception
    environment.globals["strftime_now"] = _strftime_now
    try:
        return environment.from_string(template)
    except jinja2.TemplateSyntaxError as error:
        raise ChatTemplateError(f"chat template does not compile: {error}") from error


def render_chat_template(
    template: str,
    messages: Sequence[Mapping[str, Any]],
    *,
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
    bos_token: str | None = None,
    eos_token: str | None = None,
    **variables: Any,
) -> str:
    """Render `messages` with `template` to prompt text.

    `add_generation_prompt=True` appends the header that opens the assistant's turn (e.g.
    `<|im_start|>assistant\\n` for ChatML), so the model's next tokens are its reply.
    `continue_final_message=True` (with `add_generation_prompt=False`) leaves the final message open
    instead: the text ends right after that message's content, without the end-of-turn marker the
    template writes after it, so the model writes on from a partial reply (transformers'
    `apply_chat_template(continue_final_message=True)`). The content is kept verbatim, trailing
    spaces included. `variables` are extra template variables (`tools` and `documents` default to
    None, as in the reference); they override `bos_token` / `eos_token` if they name them too.
    Time complexity: linear in the rendered length.
    """
    if continue_final_message and add_generation_prompt:
        raise ValueError(
            "add_generation_prompt=True and continue_final_message=True contradict each other: "
            "the first opens a new assistant turn, the second continues the final message"
        )
    context = {"bos_token": bos_token, "eos_token": eos_token, "tools": None, "documents": None, **variables}
    context["messages"] = validate_messages(messages)
    context["add_generation_prompt"] = add_generation_prompt
    final = context["messages"][-1]
    if continue_final_message:
        if not isinstance(final.get("content"), str):
            raise ValueError("continue_final_message=True needs a final message with string content")
        # Render with a marker in place of the final content and cut there: this finds where the
        # content starts even when it is empty or repeats earlier text.
        context["messages"] = [*context["messages"][:-1], {**final, "content": _CONTINUE_MARKER}]
    try:
        text = compile_chat_template(template).render(**context)
    except ChatTemplateError:
        raise
    except jinja2.TemplateError as error:
        raise ChatTemplateError(f"chat template failed to render: {error}") from error
    if not continue_final_message:
        return text
    position = text.rfind(_CONTINUE_MARKER)
    if position < 0:
        raise ChatTemplateError("chat template drops the final message's content, so it cannot be continued")
    return text[:position] + final["content"]


_CONTINUE_MARKER = "metagenContinueFinalMessageMarker"
