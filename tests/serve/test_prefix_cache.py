"""The engine's cross-request prefix cache on the real embedded model: a multi-turn chat and a
shared system prompt reuse exactly the longest cached prefix (checked against a reference that
keeps every cached sequence), outputs equal those of an engine without the cache (fp32 weights:
token for token, greedy and seeded), reused keys and values give the cold run's logits, a small
budget evicts without ever serving wrong keys and values and keeps the pool bounded, and a running
request's prompt is never evicted. A model that cannot say how many bytes a cached token takes
is refused by the engine's memory checks."""

from __future__ import annotations

import re
import threading

import pytest

from metagen.decoding.prompts import encode_prompt
from metagen.models.base import LanguageModel
from metagen.models.kgram import KGramModel
from metagen.sampling import SamplingParams
from metagen.serve.engine import DoneEvent, Engine, ServeRequest, TokenEvent

pytestmark = pytest.mark.slow

SYSTEM = ("You are a careful assistant for a bakery. Answer in one short sentence, mention the price in "
          "euros when asked about an item, and never invent opening hours.")


class Run:
    """Submit a request and wait for its end."""

    def __init__(self, engine: Engine, prompt_ids: list[int], params: SamplingParams, echo: bool = False) -> None:
        self.events: list[object] = []
        self.done = threading.Event()
        self.first = threading.Event()
        self.request = ServeRequest(list(prompt_ids), params, self._emit, echo=echo)
        engine.submit(self.request)

    def _emit(self, event) -> None:
        self.events.append(event)
        if isinstance(event, TokenEvent):
            self.first.set()
        if isinstance(event, DoneEvent):
            self.done.set()

    def wait(self) -> ServeRequest:
        assert self.done.wait(180)
        assert self.events[-1] == DoneEvent()
        return self.request


def run(engine, prompt_ids, params, echo=False) -> ServeRequest:
    return Run(engine, prompt_ids, params, echo).wait()


class Reference:
    """What the prefix cache should hold with an unlimited budget: every prompt and every finished
    row's prompt + output but its last token; a prompt reuses its longest common prefix with
    them, its last token excluded."""

    def __init__(self) -> None:
        self.sequences: list[list[int]] = []

    def expected(self, prompt_ids: list[int]) -> int:
        best = 0
        for sequence in self.sequences:
            common = 0
            for a, b in zip(prompt_ids[:-1], sequence):
                if a != b:
                    break
                common += 1
            best = max(best, common)
        return best

    def add(self, request: ServeRequest) -> None:
        self.sequences.append(list(request.prompt_ids))
        for completion in request.completions:
            self.sequences.append(list(request.prompt_ids) + completion.token_ids[:-1])


@pytest.fixture(scope="module")
def engines(model_fp32):
    cached = Engine(model_fp32, max_rows=8, cache_memory=64 * 2**20)
    cold = Engine(model_fp32, max_rows=8, cache_memory=0)
    cached.start()
    cold.start()
    yield cached, cold
    cached.stop()
    cold.stop()


def chat(model, messages) -> list[int]:
    return encode_prompt(model.tokenizer, messages, chat=True)


