"""Turning what users pass as a prompt into token ids."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

Prompt = str | Sequence[Mapping[str, str]] | Sequence[int]


def encode_prompt(tokenizer, prompt: Prompt, chat: bool | None = None) -> list[int]:
    """Token ids for a prompt.

    prompt: text, chat messages ([{"role", "content"}, ...]) or token ids.
    chat: for text, wrap it as one user message in the model's chat template (None: when the
        model has a template). Messages always use the template; ids are taken as they are.
    Messages ending with an assistant message are continued: the template is rendered without
    the generation prompt and cut right after that message's text, so the model writes on from a
    partial reply (a prefilled answer, or its own text with a tool's result appended). This is
    transformers' `continue_final_message=True`, which its text-generation pipeline also picks
    by default for such conversations.
    Raises ValueError for an empty prompt.
    """
    if isinstance(prompt, str):
        if not prompt:
            raise ValueError("prompt is empty: give at least one character or token")
        use_chat = tokenizer.chat_template is not None if chat is None else chat
        if use_chat:
            return tokenizer.encode_chat([{"role": "user", "content": prompt}], add_generation_prompt=True)
        return tokenizer.encode(prompt, add_special_tokens=True)
    items = list(prompt)
    if not items:
        raise ValueError("prompt is empty: give at least one character or token")
    if all(isinstance(item, Mapping) for item in items):
        if chat is False:
            raise ValueError("chat=False was given with chat messages; pass text or token ids instead")
        if items[-1].get("role") == "assistant":
            return tokenizer.encode_chat(items, add_generation_prompt=False, continue_final_message=True)
        return tokenizer.encode_chat(items, add_generation_prompt=True)
    if all(isinstance(item, int) and not isinstance(item, bool) for item in items):
        return [int(item) for item in items]
    raise ValueError("prompt must be a string, a list of chat messages, or a list of token ids")


def stop_token_set(params, model) -> frozenset[int]:
    """The token ids that end a row: `params.stop_token_ids` plus the model's EOS set (unless
    `ignore_eos`). An id outside the vocabulary could never stop anything: ValueError naming it."""
    for token_id in params.stop_token_ids:
        if token_id >= model.vocab_size:
            raise ValueError(f"stop_token_ids entry {token_id} is out of range for vocab size {model.vocab_size}")
    return frozenset(params.stop_token_ids) | (frozenset() if params.ignore_eos else model.eos_token_ids)
