"""A server-wide logits combiner in the engine (no HTTP): DExperts rows joining a running batch,
prompts fed in chunks, give the sampling loop's `generate(combiner=)` token for token; the
companions' rows leave with their request, finished or cancelled mid-prefill or mid-decode (no
slot of any cache is held afterwards); what the engine cannot serve is refused at construction
and at the command line before a model loads."""

from __future__ import annotations


import pytest

from metagen.decoding import generate
from metagen.decoding.combine import ContrastiveConfig, DExpertsConfig
from metagen.decoding.entropy_adaptive import EntropyAdaptiveConfig
from metagen.decoding.prompts import encode_prompt
from metagen.sampling import SamplingParams
from metagen.serve.engine import DoneEvent, Engine, ServeRequest
from metagen.serve.engine_generator import engine_cost
from tests.serve.events import Collector

pytestmark = pytest.mark.slow

PROMPTS = ("The capital of France is", "Once upon a time, in a small village by the sea, there lived")


def _submit(engine, model, prompt: str, params: SamplingParams, cancel_after: int | None = None) -> Collector:
    collector = Collector(cancel_after)
    collector.request = ServeRequest(encode_prompt(model.tokenizer, prompt, chat=False), params, collector)
    engine.submit(collector.request)
    return collector


def _held_slots(engine) -> list[int]:
    """Slots in use in the model's cache, then in each companion's."""
    return [engine._cache.num_cached_slots] + [cache.num_cached_slots for cache in engine.companions.caches]


@pytest.fixture(scope="module")
def dexperts(model):
    return DExpertsConfig(expert=model.truncated(20), anti_expert=model.truncated(6), alpha=0.5)


def test_dexperts_rows_joining_a_running_batch_equal_the_sampling_loop(model, dexperts):
    params = SamplingParams(temperature=0, max_tokens=14)
    first_params = SamplingParams(temperature=0, max_tokens=30)
    engine = Engine(model, max_rows=4, prefill_chunk=5, combiner=dexperts)  # the longer prompt: 3 pieces
    engine.start()
    try:
        first = _submit(engine, model, PROMPTS[0], first_params)
        while not first.tokens and not first.done.is_set():  # the second joins a batch already decoding
            first.done.wait(0.01)
        second = _submit(engine, model, PROMPTS[1], params)
        assert first.done.wait(120) and second.done.wait(120)
        assert engine.stats.max_batch_rows == 2
    finally:
        engine.stop()  # joins the engine thread: its last step has dropped the finished rows
    assert _held_slots(engine) == [0, 0, 0]  # finished rows left every cache
    for collector, prompt, asked in zip((first, second), PROMPTS, (first_params, params)):
        assert collector.events[-1] == DoneEvent()
        local = generate(model, prompt, asked, chat=False, combiner=dexperts).completions[0].token_ids
        assert collector.tokens == local
    plain = generate(model, PROMPTS[1], params, chat=False).completions[0].token_ids
    assert second.tokens != plain  # the combiner changed the output: the comparison above means something


def test_a_companion_that_is_the_model_itself_takes_its_logits_and_keeps_no_cache(model):
    own = DExpertsConfig(expert=model, anti_expert=model.truncated(6), alpha=0.5)
    params = SamplingParams(temperature=0, max_tokens=10)
    engine = Engine(model, max_rows=4, prefill_chunk=5, combiner=own)
    assert engine.companions.models == (own.anti_expert,)  # one companion cache, the anti-expert's
    engine.start()
    try:
        collector = _submit(engine, model, PROMPTS[1], params)
        assert collector.done.wait(120) and collector.events[-1] == DoneEvent()
    finally:
        engine.stop()
    assert _held_slots(engine) == [0, 0]
    local = generate(model, PROMPTS[1], params, chat=False, combiner=own)
    assert collector.tokens == local.completions[0].token_ids
    plain = generate(model, PROMPTS[1], params, chat=False).completions[0].token_ids
    assert collector.tokens != plain  # the steering changed the output
    lengths = [len(c.token_ids) for c in local.completions]
    cost = engine_cost(model, len(local.prompt_token_ids), lengths, engine.companions.models)
    assert (cost.model_calls, cost.flops) == (local.cost.model_calls, local.cost.flops)
    assert cost.model_calls == 2 * engine_cost(model, len(local.prompt_token_ids), lengths).model_calls


