"""Chunked prefill on the real embedded model: a prompt forwarded `prefill_chunk` tokens per engine
step gives what a whole-prompt prefill gives (fp32 weights: the same greedy tokens, logits and
prompt log-probs to float tolerance; with the prefix cache too), running streams keep emitting
while a long prompt is prefilled, and echo never materialises the whole prompt's logits."""

from __future__ import annotations

import threading

import pytest

from metagen.decoding.prompts import encode_prompt
from metagen.sampling import SamplingParams
from metagen.serve.engine import DEFAULT_PREFILL_CHUNK, DoneEvent, Engine, ServeRequest, TokenEvent

from .test_prefix_cache import SYSTEM, Run, chat, run

pytestmark = pytest.mark.slow

STORY = ("The baker opened the shop before dawn, lit the ovens, and laid out the croissants, the rye loaves and "
         "the apple tarts while the street outside was still dark and quiet. ")


def _prompt(model, repeats: int) -> list[int]:
    return encode_prompt(model.tokenizer, STORY * repeats + "The first customer asked for", chat=False)


@pytest.fixture(scope="module")
def engines(model_fp32):
    """(chunked, whole): 16 prompt tokens per step, and enough for every prompt here at once."""
    chunked = Engine(model_fp32, max_rows=8, cache_memory=0, prefill_chunk=16)
    whole = Engine(model_fp32, max_rows=8, cache_memory=0, prefill_chunk=100_000)
    chunked.start()
    whole.start()
    yield chunked, whole
    chunked.stop()
    whole.stop()


def test_a_chunked_prefill_equals_a_whole_prefill(model_fp32, engines):
    chunked, whole = engines
    ids = _prompt(model_fp32, 3)
    assert len(ids) > 5 * 16  # several chunks, the last one partial
    params = SamplingParams(temperature=0, max_tokens=8, logprobs=5)
    mine, theirs = run(chunked, ids, params), run(whole, ids, params)
    assert mine.completions[0].token_ids == theirs.completions[0].token_ids
    assert mine.completions[0].logprobs == pytest.approx(theirs.completions[0].logprobs, abs=1e-4)
    mine_top, their_top = mine.completions[0].top_logprobs[0], theirs.completions[0].top_logprobs[0]
    assert list(mine_top) == list(their_top)
    assert list(mine_top.values()) == pytest.approx(list(their_top.values()), abs=1e-4)
    seeded = SamplingParams(temperature=0.8, seed=5, n=2, max_tokens=6)
    assert ([c.token_ids for c in run(chunked, ids, seeded).completions]
            == [c.token_ids for c in run(whole, ids, seeded).completions])


def test_echo_prompt_logprobs_of_a_chunked_prefill_equal_a_whole_prefill(model_fp32, engines):
    chunked, whole = engines
    ids = _prompt(model_fp32, 2)
    params = SamplingParams(temperature=0, max_tokens=4, logprobs=3)
    mine, theirs = run(chunked, ids, params, echo=True), run(whole, ids, params, echo=True)
    assert len(mine.prompt_records) == len(theirs.prompt_records) == len(ids) - 1
    assert [r.logprob for r in mine.prompt_records] == pytest.approx([r.logprob for r in theirs.prompt_records],
                                                                      abs=1e-4)
    for a, b in zip(mine.prompt_records, theirs.prompt_records):
        assert list(a.top) == list(b.top) and list(a.top.values()) == pytest.approx(list(b.top.values()), abs=1e-4)
    assert mine.completions[0].token_ids == theirs.completions[0].token_ids


def test_echo_never_holds_logits_for_the_whole_prompt(model_fp32, monkeypatch):
    """Every forward of an echo request returns logits for at most `prefill_chunk` positions (the
    whole-prompt prefill returned (1, T, V), ~200 KB per prompt token)."""
    engine = Engine(model_fp32, max_rows=2, cache_memory=0, prefill_chunk=16)
    shapes = []
    forward = model_fp32.forward

    def recording(cache, tokens, **kwargs):
        out = forward(cache, tokens, **kwargs)
        shapes.append(None if out.logits is None else tuple(out.logits.shape))
        return out

    monkeypatch.setattr(model_fp32, "forward", recording)
    engine.start()
    try:
        ids = _prompt(model_fp32, 2)
        request = run(engine, ids, SamplingParams(temperature=0, max_tokens=2, logprobs=1), echo=True)
    finally:
        engine.stop()
    assert len(request.prompt_records) == len(ids) - 1
    prefill = [shape for shape in shapes if len(shape) == 3]
    assert sum(shape[1] for shape in prefill) == len(ids)  # every prompt position scored once
    assert max(shape[1] for shape in prefill) <= 16


