"""OpenAIGenerator against a fake server shaped as vLLM, SGLang and llama.cpp answer
(tests/remote/fake_server.py says which behaviour each reproduces)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("httpx")

from metagen.decoding import capabilities as caps
from metagen.remote import OpenAIGenerator, ServerError
from metagen.sampling import SamplingParams

from .fake_server import FakeServer


def make(server: FakeServer, **kwargs) -> OpenAIGenerator:
    """A generator sending text prompts raw to /v1/completions (chat=False) unless told otherwise."""
    kwargs.setdefault("max_retries", 2)
    kwargs.setdefault("chat", False)
    return OpenAIGenerator(server.url, **kwargs)


class Tokenizer:
    """A stand-in for the served model's metagen Tokenizer, with or without a chat template."""

    def __init__(self, chat_template: str | None) -> None:
        self.chat_template = chat_template

    def encode(self, text, add_special_tokens=True):
        return [len(word) for word in text.split()]


@pytest.mark.parametrize(("options", "endpoint"), [
    ({}, "/v1/chat/completions"),  # the server applies the model's chat template
    ({"tokenizer": Tokenizer("{{ messages }}")}, "/v1/chat/completions"),
    ({"tokenizer": Tokenizer(None)}, "/v1/completions"),  # a base model: no template to apply
    ({"chat": False}, "/v1/completions"),
    ({"chat": True, "tokenizer": Tokenizer(None)}, "/v1/chat/completions"),
])
def test_a_text_prompt_goes_to_the_chat_endpoint_by_default(options, endpoint):
    with FakeServer("vllm") as server, OpenAIGenerator(server.url, max_retries=0, **options) as gen:
        gen.generate("Hi", SamplingParams(max_tokens=2))
        path, body, _ = server.requests[-1]
    assert gen.chat is (endpoint == "/v1/chat/completions") and path == endpoint
    assert body.get("messages", body.get("prompt")) == ([{"role": "user", "content": "Hi"}] if gen.chat else "Hi")


def test_vllm_fields_are_sent_under_their_names_and_ids_parsed_from_token_id_strings():
    params = SamplingParams(temperature=0.7, top_p=0.9, top_k=5, min_p=0.1, repetition_penalty=1.2,
                            frequency_penalty=0.5, presence_penalty=-0.5, logit_bias={7: -3.0},
                            stop=["zz"], stop_token_ids=[2], ignore_eos=True, max_tokens=4, n=2,
                            seed=11, logprobs=2)
    with FakeServer("vllm", cached_tokens=3) as server:
        gen = make(server)
        result = gen.generate("Hi", params)
        body = server.posts()[-1]
    assert {k: body[k] for k in ("temperature", "top_p", "top_k", "min_p", "repetition_penalty",
                                 "frequency_penalty", "presence_penalty", "stop", "stop_token_ids",
                                 "ignore_eos", "max_tokens", "n", "seed", "logprobs")} == {
        "temperature": 0.7, "top_p": 0.9, "top_k": 5, "min_p": 0.1, "repetition_penalty": 1.2,
        "frequency_penalty": 0.5, "presence_penalty": -0.5, "stop": ["zz"], "stop_token_ids": [2],
        "ignore_eos": True, "max_tokens": 4, "n": 2, "seed": 11, "logprobs": 2}
    assert body["logit_bias"] == {"7": -3.0} and body["return_tokens_as_token_ids"] is True
    assert len(server.posts()) == 4  # 3 probes, then one request with n=2 (native)
    first, second = result.completions
    assert first.token_ids == [111, 112, 113, 114] and second.token_ids == [118, 119, 120, 121]
    assert first.logprobs == pytest.approx([-0.5, -0.6, -0.7, -0.8])
    # the server's top dict has the sampled token as a (k+1)-th entry: only the top k are kept
    assert first.top_logprobs[0] == pytest.approx({111: -0.5, 112: -1.5})
    assert first.finish_reason == "length" and first.stop_reason is None
    assert result.cost.model_calls == 1 and result.cost.generated_tokens == 8
    assert result.cost.prompt_tokens_reused == 3 and result.cost.prompt_tokens_computed == 2
    assert result.cost.flops is None
    assert {caps.TOKEN_IDS, caps.TOP_LOGPROBS, caps.LOGPROBS, caps.TOKEN_PROMPTS,
            caps.PROMPT_SCORING} <= gen.capabilities
    assert gen.profile.max_model_len == 2048


