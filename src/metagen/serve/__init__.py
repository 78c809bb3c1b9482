"""`metagen serve`: an OpenAI-compatible HTTP server over a local model, or over remote servers.

    engine.py    one thread owning the model and the KV cache: continuous batching, each
                 request with its own SamplingParams, constraint and torch.Generator
    protocol.py  request bodies -> (prompt ids, SamplingParams), validated; errors name the field
    responses.py completions, chat completions and their stream chunks (OpenAI's shapes)
    metrics.py   Prometheus text of the engine's (or the proxy's) counters
    local.py     LocalBackend: the engine behind the app (and the backend interface)
    proxy.py     ProxyBackend: remote OpenAI-compatible servers behind the app (--backend)
    app.py       the FastAPI application over a backend (fastapi / uvicorn: the `serve` extra)

Importing `metagen.serve` imports neither FastAPI nor uvicorn; `metagen.serve.app` does.
"""
