"""Server-sent events over a `Transport`: the JSON chunks of one streamed answer.

    async for chunk in sse_chunks(transport, path, body): ...   # on the transport's loop

Used by `OpenAIGenerator` (a streamed request) and `streaming.stream` (proxy mode).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

from metagen.remote.transport import RETRIED_STATUS, ServerError, Transport, httpx


def attempt_started(error: httpx.TransportError) -> bool:
    """Whether the server may have begun answering (a read failed): such a stream is not retried,
    as its chunks may already have been passed on."""
    return isinstance(error, (httpx.ReadError, httpx.ReadTimeout, httpx.RemoteProtocolError))


async def sse_chunks(transport: Transport, path: str, body: dict) -> AsyncIterator[dict]:
    """The JSON chunks of a streamed answer (`data: {...}` lines up to `data: [DONE]`), iterated
    on the transport's loop. Failures before the answer starts are retried as `Transport.post`'s
    are; an error status, a chunk carrying `error` or a broken stream raise `ServerError`."""
    url = f"{transport.base_url}/{path.lstrip('/')}"
    for attempt in range(transport.max_retries + 1):
        last = attempt == transport.max_retries
        try:
            async with transport._client.stream("POST", url, json=body) as response:
                if response.status_code in RETRIED_STATUS and not last:
                    await response.aread()
                    await transport.sleep(transport._delay(attempt, transport.retry_wait(url, response)))
                    continue
                if response.status_code >= 400:
                    await response.aread()
                    transport._decode(url, response)  # raises with the server's message
                transport.requests += 1
                async for line in response.aiter_lines():
                    if not line.startswith("data:"):
                        continue  # blank separators, comments, event names
                    data = line[len("data:"):].strip()
                    if data == "[DONE]":
                        return
                    chunk = _chunk(url, data)
                    if isinstance(chunk.get("error"), dict):
                        raise ServerError(url, 200, str(chunk["error"].get("message") or chunk["error"]))
                    yield chunk
                raise ServerError(url, 200, "the stream ended without data: [DONE]")
        except httpx.TransportError as error:
            if last or attempt_started(error):
                raise ServerError(url, None, f"{type(error).__name__}: {error} (is the server running at this "
                                             "address?)") from None
            await transport.sleep(transport._delay(attempt, 0.0))
    raise AssertionError("unreachable")


def _chunk(url: str, data: str) -> dict:
    try:
        chunk = json.loads(data)
    except ValueError:
        raise ServerError(url, 200, f"stream chunk is not JSON: {data[:200]!r}") from None
    if not isinstance(chunk, dict):
        raise ServerError(url, 200, f"stream chunk is not a JSON object: {data[:200]!r}")
    return chunk