def test_vllm_token_prompt_and_stop_reason():
    with FakeServer("vllm") as server:
        gen = make(server)
        result = gen.generate([5, 6, 7], SamplingParams(max_tokens=4, seed=2, stop=[" delta"]))
        body = server.posts()[-1]
    assert body["prompt"] == [5, 6, 7] and result.prompt_token_ids == [5, 6, 7]
    completion = result.completions[0]
    assert completion.finish_reason == "stop" and completion.stop_reason == " delta"
    assert " delta" not in completion.text


def test_sglang_returns_no_ids_so_they_are_unknown_unless_a_tokenizer_is_given():
    with FakeServer("sglang") as server:
        gen = make(server)
        result = gen.generate("Hi", SamplingParams(max_tokens=3, n=2, seed=1, stop=[" delta"]))
        assert caps.TOKEN_IDS not in gen.capabilities and caps.TOP_LOGPROBS not in gen.capabilities
        assert all(c.token_ids is None for c in result.completions)
        assert result.generated_tokens == result.cost.generated_tokens  # from usage, not guessed
        assert "return_tokens_as_token_ids" not in server.posts()[-1]

        class WordTokenizer:  # a stand-in for the served model's metagen Tokenizer
            chat_template = None

            def encode(self, text, add_special_tokens=True):
                return [len(word) for word in text.split()]

        gen = make(server, tokenizer=WordTokenizer())
        result = gen.generate("Hi", SamplingParams(max_tokens=3, seed=1))
        assert caps.TOKEN_IDS in gen.capabilities
        assert result.completions[0].token_ids == [len(w) for w in result.completions[0].text.split()]


def test_sglang_matched_stop_is_the_stop_reason():
    with FakeServer("sglang") as server:
        result = make(server).generate("Hi", SamplingParams(max_tokens=4, seed=2, stop=[" delta"]))
    assert result.completions[0].stop_reason == " delta"


def test_fan_out_sends_n_requests_with_distinct_reproducible_seeds():
    with FakeServer("llama.cpp") as server:
        gen = make(server)
        result = gen.generate("Hi", SamplingParams(n=3, max_tokens=4, seed=5))
        seeds = sorted(body["seed"] for body in server.posts()[-3:])  # sent at once: any arrival order
        again = gen.generate("Hi", SamplingParams(n=3, max_tokens=4, seed=5))
        assert sorted(body["seed"] for body in server.posts()[-3:]) == seeds
    assert len(set(seeds)) == 3 and all(body["n"] == 1 for body in server.posts()[-3:])
    assert len(result.completions) == 3 and result.cost.model_calls == 3
    assert [c.text for c in result.completions] == [c.text for c in again.completions]
    assert not gen.profile.native_n


def test_llama_cpp_neutral_values_are_sent_explicitly():
    with FakeServer("llama.cpp") as server:
        make(server).generate("Hi", SamplingParams(max_tokens=2))
        body = server.posts()[-1]
    # llama-cpp-python's own defaults are top_k=40, top_p=0.95, min_p=0.05, repeat_penalty=1.1
    assert (body["top_k"], body["top_p"], body["min_p"], body["repeat_penalty"], body["temperature"],
            body["mirostat_mode"]) == (0, 1.0, 0.0, 1.0, 1.0, 0)


