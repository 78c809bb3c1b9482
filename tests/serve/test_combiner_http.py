"""A real `metagen serve --contrastive early-exit:8` (the embedded model, its first 8 layers the
amateur): greedy completions, alone and two at once in one batch, are the sampling loop's
`generate(combiner=ContrastiveConfig(...))` token for token; /v1/models and /health name the
combiner; a stream the client leaves is cancelled and the server goes on answering."""

from __future__ import annotations

import json
import time

import pytest

from metagen.decoding import generate
from metagen.decoding.combine import ContrastiveConfig
from metagen.sampling import SamplingParams

from .server import serve_process

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")

pytestmark = pytest.mark.slow

LAYERS, ALPHA = 8, 0.2


@pytest.fixture(scope="module")
def server():
    with serve_process("--contrastive", f"early-exit:{LAYERS}", "--alpha", str(ALPHA), "--max-rows", "4",
                       "--prefill-chunk", "8") as running:
        yield running


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120) as opened:
        yield opened


def test_greedy_completions_alone_and_batched_equal_the_sampling_loop(client, server, model):
    prompts = ["The capital of France is", "Once upon a time, in a small village by the sea, there lived"]
    name = json.loads(server.get("/v1/models"))["data"][0]["id"]

    def run(prompt):
        answer = client.completions.create(model=name, prompt=prompt, max_tokens=16, temperature=0,
                                           extra_body={"return_tokens_as_token_ids": True}, logprobs=0)
        return [int(token.removeprefix("token_id:")) for token in answer.choices[0].logprobs.tokens]

    alone, together, rows_per_step = server.alone_and_together(run, prompts)
    assert rows_per_step > 1.2  # the two were decoded in one batch
    combiner = ContrastiveConfig(amateur=model.truncated(LAYERS), alpha=ALPHA)
    params = SamplingParams(temperature=0, max_tokens=16)
    for prompt, served_alone, served_together in zip(prompts, alone, together):
        local = generate(model, prompt, params, chat=False, combiner=combiner).completions[0].token_ids
        assert served_alone == served_together == local
    plain = generate(model, prompts[1], params, chat=False).completions[0].token_ids
    assert together[1] != plain  # the amateur changed the output: the comparison means something


def test_models_and_health_name_the_combiner(server):
    card = json.loads(server.get("/v1/models"))["data"][0]["decoding"]
    assert card["method"] == "contrastive" and card["alpha"] == ALPHA and card["beta"] is None
    assert f"first {LAYERS} layers" in card["amateur"]
    assert json.loads(server.get("/health"))["decoding"] == card


def test_a_stream_left_by_its_client_is_cancelled_and_the_server_goes_on(client, server):
    name = json.loads(server.get("/v1/models"))["data"][0]["id"]
    cancelled = server.metric('metagen_requests_finished_total{outcome="cancelled"}')
    stream = client.completions.create(model=name, prompt="Count: one, two,", max_tokens=400, temperature=0,
                                       stream=True, extra_body={"ignore_eos": True})
    for index, _ in enumerate(stream):
        if index == 3:
            break
    stream.close()
    answer = client.completions.create(model=name, prompt="Hello", max_tokens=3, temperature=0, extra_body={
        "ignore_eos": True})
    assert answer.choices[0].finish_reason == "length"
    deadline = time.monotonic() + 30
    while server.metric('metagen_requests_finished_total{outcome="cancelled"}') == cancelled:
        assert time.monotonic() < deadline, "the stream left by its client was never cancelled"
        time.sleep(0.1)
