"""Response bodies in OpenAI's shapes: completions, chat completions, their stream chunks, usage
and log-probabilities.

Log-probabilities are the model's own (before sampling adapters, as vLLM reports by default).
Completions carry OpenAI's legacy form {tokens, token_logprobs, top_logprobs, text_offset};
chat carries {content: [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]}. A
token is its text (`tokenizer.decode([id])`), or "token_id:<id>" when the request asked for
`return_tokens_as_token_ids` (vLLM's form: exact for tokens that are not whole characters).
Choices also carry vLLM's `stop_reason` (the stop string or token id that ended them).
"""

from __future__ import annotations

import time
import uuid
from functools import lru_cache

from metagen.decoding.records import TokenRecord
from metagen.decoding.result import Completion
from metagen.serve.requests import ParsedRequest


class TokenTexts:
    """Token id -> its text, memoized (the per-token cost of logprobs in a response)."""

    def __init__(self, tokenizer) -> None:
        self._text = lru_cache(maxsize=65536)(lambda token: tokenizer.decode([token]))

    def __call__(self, token: int, as_id: bool = False) -> str:
        return f"token_id:{token}" if as_id else self._text(token)


def new_id(chat: bool) -> str:
    return ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict:
    """OpenAI's usage object; `cached_tokens`: prompt tokens taken from the prefix cache."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


def _completion_logprobs(tokens: list[int], logprobs: list[float], tops, texts: TokenTexts, as_id: bool,
                         offset: int = 0) -> dict:
    """OpenAI's legacy completions form for `tokens`; text offsets start at `offset`."""
    strings = [texts(token, as_id) for token in tokens]
    offsets = []
    for token in tokens:
        offsets.append(offset)
        offset += len(texts(token))
    top = None if tops is None else [None if entry is None else {texts(t, as_id): v for t, v in entry.items()}
                                     for entry in tops]
    return {"tokens": strings, "token_logprobs": list(logprobs), "top_logprobs": top, "text_offset": offsets}


def _chat_logprobs(tokens: list[int], logprobs: list[float], tops, texts: TokenTexts, as_id: bool) -> dict:
    def entry(token: int, value: float) -> dict:
        text = texts(token, as_id)
        return {"token": text, "logprob": value, "bytes": list(texts(token).encode("utf-8"))}

    content = []
    for position, (token, value) in enumerate(zip(tokens, logprobs)):
        item = entry(token, value)
        item["top_logprobs"] = [entry(t, v) for t, v in tops[position].items()] if tops and tops[position] else []
        content.append(item)
    return {"content": content}


def choice_logprobs(request: ParsedRequest, tokens: list[int], logprobs: list[float], tops, texts: TokenTexts,
                    offset: int = 0) -> dict | None:
    if not request.logprobs:
        return None
    if request.chat:
        return _chat_logprobs(tokens, logprobs, tops, texts, request.token_ids_as_strings)
    return _completion_logprobs(tokens, logprobs, tops, texts, request.token_ids_as_strings, offset)


def full_response(request: ParsedRequest, completions: list[Completion], texts: TokenTexts | None,
                  prompt_records: list[TokenRecord] | None = None, cached_tokens: int = 0,
                  counts: tuple[int, int, int] | None = None) -> dict:
    """The non-streaming answer to one request; with echo, each choice starts with the prompt's
    text and its tokens (the first with log-prob None: nothing precedes it). `counts`: (prompt,
    completion, cached) tokens as a backend reported them (proxy mode), else counted here."""
    choices = []
    echo = request.echo_text is not None
    prompt_tokens = request.prompt_ids if echo else []
    prompt_logprobs = [None] + [record.logprob for record in prompt_records] if echo else []
    prompt_tops = [None] + [record.top for record in prompt_records] if echo else []
    for index, completion in enumerate(completions):
        tops = completion.top_logprobs
        if echo and request.params.logprobs:
            tops = prompt_tops + (tops or [])
        logprobs = None
        if request.logprobs:  # (proxy mode refuses logprobs: its completions may carry no ids)
            logprobs = choice_logprobs(request, prompt_tokens + completion.token_ids,
                                       prompt_logprobs + completion.logprobs, tops, texts)
        choice = {"index": index, "logprobs": logprobs, "finish_reason": completion.finish_reason,
                  "stop_reason": completion.stop_reason}
        if request.chat:
            choice["message"] = {"role": "assistant", "content": completion.text}
        else:
            choice["text"] = (request.echo_text or "") + completion.text
        choices.append(choice)
    if counts is None:
        counts = (len(request.prompt_ids), sum(len(completion.token_ids) for completion in completions), cached_tokens)
    return {
        "id": new_id(request.chat),
        "object": "chat.completion" if request.chat else "text_completion",
        "created": int(time.time()),
        "model": request.model,
        "choices": choices,
        "usage": usage(*counts),
    }


