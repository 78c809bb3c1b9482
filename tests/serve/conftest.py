"""Fixtures: `server`, one `metagen serve` (no prefix cache) shared by the tests of this folder (see server.py), and
`client`, the official openai client pointed at it."""

from __future__ import annotations

import json

import pytest

from .server import serve_process


@pytest.fixture(scope="session")
def server():
    pytest.importorskip("fastapi")  # the serve extra
    pytest.importorskip("uvicorn")
    # No prefix cache here: these tests compare with the local loop to 1e-5, and a suffix prefilled on
    # cached keys rounds differently in bf16 (test_prefix_cache_http.py serves with the cache).
    with serve_process("--max-rows", "8", "--max-queue", "16", "--no-prefix-cache") as running:
        yield running


@pytest.fixture(scope="session")
def served_model(server) -> str:
    return json.loads(server.get("/v1/models"))["data"][0]["id"]


@pytest.fixture
def client(server):
    openai = pytest.importorskip("openai")
    with openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120) as opened:
        yield opened
