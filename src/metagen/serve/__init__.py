"""`metagen serve`: an OpenAI-compatible HTTP server over a local model, or over remote servers.

    engine.py    one thread owning the model and the KV cache: continuous batching, each
                 request with its own SamplingParams, constraint and torch.Generator
    scheduler.py what each engine step admits, prefills and decodes; the requests' state and
                 their one way out (`Scheduler.finish`)
    model_runner.py      a decode step: each request's sampling, one forward of the batch
    chunked_prefill.py   a request's set-up and its prompt forwarded a piece per step
    prefix_manager.py    what requests hold of the KV cache: cached prefixes, prompt rows
    request_state.py     EngineRequest, the engine's state of one request, and its RequestStatus
    requests.py  ParsedRequest (a body, checked), ServeRequest (a caller's input and outputs),
                 its events, EngineStats
    body.py      what every body meets: APIError (naming the field), JSON loading, the
                 ignored-fields header
    completion_request.py, chat_request.py
                 each endpoint's body -> ParsedRequest (prompt ids, SamplingParams), validated,
                 over request_fields.py (the fields both share, read once) and
                 strategy_request.py (the `metagen` strategy and its options)
    responses.py completions, chat completions and their stream chunks (OpenAI's shapes)
    metrics.py   Prometheus text of the engine's (or the proxy's) counters
    backend.py   Backend: the contract the app is written over (and BackendJob, a request's job)
    local.py     LocalBackend: the engine behind the app
    proxy.py     ProxyBackend: remote OpenAI-compatible servers behind the app (--backend)
    app.py       the FastAPI application over a backend (fastapi / uvicorn: the `serve` extra):
                 http.py (its ServerState, the API-key dependency), routers.py (health, models,
                 metrics, tokenize), generation.py (completions and chat completions)

Importing `metagen.serve` imports neither FastAPI nor uvicorn; `metagen.serve.app` does.
"""