def test_multi_turn_chat_and_shared_system_prompt_reuse_the_longest_prefix_and_equal_a_cold_engine(
        model_fp32, engines):
    cached, cold = engines
    reference = Reference()
    greedy = SamplingParams(temperature=0, max_tokens=16, logprobs=1)
    seeded = SamplingParams(temperature=0.8, top_p=0.95, seed=11, max_tokens=12, n=2, logprobs=1)
    conversation = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "How much is a croissant?"}]
    prompts = []
    for turn in range(3):  # each turn's prompt holds the previous turns' prompt and answer
        ids = chat(model_fp32, conversation)
        prompts.append((ids, greedy))
        expected = reference.expected(ids)
        mine, theirs = run(cached, ids, greedy), run(cold, ids, greedy)
        reference.add(mine)
        assert mine.cached_tokens == expected
        if turn:
            assert expected > len(prompts[turn - 1][0])  # the last prompt and the answer, re-rendered
        assert theirs.cached_tokens == 0
        assert [c.token_ids for c in mine.completions] == [c.token_ids for c in theirs.completions]
        assert mine.completions[0].logprobs == pytest.approx(theirs.completions[0].logprobs, abs=1e-4)
        conversation += [{"role": "assistant", "content": mine.completions[0].text},
                         {"role": "user", "content": ["And a baguette?", "Are you open on Sunday?"][turn % 2]}]
    for question in ["Do you sell rye bread?", "What is in the apple tart?"]:  # the system prompt is shared
        ids = chat(model_fp32, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}])
        expected = reference.expected(ids)
        mine, theirs = run(cached, ids, seeded), run(cold, ids, seeded)
        reference.add(mine)
        assert mine.cached_tokens == expected > len(encode_prompt(model_fp32.tokenizer, SYSTEM, chat=False))
        assert [c.token_ids for c in mine.completions] == [c.token_ids for c in theirs.completions]
        for a, b in zip(mine.completions, theirs.completions):
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
    # a prompt cached whole: its last token is computed again for the logits
    ids, params = prompts[0]
    again = run(cached, ids, params)
    assert again.cached_tokens == len(ids) - 1
    assert again.completions[0].token_ids == run(cold, ids, params).completions[0].token_ids
    assert cached.stats.prefix_hits >= 5
    assert cached.stats.prefix_tokens_reused >= sum(len(p) for p, _ in prompts[1:])