@pytest.mark.parametrize("engine, field, value", [
    ("llama.cpp", "stop_token_ids", [2]),
    ("llama.cpp", "ignore_eos", True),
    ("llama.cpp", "repetition_penalty", 1.3),
    ("llama.cpp", "typical_p", 0.9),
    ("vllm", "typical_p", 0.9),
    ("vllm", "epsilon_cutoff", 0.01),
    ("vllm", "no_repeat_ngram_size", 3),
    ("vllm", "mirostat_tau", 5.0),
    ("sglang", "eta_cutoff", 0.01),
])
def test_a_field_the_engine_cannot_honour_is_refused_before_any_request(engine, field, value):
    with FakeServer(engine) as server:
        gen = make(server)
        assert gen.profile  # probe first, so the requests below are the ones under test
        sent = len(server.posts())
        with pytest.raises(ValueError, match=f"{field}=.*{engine}"):
            gen.generate("Hi", SamplingParams(**{field: value}))
        assert len(server.posts()) == sent


@pytest.mark.parametrize("version", [1, 2])
def test_llama_cpp_mirostat_is_mapped(version):
    with FakeServer("llama.cpp") as server:
        make(server).generate("Hi", SamplingParams(mirostat_tau=4.0, mirostat_eta=0.2, mirostat_mode=version,
                                                   max_tokens=2))
        body = server.posts()[-1]
    assert (body["mirostat_mode"], body["mirostat_tau"], body["mirostat_eta"]) == (version, 4.0, 0.2)


def test_token_prompts_are_refused_where_the_server_rejects_them():
    with FakeServer("llama.cpp") as server:
        gen = make(server)
        with pytest.raises(ValueError, match="token-id prompts"):
            gen.generate([1, 2, 3], SamplingParams(max_tokens=2))
        assert caps.TOKEN_PROMPTS not in gen.capabilities


def test_logprobs_from_a_server_that_returns_none_are_refused():
    with FakeServer("sglang", logprobs=False) as server:
        gen = make(server)
        with pytest.raises(ValueError, match="returns no logprobs"):
            gen.generate("Hi", SamplingParams(logprobs=2))
        assert caps.LOGPROBS not in gen.capabilities


