"""Generators over remote OpenAI-compatible servers (vLLM, SGLang, llama.cpp's server, OpenAI,
and any other server of OpenAI's shape), one or a fleet of replicas.

Needs the `remote` extra (httpx; `pip install -e '.[remote]'` in a checkout): the first name used
without it raises an ImportError with the install line (`transport.py`). Not imported by `import
metagen`; its names are imported on first use (`metagen._lazy`), so the engine table
(`metagen.remote.engines`, which the command line reads for its --engine choices) imports
neither httpx nor torch.

    connect(["http://a:8000/v1"], **options)                     -> OpenAIGenerator
    connect(["http://a:8000/v1", "http://b:8000/v1"], **options) -> FleetGenerator over both

Async underneath (httpx.AsyncClient on one event loop thread per generator, `loop.py`):
`generator.generate(...)` blocks, from any thread or inside a running event loop (a notebook);
`await generator.agenerate(...)` serves async code. `close()` or `with` stops the thread.
"""

from collections.abc import Sequence

from metagen._lazy import lazy_package

# name -> the submodule that defines it
_EXPORTS = {
    "ENGINES": "engines",
    "Engine": "engines",
    "FleetGenerator": "fleet",
    "FleetUnavailableError": "pool",
    "InvalidRequestError": "transport",
    "OpenAIGenerator": "openai_generator",
    "RemoteCompletion": "responses",
    "ServerError": "transport",
    "ServerProfile": "probe",
    "Transport": "transport",
    "probe": "probe",
}


def connect(urls: str | Sequence[str], **options):
    """A generator over the server(s) at `urls` (API roots): an `OpenAIGenerator` for one URL,
    a `FleetGenerator` spreading requests over several; `options` are `OpenAIGenerator`'s
    keyword arguments (model, engine, chat, tokenizer, parameter_count, api_key_env, timeouts),
    the same for every server. Their defaults: engine "auto" (from /v1/models, else the generic
    "openai" shape with a warning), chat None (text prompts to /v1/chat/completions, the
    server applying the model's chat template, unless `tokenizer` has no template: raw text to
    /v1/completions; chat=False always sends raw text)."""
    from metagen.remote.fleet import FleetGenerator
    from metagen.remote.openai_generator import OpenAIGenerator

    urls = [urls] if isinstance(urls, str) else list(urls)
    if not urls:
        raise ValueError("urls is empty: give at least one server URL (e.g. http://127.0.0.1:8000/v1)")
    if len(urls) == 1:
        return OpenAIGenerator(urls[0], **options)
    return FleetGenerator(urls, **options)


lazy_package(__name__, _EXPORTS)

__all__ = sorted([*_EXPORTS, "connect"])