def test_reused_keys_and_values_give_the_cold_prompt_logits(model_fp32, engines):
    """Echo scores every prompt position from a whole prefill; a request taking the same prompt from
    the cache must start from the same next-token distribution (first token's top log-probs)."""
    cached, _ = engines
    ids = chat(model_fp32, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hi!"}])
    params = SamplingParams(temperature=0, max_tokens=1, logprobs=5)
    cold = run(cached, ids, params, echo=True)  # echo: prefilled whole, never from the cache
    assert cold.cached_tokens == 0
    warm = run(cached, ids, params)
    assert warm.cached_tokens == len(ids) - 1
    cold_top, warm_top = cold.completions[0].top_logprobs[0], warm.completions[0].top_logprobs[0]
    assert list(cold_top) == list(warm_top)
    assert list(warm_top.values()) == pytest.approx(list(cold_top.values()), abs=1e-4)


def test_default_dtype_split_prefill_stays_within_rounding_of_a_whole_prefill(model):
    """With bf16 activations, prefilling a suffix on cached keys and values rounds differently from
    one whole prefill (measured up to ~0.16 in logits), so the comparison is on log-probs with that
    tolerance rather than token for token."""
    cached, cold = Engine(model, max_rows=4, cache_memory=16 * 2**20), Engine(model, max_rows=4, cache_memory=0)
    cached.start()
    cold.start()
    try:
        params = SamplingParams(temperature=0, max_tokens=1, logprobs=5)
        base = chat(model, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hello"}])
        run(cached, base, params)
        ids = chat(model, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hello there, baker"}])
        warm, cold_run = run(cached, ids, params), run(cold, ids, params)
        assert warm.cached_tokens > 30
        warm_top, cold_top = warm.completions[0].top_logprobs[0], cold_run.completions[0].top_logprobs[0]
        common = set(warm_top) & set(cold_top)
        assert len(common) >= 4
        for token in common:
            assert warm_top[token] == pytest.approx(cold_top[token], abs=0.3)
    finally:
        cached.stop()
        cold.stop()


def test_a_small_budget_evicts_serves_no_wrong_keys_and_keeps_the_pool_bounded(model_fp32, engines):
    _, cold = engines
    budget_tokens = 60
    small = Engine(model_fp32, max_rows=4, cache_memory=budget_tokens * model_fp32.kv_bytes_per_token)
    small.start()
    try:
        params = SamplingParams(temperature=0, max_tokens=8)
        questions = ["How much is a croissant?", "Do you sell rye bread?", "How much is a croissant?",
                     "Is the baguette fresh?"]
        for question in questions:
            ids = chat(model_fp32, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}])
            mine = run(small, ids, params)
            assert small.stats.prefix_tokens_cached <= budget_tokens
            assert mine.completions[0].token_ids == run(cold, ids, params).completions[0].token_ids
        assert small.stats.prefix_tokens_evicted > 0
        assert small.stats.prefix_hits > 0
        # nothing runs: the only slots in use are the tree's
        assert small._cache.num_cached_slots == small.prefix_cache.size <= budget_tokens
    finally:
        small.stop()


def test_a_running_requests_prompt_is_never_evicted(model_fp32):
    tiny = Engine(model_fp32, max_rows=4, cache_memory=4 * model_fp32.kv_bytes_per_token)
    tiny.start()
    try:
        ids = chat(model_fp32, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Tell me a story."}])
        long = Run(tiny, ids, SamplingParams(temperature=0, max_tokens=60, ignore_eos=True))
        assert long.first.wait(120)  # decoding: its prompt is locked although 4 tokens is the budget
        follower = run(tiny, ids + ids[-3:], SamplingParams(temperature=0, max_tokens=2))
        assert not long.done.is_set()
        assert follower.cached_tokens == len(ids)
        long.wait()
        assert tiny.prefix_cache.size <= 4  # unlocked once it finished: back under the budget
    finally:
        tiny.stop()


def test_a_cancelled_request_unpins_its_prompt_and_frees_its_slots(model_fp32):
    tiny = Engine(model_fp32, max_rows=4, cache_memory=4 * model_fp32.kv_bytes_per_token)
    tiny.start()
    try:
        ids = chat(model_fp32, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Tell me a story."}])
        long = Run(tiny, ids, SamplingParams(temperature=0, max_tokens=500, ignore_eos=True))
        assert long.first.wait(120)
        long.request.cancel()
        assert long.done.wait(60) and long.events[-1] == DoneEvent("cancelled")
        run(tiny, ids[:5], SamplingParams(temperature=0, max_tokens=1))  # a step after the cancellation
        assert tiny.prefix_cache.size <= 4
        assert tiny._cache.num_cached_slots == tiny.prefix_cache.size  # nothing else holds a slot
    finally:
        tiny.stop()


def test_cache_memory_is_checked(model_fp32):
    with pytest.raises(ValueError, match="cache_memory"):
        Engine(model_fp32, cache_memory=-1)
    assert Engine(model_fp32, cache_memory=0).prefix_cache is None


def test_a_model_whose_cache_cannot_share_slots_is_refused_the_prefix_cache():
    kgram = KGramModel.train(["ab", "ba"], k=2, max_context=16)
    with pytest.raises(ValueError, match=r"--cache-memory: the prefix cache needs a cache whose slots can be shared "
                                         r"\(a PagedCache\), and this model's cache \(KGramCache\) is not one"):
        Engine(kgram, cache_memory=1 << 20)
    assert Engine(kgram).prefix_cache is None  # the default: no prefix cache where none can be kept


class Unsized(LanguageModel):
    """The embedded model behind a `LanguageModel` that does not say its KV bytes per token."""

    name = "unsized"

    def __init__(self, body) -> None:
        self.body, self.tokenizer = body, body.tokenizer

    vocab_size = property(lambda self: self.body.vocab_size)
    max_context = property(lambda self: self.body.max_context)

    def new_cache(self, batch_size: int = 1):
        return self.body.new_cache(batch_size)

    def forward(self, cache, tokens, **kwargs):
        return self.body.forward(cache, tokens, **kwargs)


def test_a_model_that_cannot_say_its_kv_bytes_is_refused_by_the_memory_checks(model_fp32):
    refusal = r"model 'unsized' \(Unsized\) does not say how many bytes one cached token takes"
    with pytest.raises(NotImplementedError, match=refusal):  # the prefix cache's budget
        Engine(Unsized(model_fp32), cache_memory=4 * model_fp32.kv_bytes_per_token)
    engine = Engine(Unsized(model_fp32), cache_memory=0)
    engine.start()
    try:
        request = Run(engine, encode_prompt(model_fp32.tokenizer, "Hello", chat=False),
                      SamplingParams(temperature=0, max_tokens=2))
        assert request.done.wait(120)
        error = request.events[-1].error  # each request's memory check (`check_batch_fits`)
        assert error is not None and re.search(refusal, error) and "memory check" in error
        assert not any(isinstance(event, TokenEvent) for event in request.events)
    finally:
        engine.stop()
