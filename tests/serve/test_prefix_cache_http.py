"""The prefix cache through HTTP: `usage.prompt_tokens_details.cached_tokens` in chat and completion
answers and in the streamed usage chunk, /metrics counting hits and reused tokens, and the
`--cache-memory` / `--no-prefix-cache` options."""

from __future__ import annotations

import subprocess
import sys

import pytest

from .server import serve_process

pytestmark = pytest.mark.slow

SYSTEM = ("You are a careful assistant for a bakery. Answer in one short sentence, mention the price in "
          "euros when asked about an item, and never invent opening hours.")


@pytest.fixture(scope="module")
def cached_server():
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    with serve_process("--max-rows", "4", "--cache-memory", "32MiB") as running:
        yield running


@pytest.fixture
def cached_client(cached_server):
    openai = pytest.importorskip("openai")
    with openai.OpenAI(base_url=cached_server.url + "/v1", api_key="unused", max_retries=0, timeout=120) as opened:
        yield opened


def test_cached_tokens_in_chat_completions_and_streams_and_metrics(cached_client, cached_server):
    model = cached_client.models.list().data[0].id
    hits, reused = (cached_server.metric("metagen_prefix_cache_hits_total"),
                    cached_server.metric("metagen_prefix_cache_reused_tokens_total"))
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "How much is a croissant?"}]
    first = cached_client.chat.completions.create(model=model, messages=messages, max_tokens=12, temperature=0)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    turn2 = messages + [{"role": "assistant", "content": first.choices[0].message.content},
                        {"role": "user", "content": "And a baguette?"}]
    second = cached_client.chat.completions.create(model=model, messages=turn2, max_tokens=12, temperature=0)
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert first.usage.prompt_tokens < cached < second.usage.prompt_tokens  # turn 1's prompt and answer
    chunks = list(cached_client.chat.completions.create(model=model, messages=turn2, max_tokens=12, temperature=0,
                                                        stream=True, stream_options={"include_usage": True}))
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == second.usage.prompt_tokens - 1  # all but the last
    completion = cached_client.completions.create(model=model, prompt=SYSTEM + " Rye bread costs", max_tokens=4,
                                                  temperature=0)
    assert completion.usage.prompt_tokens_details.cached_tokens == 0  # no chat template: nothing shared
    again = cached_client.completions.create(model=model, prompt=SYSTEM + " Rye bread is", max_tokens=4,
                                             temperature=0)
    assert again.usage.prompt_tokens_details.cached_tokens >= 25
    assert cached_server.metric("metagen_prefix_cache_hits_total") - hits == 3
    assert (cached_server.metric("metagen_prefix_cache_reused_tokens_total") - reused
            == cached + chunks[-1].usage.prompt_tokens_details.cached_tokens
            + again.usage.prompt_tokens_details.cached_tokens)
    bytes_per_token = 30 * 2 * 3 * 64 * 4  # the embedded model: layers · (K, V) · kv heads · head dim · fp32
    assert 0 < cached_server.metric("metagen_prefix_cache_tokens") <= 32 * 2**20 // bytes_per_token


def test_without_the_prefix_cache_nothing_is_cached(client, served_model, server):
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hello"}]
    for _ in range(2):
        answer = client.chat.completions.create(model=served_model, messages=messages, max_tokens=2, temperature=0)
        assert answer.usage.prompt_tokens_details.cached_tokens == 0
    assert server.metric("metagen_prefix_cache_hits_total") == 0


@pytest.mark.parametrize(("options", "message"), [
    (["--cache-memory", "12 parsecs"], "--cache-memory '12 parsecs' is not a size"),
    (["--cache-memory", "1MiB", "--no-prefix-cache"], "--no-prefix-cache contradicts --cache-memory 1MiB"),
])
def test_bad_cache_options_are_refused_by_name(options, message):
    finished = subprocess.run([sys.executable, "-m", "metagen.cli", "serve", "--port", "0", *options],
                              capture_output=True, text=True, timeout=120)
    assert finished.returncode != 0
    assert message in finished.stderr