def test_companion_rows_leave_with_a_request_cancelled_mid_decode_or_mid_prefill(model, monkeypatch):
    amateur = model.truncated(8)
    engine = Engine(model, max_rows=4, prefill_chunk=4, combiner=ContrastiveConfig(amateur=amateur))
    forward, long_pieces = amateur.forward, []
    long_prompt = encode_prompt(model.tokenizer, PROMPTS[1], chat=False)
    prefilling = Collector()
    prefilling.request = ServeRequest(long_prompt, SamplingParams(temperature=0, max_tokens=4), prefilling)

    def cancelling(cache, tokens, **kwargs):  # the client leaves after the long prompt's second piece
        if isinstance(tokens, list) and any(long_prompt[i:i + len(tokens[0])] == list(tokens[0])
                                            for i in range(len(long_prompt))):
            long_pieces.append(len(tokens[0]))
            if len(long_pieces) == 2:
                prefilling.request.cancel()
        return forward(cache, tokens, **kwargs)

    monkeypatch.setattr(amateur, "forward", cancelling)
    engine.start()
    try:
        decoding = _submit(engine, model, PROMPTS[0], SamplingParams(temperature=0, max_tokens=200, ignore_eos=True),
                           cancel_after=3)
        engine.submit(prefilling.request)
        assert decoding.done.wait(120) and prefilling.done.wait(120)
        assert decoding.events[-1] == DoneEvent("cancelled") and len(decoding.tokens) >= 3
        assert prefilling.events == [DoneEvent("cancelled")]
        last = _submit(engine, model, PROMPTS[0], SamplingParams(temperature=0, max_tokens=2))
        assert last.done.wait(120) and last.events[-1] == DoneEvent()
        assert engine.stats.requests_cancelled == 2
    finally:
        engine.stop()  # joins the engine thread: its last step has dropped the finished rows
    assert _held_slots(engine) == [0, 0]  # nothing holds a slot once every request ended
    assert len(long_pieces) == 2 and sum(long_pieces) < len(long_prompt)  # it left mid-prefill


def test_the_admission_check_counts_the_companions_caches(model, dexperts, monkeypatch):
    from metagen.decoding import memory

    params = SamplingParams(temperature=0, max_tokens=1000)
    alone = memory.LOGIT_COPIES * model.vocab_size * 4 + params.max_tokens * model.kv_bytes_per_token
    monkeypatch.setattr(memory, "available_memory", lambda: alone + 1)  # room for the model's row only
    engine = Engine(model, max_rows=4, combiner=dexperts)
    engine.start()
    try:
        refused = _submit(engine, model, PROMPTS[0], params)
        assert refused.done.wait(120)
    finally:
        engine.stop()
    error = refused.events[-1].error
    assert error.startswith("ValueError: n=1 is too large for this machine") and "in the caches of models" in error
    assert refused.tokens == []


def test_what_the_engine_cannot_serve_with_a_combiner_is_refused(model):
    amateur = ContrastiveConfig(amateur=model.truncated(4))
    with pytest.raises(ValueError, match="--cache-memory 1048576: the prefix cache indexes the model's keys"):
        Engine(model, cache_memory=2**20, combiner=amateur)
    assert Engine(model, combiner=amateur).prefix_cache is None  # no prefix cache by default
    with pytest.raises(ValueError, match="EntropyAdaptiveConfig is not one"):
        Engine(model, combiner=EntropyAdaptiveConfig(large=model.truncated(4), threshold=1.0))


def test_strategy_costs_count_the_companions_forwards(model, dexperts):
    params = SamplingParams(temperature=0, max_tokens=6, n=2)
    result = generate(model, PROMPTS[0], params, chat=False, combiner=dexperts)
    prompt_length, lengths = len(result.prompt_token_ids), [len(c.token_ids) for c in result.completions]
    cost = engine_cost(model, prompt_length, lengths, dexperts.companions)
    for field in ("model_calls", "flops", "target_steps", "prompt_tokens_computed"):
        assert getattr(cost, field) == getattr(result.cost, field), field
    assert cost.model_calls == 3 * engine_cost(model, prompt_length, lengths).model_calls


@pytest.mark.parametrize("options, message", [
    (["--contrastive", "early-exit:4", "--cache-memory", "64MiB"], "--cache-memory 64MiB cannot be combined with "
                                                                    "--contrastive"),
    (["--dexperts", "early-exit:20,early-exit:6", "--cache-memory", "1MiB"], "cannot be combined with --dexperts"),
    (["--contrastive", "early-exit:4", "--dexperts", "early-exit:20,early-exit:6"], "--dexperts cannot be combined "
                                                                                      "with --contrastive"),
    (["--backend", "http://127.0.0.1:9/v1", "--contrastive", "early-exit:4"], "--contrastive configure the local"),
    (["--dexperts-alpha", "2"], "--dexperts-alpha only apply with --dexperts EXPERT,ANTI"),
    (["--contrastive", "early-exit:4", "--beta", "-1"], "beta=-1.0 is out of range"),
])
def test_serve_refuses_incompatible_combiner_flags_before_the_model_loads(monkeypatch, capsys, options, message):
    from metagen.cli import common, main

    monkeypatch.setattr(common, "load_model", lambda args: pytest.fail("the model was loaded"))
    assert main(["serve", *options]) == 2
    assert message in capsys.readouterr().err