class ChunkWriter:
    """The stream chunks of one request (one id and creation time for all of them)."""

    def __init__(self, request: ParsedRequest, texts: TokenTexts) -> None:
        self.request, self.texts = request, texts
        self.id, self.created = new_id(request.chat), int(time.time())
        self.offsets = [0] * request.params.n  # text offset of each completion so far

    def _chunk(self, choices: list[dict], **extra) -> dict:
        return {"id": self.id, "object": "chat.completion.chunk" if self.request.chat else "text_completion",
                "created": self.created, "model": self.request.model, "choices": choices, **extra}

    def roles(self) -> dict:
        """Chat's first chunk: the assistant role for every choice."""
        return self._chunk([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                             "finish_reason": None} for i in range(self.request.params.n)])

    def token(self, index: int, text: str, token: int | None, record: TokenRecord | None, finish_reason: str | None,
              stop_reason: object = None) -> dict:
        """One chosen token of choice `index` (its text may be empty: held back by a stop string);
        in proxy mode a piece of text without token or record (no logprobs: refused there)."""
        logprobs = None
        if record is not None:
            tops = None if record.top is None else [record.top]
            logprobs = choice_logprobs(self.request, [token], [record.logprob], tops, self.texts, self.offsets[index])
        self.offsets[index] += len(text)
        choice = {"index": index, "logprobs": logprobs, "finish_reason": finish_reason}
        if finish_reason is not None:
            choice["stop_reason"] = stop_reason
        if self.request.chat:
            choice["delta"] = {"content": text} if text else {}
        else:
            choice["text"] = text
        return self._chunk([choice])

    def usage(self, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict:
        return self._chunk([], usage=usage(prompt_tokens, completion_tokens, cached_tokens))


def strategy_response(request: ParsedRequest, result, generator, texts: TokenTexts) -> dict:
    """The answer to a strategy request: the chosen output as the one choice, `usage` counting
    every request the strategy made (prompt tokens of each, generated tokens of every row), and
    the `metagen` block: strategy, n, the chosen candidate's index, its answer, the votes (voting
    strategies), every candidate (text, score, answer, complete, finish_reason, tokens) and the
    full Cost."""
    chosen = result.chosen
    completion = Completion(text=chosen.text, token_ids=list(chosen.token_ids or []),
                            finish_reason=chosen.finish_reason)
    body = full_response(request, [completion], texts,
                         counts=(generator.prompt_tokens, generator.completion_tokens, 0))
    strategy = request.strategy
    block = {
        "strategy": strategy.spec.name,
        "n": strategy.n,
        "chosen": next((i for i, c in enumerate(result.completions) if c is chosen), None),
        "answer": chosen.answer,
        "candidates": [{"text": c.text, "score": c.score, "answer": c.answer, "complete": c.complete,
                        "finish_reason": c.finish_reason, "tokens": None if c.token_ids is None else len(c.token_ids)}
                       for c in result.completions],
        "requests": generator.requests,
        "cost": result.cost.to_dict(),
    }
    if result.votes:
        block["votes"] = result.votes
    body["metagen"] = block
    return body
