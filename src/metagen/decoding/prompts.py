"""Turning what users pass as a prompt into token ids, refusing what cannot be a prompt.

Every bad prompt raises ValueError naming what is wrong (the CLI prints it as a one-line error):
an empty prompt, bytes (decode them first), text with lone surrogates (what Python makes of
bytes that are not UTF-8, e.g. in `sys.argv`), token ids that are not ints or lie outside
[0, vocab_size), or a list mixing messages with other items.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from metagen.models import checks

Prompt = str | Sequence[Mapping[str, str]] | Sequence[int]

KINDS = "a prompt is a string, a list of chat messages, or a list of int token ids"


def encode_prompt(tokenizer, prompt: Prompt, chat: bool | None = None, *, vocab_size: int | None = None) -> list[int]:
    """Token ids for a prompt.

    prompt: text, chat messages ([{"role", "content"}, ...]) or token ids.
    chat: for text, wrap it as one user message in the model's chat template (None: when the
        model has a template). Messages always use the template; ids are taken as they are.
    vocab_size: the model's V; token ids must lie in [0, V) (without it, only >= 0 is checked).
    Messages ending with an assistant message are continued: the template is rendered without
    the generation prompt and cut right after that message's text, so the model writes on from a
    partial reply (a prefilled answer, or its own text with a tool's result appended). This is
    transformers' `continue_final_message=True`, which its text-generation pipeline also picks
    by default for such conversations.
    Raises ValueError for a prompt that is empty or not one of those (see the module docstring).
    """
    if isinstance(prompt, (bytes, bytearray, memoryview)):
        raise ValueError("prompt is bytes: decode it to str first (e.g. prompt.decode('utf-8'))")
    if isinstance(prompt, str):
        if not prompt:
            raise ValueError("prompt is empty: give at least one character or token")
        checks.utf8_text("prompt", prompt)
        use_chat = tokenizer.chat_template is not None if chat is None else chat
        if use_chat:
            return tokenizer.encode_chat([{"role": "user", "content": prompt}], add_generation_prompt=True)
        return tokenizer.encode(prompt, add_special_tokens=True)
    if not isinstance(prompt, Iterable):
        raise ValueError(f"prompt has type {type(prompt).__name__}: {KINDS}")
    items = list(prompt)
    if not items:
        raise ValueError("prompt is empty: give at least one character or token")
    if all(isinstance(item, Mapping) for item in items):
        if chat is False:
            raise ValueError("chat=False was given with chat messages; pass text or token ids instead")
        _check_message_text(items)
        if items[-1].get("role") == "assistant":
            return tokenizer.encode_chat(items, add_generation_prompt=False, continue_final_message=True)
        return tokenizer.encode_chat(items, add_generation_prompt=True)
    return _token_ids(items, vocab_size)


def ends_with_generation_prompt(tokenizer, prompt: Prompt, chat: bool | None = None) -> bool:
    """True when `encode_prompt(tokenizer, prompt, chat)` ends with the chat template's generation
    prompt (the assistant header): text under the template, or messages whose last one is not the
    assistant's. Token ids and plain text end with the caller's own tokens."""
    if isinstance(prompt, str):
        return tokenizer.chat_template is not None if chat is None else bool(chat)
    if isinstance(prompt, Sequence) and prompt and all(isinstance(item, Mapping) for item in prompt):
        return prompt[-1].get("role") != "assistant"
    return False


def _token_ids(items: list[object], vocab_size: int | None) -> list[int]:
    """Prompt items as token ids: ints (numpy / torch integer scalars too, not bools) in [0, V)."""
    ids = []
    for position, item in enumerate(items):
        try:
            token = checks.integer("token id", item)
        except TypeError:
            raise ValueError(f"prompt item {position} is {item!r} ({type(item).__name__}): {KINDS}") from None
        if token < 0 or (vocab_size is not None and token >= vocab_size):
            allowed = ">= 0" if vocab_size is None else f"in [0, {vocab_size})"
            raise ValueError(f"prompt token id {token} (item {position}) is out of range: must be {allowed}")
        ids.append(token)
    return ids


def _check_message_text(messages: list[Mapping]) -> None:
    """Every str field of every message must be text UTF-8 can encode."""
    for index, message in enumerate(messages):
        for key, value in message.items():
            if isinstance(value, str):
                checks.utf8_text(f"messages[{index}][{key!r}]", value)

