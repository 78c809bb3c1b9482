"""`metagen serve`: an OpenAI-compatible HTTP server over a local model.

    engine.py    one thread owning the model and the KV cache: continuous batching, each
                 request with its own SamplingParams, constraint and torch.Generator
    protocol.py  request bodies -> (prompt ids, SamplingParams), validated; errors name the field
    responses.py completions, chat completions and their stream chunks (OpenAI's shapes)
    metrics.py   Prometheus text of the engine's counters
    app.py       the FastAPI application (fastapi / uvicorn: the `serve` extra, imported here only)

Importing `metagen.serve` imports neither FastAPI nor uvicorn; `metagen.serve.app` does.
"""
