"""The engine's draft / verify stage on the embedded SmolLM2 (fp32, for exact comparisons):
requests joining a running batch at different steps, decoded speculatively (chains and token
trees, model-free and from the early-exit draft model with its own cache per request), give
plain decoding's greedy tokens, records and texts (also S2D's nested exits, PEARL served
serially, Medusa heads reading the forward's hidden states); a stop string, a constraint and
n > 1 keep working; the shared cache keeps no slot once they end (with and without the prefix
cache); and a real `metagen serve --speculative ngram` streams to the official openai client."""

from __future__ import annotations

import json
import time

import pytest

from metagen.decoding import generate
from metagen.decoding.prompts import encode_prompt
from metagen.sampling import SamplingParams
from metagen.serve.engine import DoneEvent, Engine, ServeRequest
from metagen.speculative import SpeculativeConfig, make_drafter

from .events import Collector
from .server import serve_process

pytestmark = pytest.mark.slow

PASSAGE = ("The lighthouse stood on a rock two miles from the harbour. Every night the keeper climbed one hundred "
           "and twelve steps to light the lamp.")
CASES = [
    ([{"role": "user", "content": f"Repeat this passage word for word:\n\n{PASSAGE}"}], True,
     SamplingParams(temperature=0, max_tokens=32)),
    ("1, 2, 3, 4, 5, 6, 7,", False, SamplingParams(temperature=0, max_tokens=24, n=2, stop=[" 11,"])),
    ("The capital of France is", False, SamplingParams(temperature=0, max_tokens=8, logprobs=2)),
    ("My favourite colour is", False, SamplingParams(temperature=0, max_tokens=12,
                                                     structured_outputs={"choice": ["red", "green", "blue"]})),
]


@pytest.mark.parametrize("drafter, options, verify, cache_memory", [("ngram", {}, "token", None),
                                                                    ("recycling", {"tree_nodes": 8}, "multi-draft", 0),
                                                                    ("tree", {"tree_nodes": 8}, "multi-draft", None),
                                                                    ("s2d", {}, "token", None),
                                                                    ("pearl:early-exit", {}, "pearl", None),
                                                                    ("medusa", {"tree_nodes": 8}, "multi-draft", None)])
def test_requests_joining_a_speculative_batch_equal_plain_greedy(model_fp32, drafter, options, verify, cache_memory,
                                                                  tmp_path):
    model = model_fp32
    if drafter == "medusa":  # heads with zero maps: each head proposes the target's own next token again
        from metagen.speculative.adapter import model_identity
        from metagen.speculative.medusa import MedusaHeads

        MedusaHeads(3, model_identity(model)).save(tmp_path / "heads.safetensors")
        drafter = f"medusa:{tmp_path / 'heads.safetensors'}"
    engine = Engine(model, max_rows=8, cache_memory=cache_memory, drafter=make_drafter(drafter, model, **options),
                    speculative=SpeculativeConfig(num_draft_tokens=5, verify=verify))
    engine.start()
    try:
        submitted = []
        for prompt, chat, params in CASES:  # each joins once the one before it has started decoding
            collector = Collector()
            request = ServeRequest(encode_prompt(model.tokenizer, prompt, chat=chat), params, collector)
            engine.submit(request)
            submitted.append((request, collector))
            deadline = time.monotonic() + 120
            while not collector.events:
                assert time.monotonic() < deadline
                time.sleep(0.001)
        for _, collector in submitted:
            assert collector.done.wait(300)
            assert collector.events[-1] == DoneEvent()
    finally:
        engine.stop()
    for (prompt, chat, params), (request, collector) in zip(CASES, submitted):
        alone = generate(model, prompt, params, chat=chat)
        assert [c.token_ids for c in request.completions] == [c.token_ids for c in alone.completions]
        assert [c.text for c in request.completions] == [c.text for c in alone.completions]
        assert [c.finish_reason for c in request.completions] == [c.finish_reason for c in alone.completions]
        for mine, theirs in zip(request.completions, alone.completions):
            assert mine.logprobs == pytest.approx(theirs.logprobs, abs=1e-4)
            assert mine.complete == theirs.complete
        for index, completion in enumerate(request.completions):
            tokens = collector.tokens_of(index)
            assert [e.token_id for e in tokens] == completion.token_ids
            assert "".join(e.text for e in tokens) == completion.text
    assert submitted[1][0].completions[0].stop_reason == " 11,"  # the stop string ended the count
    stats = engine.stats
    assert stats.accepted_tokens > 0 and stats.max_batch_rows > 2
    assert stats.steps < stats.generated_tokens  # several tokens per row and step
    held = 0 if engine.prefix_cache is None else engine.prefix_cache.size
    assert engine._cache.num_cached_slots == held  # no slot leaked by truncated or path-kept rows


@pytest.fixture(scope="module")
def server():
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    with serve_process("--dtype", "fp32", "--speculative", "ngram", "--num-draft-tokens", "5", "--max-rows", "4",
                       "--no-prefix-cache") as running:
        yield running


def test_a_speculative_server_streams_plain_greedy_to_the_openai_client(server, model_fp32):
    openai = pytest.importorskip("openai")
    card = json.loads(server.get("/v1/models"))["data"][0]
    assert card["decoding"] == {"method": "speculative", "drafter": "ngram", "num_draft_tokens": 5,
                                "verify": "token", "adaptive": False}
    messages = CASES[0][0]
    with openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=300) as client:
        stream = client.chat.completions.create(model=card["id"], messages=messages, max_tokens=40, temperature=0,
                                                stream=True, stream_options={"include_usage": True})
        pieces, usage = [], None
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                pieces.append(chunk.choices[0].delta.content)
            usage = chunk.usage or usage
    local = generate(model_fp32, messages, SamplingParams(temperature=0, max_tokens=40), chat=True).completions[0]
    assert "".join(pieces) == local.text
    assert usage.completion_tokens == len(local.token_ids)
    accepted = server.metric("metagen_spec_decode_num_accepted_tokens_total")
    assert 0 < accepted <= server.metric("metagen_spec_decode_num_draft_tokens_total")
    assert server.metric("metagen_decode_steps_total") < len(local.token_ids)  # the passage was copied in drafts
