"""A body of /v1/completions -> a validated `ParsedRequest` (`parse_completion`).

Its own fields, besides the shared ones (`request_fields`): `prompt` (text, encoded without a
chat template, or token ids; a list of one of either, several prompts refused), `logprobs` (the
number of top alternatives), `echo` (the prompt and its log-probabilities before each
completion; not with stream), `suffix` null and `best_of` equal to n only (the other values
refused by name). max_tokens defaults to 16 (OpenAI's).
"""

from __future__ import annotations

from collections.abc import Mapping

from metagen.decoding.prompts import encode_prompt
from metagen.serve.body import DEFAULT_MAX_N, APIError
from metagen.serve.request_fields import SHARED_FIELDS, Endpoint, PromptFields, bool_field, parse_fields
from metagen.serve.requests import ParsedRequest

COMPLETION_FIELDS = SHARED_FIELDS | {"prompt", "logprobs", "echo", "suffix", "best_of"}
DEFAULT_MAX_TOKENS = 16  # OpenAI's


def parse_completion(body: object, *, model, served_name: str, max_rows: int, lenient: bool = False,
                     max_n: int = DEFAULT_MAX_N, retriever: str | None = None) -> ParsedRequest:
    """Validate `body` (decoded JSON) of /v1/completions against `model` (None: proxy mode);
    APIError on the first problem (`request_fields.parse_fields`)."""
    return parse_fields(body, COMPLETION, model=model, served_name=served_name, max_rows=max_rows, lenient=lenient,
                        max_n=max_n, retriever=retriever)


def _completion_fields(body: Mapping, model, stream: bool) -> PromptFields:
    """/v1/completions' own fields: prompt, suffix (null only), echo (not with stream), best_of
    (equal to n only), logprobs (the number of top alternatives), max_tokens (default 16)."""
    prompt_ids, prompt_text = _completion_prompt(body, model)
    if "suffix" in body:
        raise APIError(f"suffix={body['suffix']!r} is not supported by this server (no fill-in-the-middle)",
                       "suffix")
    echo = bool_field(body, "echo", False)
    if echo and stream:
        raise APIError("echo=true is not supported with stream=true (the echoed prompt comes with the whole "
                       "answer)", "echo")
    if "best_of" in body and body["best_of"] != body.get("n", 1):
        raise APIError(f"best_of={body['best_of']!r} is not supported: only best_of equal to n", "best_of")
    seen = prompt_text if prompt_text is not None else prompt_ids
    return PromptFields(prompt_ids, seen, "prompt", "max_tokens", DEFAULT_MAX_TOKENS, body.get("logprobs"),
                        text=prompt_text, echo=echo)


COMPLETION = Endpoint(chat=False, fields=COMPLETION_FIELDS, read_prompt=_completion_fields)


def _completion_prompt(body: Mapping, model) -> tuple[list[int] | None, str | None]:
    """Token ids of `prompt` (None in proxy mode for text) and its text (None for token ids):
    text (encoded without a chat template) or token ids; a list of one of either is accepted,
    several prompts are refused."""
    if "prompt" not in body:
        raise APIError("prompt is required", "prompt")
    prompt = body["prompt"]
    if isinstance(prompt, list) and prompt and all(isinstance(item, (str, list)) for item in prompt):
        if len(prompt) != 1:
            raise APIError(f"prompt holds {len(prompt)} prompts: this server takes one prompt per request", "prompt")
        prompt = prompt[0]
    if not isinstance(prompt, (str, list)):
        raise APIError(f"prompt must be a string or a list of token ids, got {type(prompt).__name__}", "prompt")
    if isinstance(prompt, list) and not all(isinstance(item, int) and not isinstance(item, bool) for item in prompt):
        raise APIError("prompt must be a string or a list of int token ids", "prompt")
    if model is None:  # proxy mode: the backend encodes and checks it
        if not prompt or (isinstance(prompt, list) and min(prompt) < 0):
            raise APIError("prompt must be a non-empty string or list of token ids >= 0", "prompt")
        return (list(prompt) if isinstance(prompt, list) else None), (prompt if isinstance(prompt, str) else None)
    try:
        ids = encode_prompt(model.tokenizer, prompt, chat=False, vocab_size=model.vocab_size)
    except ValueError as error:
        raise APIError(str(error), "prompt") from None
    return ids, prompt if isinstance(prompt, str) else None