def test_chat_prompts_go_to_chat_completions_and_parse():
    with FakeServer("vllm") as server:
        gen = make(server, chat=True)
        result = gen.generate("Hi", SamplingParams(max_tokens=3, seed=1, logprobs=1))
        path, body, _ = server.requests[-1]
        assert path == "/v1/chat/completions" and body["messages"] == [{"role": "user", "content": "Hi"}]
        assert body["logprobs"] is True and body["top_logprobs"] == 1
        assert result.completions[0].token_ids == [101, 102, 103]
        assert result.completions[0].top_logprobs[0] == pytest.approx({101: -0.5})
        gen.generate([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Sure,"}],
                     SamplingParams(max_tokens=2))
        body = server.posts()[-1]
        assert body["continue_final_message"] is True and body["add_generation_prompt"] is False


def test_llama_cpp_continues_an_assistant_message_rendered_with_the_tokenizer():
    """llama.cpp's server has no continue_final_message: with a tokenizer the conversation is
    rendered with its chat template and continued as raw text on /v1/completions."""

    class Templated:
        chat_template = "{{ messages }}"

        def apply_chat_template(self, messages, add_generation_prompt=True, continue_final_message=False):
            assert continue_final_message and not add_generation_prompt
            return "".join(f"<{m['role']}>{m['content']}" for m in messages)

        def encode(self, text, add_special_tokens=True):
            return [1] * len(text.split())

    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Sure,"}]
    with FakeServer("llama.cpp") as server:
        make(server, tokenizer=Templated(), chat=True).generate(messages, SamplingParams(max_tokens=2))
        path, body, _ = server.requests[-1]
        assert path == "/v1/completions" and body["prompt"] == "<user>Hi<assistant>Sure,"
        with pytest.raises(ValueError, match=r"pass tokenizer= \(--tokenizer PATH\) with the model's chat template"):
            make(server).generate(messages, SamplingParams(max_tokens=2))


def test_flops_come_from_a_declared_parameter_count():
    with FakeServer("vllm", cached_tokens=1) as server:
        result = make(server, parameter_count=1e6).generate("Hi", SamplingParams(max_tokens=4))
    # 2 · params · (prompt tokens computed + generated) = 2e6 · (4 + 4)
    assert result.cost.flops == pytest.approx(2e6 * 8)


# faults -------------------------------------------------------------------------------------

def test_a_500_is_retried_with_the_same_body_and_seed():
    with FakeServer("vllm") as server:
        gen = make(server)
        assert gen.profile  # probe first, so the requests below are the ones under test
        server.fail(500, '{"error": {"message": "engine hiccup"}}')
        result = gen.generate("Hi", SamplingParams(max_tokens=3, seed=9))
        retried, answered = server.posts()[-2:]
    assert retried == answered and answered["seed"] == 9
    assert result.cost.model_calls == 1 and len(result.completions) == 1


def test_429_waits_at_least_retry_after():
    import time

    with FakeServer("vllm") as server:
        gen = make(server)
        assert gen.profile  # probe first, so the requests below are the ones under test
        server.fail(429, '{"error": {"message": "slow down"}}', {"Retry-After": "1"})
        start = time.perf_counter()
        gen.generate("Hi", SamplingParams(max_tokens=2))
        assert time.perf_counter() - start >= 1.0


def test_a_400_is_raised_at_once_with_the_servers_message():
    with FakeServer("vllm") as server:
        gen = make(server)
        assert gen.profile  # probe first, so the requests below are the ones under test
        sent = len(server.posts())
        server.fail(400, '{"error": {"message": "top_k must be -1 or at least 1, got -7"}}')
        with pytest.raises(ValueError, match="top_k must be -1 or at least 1, got -7") as error:
            gen.generate("Hi", SamplingParams(max_tokens=2))
        assert "HTTP 400" in str(error.value) and len(server.posts()) == sent + 1


def test_malformed_json_is_a_clear_error():
    with FakeServer("vllm") as server:
        gen = make(server)
        assert gen.profile  # probe first, so the requests below are the ones under test
        server.fail(200, "{not json")
        with pytest.raises(ServerError, match="not JSON"):
            gen.generate("Hi", SamplingParams(max_tokens=2))


def test_fewer_choices_than_asked_is_an_error_not_fewer_results():
    with FakeServer("vllm") as server:
        gen = make(server)
        assert gen.profile  # probe first, so the requests below are the ones under test
        server.choices_override = 1
        with pytest.raises(ServerError, match="asked for 3 choices, the server returned 1"):
            gen.generate("Hi", SamplingParams(max_tokens=2, n=3))


def test_an_unreachable_url_names_the_url():
    from .conftest import free_port

    url = f"http://127.0.0.1:{free_port()}/v1"
    gen = OpenAIGenerator(url, max_retries=1, connect_timeout=0.5)

    async def no_wait(seconds: float) -> None:
        pass

    gen.transport.sleep = no_wait
    with pytest.raises(ServerError, match=f"{url}/models.*is the server running"):
        gen.generate("Hi", SamplingParams())


def test_a_wrong_model_name_is_refused_naming_the_served_ones():
    with FakeServer("vllm", model="served-model") as server:
        gen = make(server, model="other-model")
        with pytest.raises(ValueError, match="'other-model' is not served .*served-model"):
            gen.generate("Hi", SamplingParams())


def test_the_api_key_is_sent_but_never_shown(monkeypatch):
    secret = "sk-test-do-not-print-123"
    monkeypatch.setenv("METAGEN_TEST_KEY", secret)
    with FakeServer("vllm") as server:
        gen = make(server, api_key_env="METAGEN_TEST_KEY")
        assert gen.profile  # probe first, so the requests below are the ones under test
        server.fail(401, '{"error": {"message": "bad key"}}')
        with pytest.raises(ServerError) as error:
            gen.generate("Hi", SamplingParams(max_tokens=2))
        headers = {key.lower(): value for key, value in server.requests[0][2].items()}
    assert headers["authorization"] == f"Bearer {secret}"
    assert secret not in str(error.value) and secret not in repr(gen) and secret not in repr(gen.transport)


def test_a_token_prompt_that_fills_max_model_len_is_refused_before_sending():
    with FakeServer("vllm") as server:
        gen = make(server)
        with pytest.raises(ValueError, match="prompt has 2048 tokens, the served model's context is 2048"):
            gen.generate([1] * 2048, SamplingParams(max_tokens=2))
        assert all(len(body.get("prompt", "")) < 2048 for body in server.posts())


def test_callers_on_several_threads_probe_once():
    with FakeServer("llama.cpp") as server:
        server.fail(0, delay=0.3)  # the first probe request answers late: the others arrive meanwhile
        gen = make(server)
        with ThreadPoolExecutor(4) as pool:
            results = list(pool.map(lambda seed: gen.generate("Hi", SamplingParams(max_tokens=2, seed=seed)),
                                    range(4)))
        assert all(len(r.completions) == 1 for r in results)
        assert [path for path, _, _ in server.requests].count("/v1/models") == 1


# continuing a final assistant message (chains) ---------------------------------------------

class RenderingTokenizer:
    """A tokenizer with a chat template (rendering only), as a user would supply one."""

    chat_template = "{{ messages }}"

    def apply_chat_template(self, messages, add_generation_prompt=True, continue_final_message=False):
        return "".join(f"<{m['role']}>{m['content']}" for m in messages)

    def encode(self, text, add_special_tokens=True):
        return [1] * len(text.split())


@pytest.mark.parametrize("engine, tokenizer, continues", [
    ("vllm", None, True),  # continue_final_message
    ("sglang", None, True),  # continue_final_message
    ("llama.cpp", None, False),  # its server closes the message and opens a new turn
    ("llama.cpp", RenderingTokenizer(), True),  # rendered with the template, continued on /v1/completions
])
def test_assistant_continuation_follows_the_engine_table_and_a_template(engine, tokenizer, continues):
    with FakeServer(engine) as server:
        assert (caps.ASSISTANT_CONTINUATION in make(server, tokenizer=tokenizer).capabilities) == continues


def test_assistant_continuation_needs_stops_told_apart():
    """A server whose completions name no stop and list no tokens cannot run a tool loop."""
    with FakeServer("llama.cpp", logprobs=False) as server:
        assert caps.ASSISTANT_CONTINUATION not in make(server, tokenizer=RenderingTokenizer()).capabilities


@pytest.mark.parametrize("name", ["chain_of_thought", "s2a", "self_ask", "calculator"])
def test_a_chain_on_llama_cpp_without_a_tokenizer_is_refused_before_any_request(name):
    from metagen.strategies.registry import StrategyOptions, get_strategy

    with FakeServer("llama.cpp") as server:
        gen = make(server)
        with pytest.raises(ValueError) as error:
            get_strategy(name).run(gen, "What is 2 + 2?", 1, SamplingParams(max_tokens=8), StrategyOptions(), None)
        message = str(error.value)
        assert f"strategy {name!r} needs assistant_continuation, which OpenAIGenerator does not provide" in message
        assert caps.PROVIDERS[caps.ASSISTANT_CONTINUATION] in message and "tokenizer=" in message
        assert all(body["max_tokens"] == 1 for body in server.posts())  # the probe's requests only


def test_a_chain_runs_on_a_server_that_returns_no_token_ids():
    """SGLang continues the assistant message itself but returns no ids: the chain's outputs
    carry unknown ids (None) and its token budget comes from the usage counts."""
    from metagen.strategies.chain import ChainConfig
    from metagen.strategies.chain_programs import chain_of_thought

    with FakeServer("sglang") as server:
        gen = make(server, chat=True)
        result = chain_of_thought(gen, "What is 2 + 2?", ChainConfig(params=SamplingParams(max_tokens=8, seed=1)))
        bodies = server.posts()[-2:]
    assert all(body["continue_final_message"] and body["messages"][-1]["role"] == "assistant" for body in bodies)
    assert result.cost.model_calls == 2 and result.chosen.text
    assert all(candidate.token_ids is None for candidate in result.completions)