def test_running_streams_keep_emitting_while_a_long_prompt_is_prefilled(model_fp32):
    """Between the arrival of a long prompt and its first token, a running stream gets a token per
    prefill chunk (the engine alternates one chunk and one decode step). Counted, not timed: a whole
    prefill gives it at most one token in that span."""
    engine = Engine(model_fp32, max_rows=4, cache_memory=0, prefill_chunk=16)
    engine.start()
    try:
        running = Run(engine, chat(model_fp32, [{"role": "user", "content": "Tell me a long story."}]),
                      SamplingParams(temperature=0, max_tokens=200, ignore_eos=True))
        assert running.first.wait(120)
        ids = _prompt(model_fp32, 6)
        before = sum(isinstance(event, TokenEvent) for event in running.events)
        late = Run(engine, ids, SamplingParams(temperature=0, max_tokens=1))
        assert late.first.wait(120)
        during = sum(isinstance(event, TokenEvent) for event in running.events) - before
        late.wait()
        running.request.cancel()  # its rows leave at the next step
        assert running.done.wait(60)
    finally:
        engine.stop()
    assert len(ids) // 16 >= 10
    assert during >= len(ids) // 16 - 2


def test_a_short_prompt_behind_a_long_one_is_not_held_up_for_its_whole_prefill(model_fp32):
    """A long prompt (10+ chunks) and then a short one: the short one's first token comes before the
    long one's (first come, first served gave the long prompt every chunk first, and a short
    request waited for its whole prefill: a valid client's 40 s under hostile long prompts).
    Ordered, not timed; both outputs equal their runs alone."""
    engine = Engine(model_fp32, max_rows=4, cache_memory=0, prefill_chunk=16)
    engine.start()
    try:
        params = SamplingParams(temperature=0, max_tokens=2)
        long_ids = _prompt(model_fp32, 6)
        short_ids = encode_prompt(model_fp32.tokenizer, "The first customer asked for", chat=False)
        assert len(long_ids) // 16 >= 10 and len(short_ids) <= 8  # fits in the half of a chunk left to it
        order: list[str] = []
        long = Run(engine, long_ids, params)
        short = Run(engine, short_ids, params)
        for name, waiting in (("long", long), ("short", short)):
            threading.Thread(target=lambda name=name, waiting=waiting: waiting.first.wait(120) and order.append(name),
                             daemon=True).start()
        long.wait(), short.wait()
        alone = [run(engine, ids, params).completions[0].token_ids for ids in (long_ids, short_ids)]
    finally:
        engine.stop()
    assert order[0] == "short"
    assert [long.request.completions[0].token_ids, short.request.completions[0].token_ids] == alone


def test_a_chunked_prefill_after_a_cached_prefix_equals_a_cold_whole_prefill(model_fp32):
    cached = Engine(model_fp32, max_rows=4, cache_memory=64 * 2**20, prefill_chunk=16)
    cold = Engine(model_fp32, max_rows=4, cache_memory=0, prefill_chunk=100_000)
    cached.start()
    cold.start()
    try:
        params = SamplingParams(temperature=0, max_tokens=12, logprobs=2)
        run(cached, chat(model_fp32, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hi"}]),
            params)
        question = "Which of your breads are vegan, and how much does each of them cost? " * 3
        ids = chat(model_fp32, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}])
        warm, cold_run = run(cached, ids, params), run(cold, ids, params)
        assert warm.cached_tokens > 30 and len(ids) - warm.cached_tokens > 2 * 16  # the rest in several chunks
        assert warm.completions[0].token_ids == cold_run.completions[0].token_ids
        assert warm.completions[0].logprobs == pytest.approx(cold_run.completions[0].logprobs, abs=1e-4)
        again = run(cached, ids, params)  # the chunked prompt went into the prefix cache whole
        assert again.cached_tokens == len(ids) - 1
        assert again.completions[0].token_ids == cold_run.completions[0].token_ids
    finally:
        cached.stop()
        cold.stop()


def test_prefill_chunk_is_checked(model_fp32):
    for bad in (0, -3, 2.5, True, "256"):
        with pytest.raises(ValueError, match=r"prefill_chunk=.* must be an int >= 1"):
            Engine(model_fp32, prefill_chunk=bad)
    assert Engine(model_fp32).prefill_chunk == DEFAULT_PREFILL_CHUNK


def test_a_request_cancelled_mid_prefill_frees_its_partial_prompt_row(model_fp32, monkeypatch):
    engine = Engine(model_fp32, max_rows=2, cache_memory=0, prefill_chunk=16)
    events, done = [], threading.Event()
    request = ServeRequest(_prompt(model_fp32, 3), SamplingParams(temperature=0, max_tokens=4),
                           lambda event: (events.append(event), isinstance(event, DoneEvent) and done.set()))
    forward, pieces = model_fp32.forward, []

    def cancelling(cache, tokens, **kwargs):  # the client leaves after the prompt's second piece
        pieces.append(len(tokens[0]))
        if len(pieces) == 2:
            request.cancel()
        return forward(cache, tokens, **kwargs)

    monkeypatch.setattr(model_fp32, "forward", cancelling)
    engine.start()
    try:
        engine.submit(request)
        assert done.wait(120) and events == [DoneEvent("cancelled")]
        monkeypatch.setattr(model_fp32, "forward", forward)
        run(engine, _prompt(model_fp32, 1)[:5], SamplingParams(temperature=0, max_tokens=1))
        assert engine._cache.num_cached_slots == 0  # nothing holds a slot once every request ended
    finally:
        engine.stop()
    assert pieces == [16, 16]
