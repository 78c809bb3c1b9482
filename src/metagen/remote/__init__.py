"""Generators over remote OpenAI-compatible servers (vLLM, SGLang, llama.cpp's server, OpenAI),
one or a fleet of replicas.

Needs the `remote` extra (httpx; `pip install -e '.[remote]'` in a checkout): importing this
package without it raises an ImportError with the install line. Not imported by `import metagen`.

    connect(["http://a:8000/v1"], **options)                     -> OpenAIGenerator
    connect(["http://a:8000/v1", "http://b:8000/v1"], **options) -> FleetGenerator over both

Async underneath (httpx.AsyncClient on one event loop thread per generator, `loop.py`):
`generator.generate(...)` blocks, from any thread or inside a running event loop (a notebook);
`await generator.agenerate(...)` serves async code. `close()` or `with` stops the thread.
"""

from collections.abc import Sequence

try:
    import httpx  # noqa: F401 - every module below speaks HTTP through it
except ImportError as error:
    from metagen.extras import missing

    raise missing("remote", "metagen.remote (OpenAI-compatible servers)") from error

from metagen.remote.engines import ENGINES, Engine
from metagen.remote.fleet import FleetGenerator
from metagen.remote.openai_generator import OpenAIGenerator
from metagen.remote.pool import FleetUnavailableError
from metagen.remote.probe import ServerProfile, probe
from metagen.remote.responses import RemoteCompletion
from metagen.remote.transport import InvalidRequestError, ServerError, Transport


def connect(urls: str | Sequence[str], **options):
    """A generator over the server(s) at `urls` (API roots): an `OpenAIGenerator` for one URL,
    a `FleetGenerator` spreading requests over several; `options` are `OpenAIGenerator`'s
    keyword arguments (model, engine, chat, tokenizer, parameter_count, api_key_env, timeouts),
    the same for every server."""
    urls = [urls] if isinstance(urls, str) else list(urls)
    if not urls:
        raise ValueError("urls is empty: give at least one server URL (e.g. http://127.0.0.1:8000/v1)")
    if len(urls) == 1:
        return OpenAIGenerator(urls[0], **options)
    return FleetGenerator(urls, **options)


__all__ = ["ENGINES", "Engine", "FleetGenerator", "FleetUnavailableError", "InvalidRequestError",
           "OpenAIGenerator", "RemoteCompletion", "ServerError", "ServerProfile", "Transport", "connect", "probe"]
