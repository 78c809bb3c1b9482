"""The routers besides generation (generation.py), each over the app's `ServerState`:

    health       GET /health                  open (no API key): 200 while the backend can generate
    info         GET /v1/models, GET /metrics the served model; Prometheus text (metrics.py)
    tokenizer    POST /tokenize, /detokenize  the served tokenizer (vLLM's shapes)
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, PlainTextResponse

from metagen.serve.http import ServerState, check_key, read_json, server
from metagen.serve.body import APIError

health = APIRouter()
info = APIRouter(dependencies=[Depends(check_key)])
tokenizer = APIRouter(dependencies=[Depends(check_key)])


@health.get("/health")
async def health_check(state: ServerState = Depends(server)):
    status, body = await state.backend.health()
    return JSONResponse(body, status_code=status)


@info.get("/v1/models")
async def models(state: ServerState = Depends(server)):
    return {"object": "list", "data": state.backend.model_cards()}


@info.get("/metrics")
async def prometheus(state: ServerState = Depends(server)):
    return PlainTextResponse(state.backend.metrics(state.counter), media_type="text/plain; version=0.0.4")


@tokenizer.post("/tokenize")
async def tokenize(request: Request, state: ServerState = Depends(server)):
    body = await read_json(request)
    if not isinstance(body, dict) or ("prompt" in body) == ("messages" in body):
        raise APIError("give exactly one of prompt (text) or messages", "prompt")
    return await state.backend.tokenize(body)


@tokenizer.post("/detokenize")
async def detokenize(request: Request, state: ServerState = Depends(server)):
    body = await read_json(request)
    if not isinstance(body, dict):
        raise APIError("the request body must be a JSON object", None)
    return await state.backend.detokenize(body)
