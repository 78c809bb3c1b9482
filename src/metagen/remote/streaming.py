"""Streamed completions from a remote generator: the pieces of text as the server sends them.

    cost = await stream(generator, prompt, params, on_piece, rng)   # on the generator's loop
    on_piece(StreamPiece(index, text, finish_reason, stop_reason))

The request is the one `generate` would send (the same fields, the engine's table, the same
refusals, the same fan-out of n over servers that ignore n, each request with its derived seed),
with `stream: true`; choice i of fan-out request k is completion k (one choice each), else choice
i. A stream that ends short of a complete answer (a choice without its finish_reason, fewer
choices than asked, an index never asked for) is an error, as a whole answer is
(`responses.py`). Servers that report usage in a stream (`Engine.streams_usage`: vLLM, SGLang, OpenAI, metagen)
are asked for it (`stream_options.include_usage`) and the returned Cost counts it; others
(llama.cpp's server) report none, and the Cost then counts the requests only
(`Cost.generated_tokens` 0, `usage_known` False).

Log-probabilities are not streamed here (the pieces carry text): a caller wanting them uses
`generate`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from metagen.decoding.cost import Cost
from metagen.decoding.prompts import Prompt
from metagen.remote.loop import gather_all
from metagen.remote.openai_generator import text_body
from metagen.remote.prompt_fields import prompt_request
from metagen.remote.responses import check_finish, choice_index, usage_cost
from metagen.remote.sse import sse_chunks
from metagen.remote.transport import ServerError
from metagen.sampling import SamplingParams

@dataclass
class StreamPiece:
    """New text of completion `index`; its finish reason (and the stop that ended it, where the
    server names it) on its last piece."""

    index: int
    text: str
    finish_reason: str | None = None
    stop_reason: str | int | None = None


@dataclass
class StreamedCost:
    """What a stream spent: its Cost and whether the servers reported the tokens (usage_known)."""

    cost: Cost
    usage_known: bool


def stream_request(generator, prompt: Prompt, params: SamplingParams,
                   rng: torch.Generator | None = None) -> tuple[str, list[tuple[dict, int]], bool]:
    """(endpoint, [(body, choices)], usage asked) for streaming `prompt`; ValueError for what the
    server cannot do (the generator's own refusals). The profile must be known (probed)."""
    profile = generator.profile
    endpoint, fields = prompt_request(prompt, generator.chat)
    body = text_body(generator._body(profile, endpoint, fields, params), profile, params)  # pieces carry text
    body["stream"] = True
    usage = profile.engine.streams_usage
    if usage:
        body["stream_options"] = {"include_usage": True}
    return endpoint, generator._requests(profile, body, params, rng), usage


def _piece_text(choice: dict, chat: bool, index: int, url: str) -> str:
    """A chunk choice's new text ("" for none), or ServerError when the server sent something
    other than a string."""
    if chat:
        delta = choice.get("delta")
        if delta is not None and not isinstance(delta, dict):
            raise ServerError(url, 200, f"choice {index} has delta {delta!r} (expected an object)")
        text = (delta or {}).get("content")
    else:
        text = choice.get("text")
    if text is not None and not isinstance(text, str):
        raise ServerError(url, 200, f"choice {index} has text {text!r} (expected a string)")
    return text or ""


async def stream(generator, prompt: Prompt, params: SamplingParams, on_piece: Callable[[StreamPiece], None],
                 rng: torch.Generator | None = None) -> StreamedCost:
    """Stream the completions of `prompt` (see the module docstring); runs on the generator's loop.

    A stream is complete by the rule of whole answers (`responses.py`): each of the choices its
    request asked for ends with finish_reason "stop" or "length", every chunk names a choice
    the request asked for, and the usage asked for arrives with non-negative counts. Chunks are
    checked before their pieces are passed on; anything else raises `ServerError` naming what
    the server sent (a stream that ends short raises after its pieces were passed on)."""
    await generator._probed()
    endpoint, requests, usage = stream_request(generator, prompt, params, rng)
    chat = endpoint == "chat/completions"
    cost = Cost(flops=None if generator.parameter_count is None else 0.0)

    async def one(offset: int, body: dict, expected: int) -> None:
        finished: dict[int, str] = {}  # choice index -> its finish reason
        last_url, usage_seen = f"{generator.where}/{endpoint}", False

        def handle(chunk: dict, url: str) -> None:
            nonlocal cost, last_url, usage_seen
            last_url = url
            if chunk.get("usage") is not None:
                cost += usage_cost(chunk, url, generator.parameter_count)
                usage_seen = True
            choices = chunk.get("choices")
            if choices is not None and not isinstance(choices, list):
                raise ServerError(url, 200, f"stream chunk has choices {str(choices)[:200]} (expected a list)")
            for choice in choices or []:
                if not isinstance(choice, dict):
                    raise ServerError(url, 200, f"stream chunk has choice {str(choice)[:200]} (expected an object)")
                index = choice_index(choice, expected, url)
                text = _piece_text(choice, chat, index, url)
                stop = choice.get("stop_reason", choice.get("matched_stop"))
                stop = stop if isinstance(stop, (str, int)) and not isinstance(stop, bool) else None
                finish = choice.get("finish_reason")
                if finish is not None:
                    check_finish(finish, index, url)
                    finished[index] = finish
                if text or finish:
                    on_piece(StreamPiece(offset + index, text, finish, stop))

        await generator._stream_one(endpoint, body, handle)
        missing = [index for index in range(expected) if index not in finished]
        if missing:
            raise ServerError(last_url, 200, f"the stream ended without a finish_reason for choice "
                                             f"{', '.join(map(str, missing))} of {expected}: an incomplete answer")
        if usage and not usage_seen:
            raise ServerError(last_url, 200, "the stream ended without the usage asked for "
                                             "(stream_options.include_usage)")

    offsets, total = [], 0
    for _, expected in requests:
        offsets.append(total)
        total += expected
    await gather_all(one(offset, body, expected) for offset, (body, expected) in zip(offsets, requests))
    if not usage:
        cost.model_calls = len(requests)
    return StreamedCost(cost, usage)
