"""OpenAIGenerator against a real llama.cpp server (llama-cpp-python) over the embedded model."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("httpx")

from metagen.decoding import capabilities as caps
from metagen.remote import OpenAIGenerator
from metagen.sampling import SamplingParams

pytestmark = pytest.mark.slow
PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def gen(llama_server):
    """Text prompts continued as they are, on /v1/completions."""
    with OpenAIGenerator(llama_server, chat=False, max_retries=1) as generator:
        yield generator


def test_a_text_prompt_gets_the_servers_chat_template_by_default(llama_server, gen):
    """The default sends text to /v1/chat/completions, where the server wraps it in the model's
    template (SmolLM2's system and role markers: many more prompt tokens than the raw text)."""
    params = SamplingParams(temperature=0.0, max_tokens=4)
    with OpenAIGenerator(llama_server, max_retries=1) as default:
        assert default.chat is True
        templated = default.generate(PROMPT, params)
    raw = gen.generate(PROMPT, params)
    assert templated.cost.prompt_tokens_computed > raw.cost.prompt_tokens_computed + 10


def test_probe_finds_what_llama_cpp_honours(gen):
    profile = gen.profile
    assert profile.engine.name == "llama.cpp"
    assert not profile.native_n  # it answers n=2 with one choice
    assert profile.logprobs and profile.top_logprobs and profile.prompt_scoring
    assert not profile.token_prompts and not profile.returns_token_ids
    # it cuts stop strings from the text but lists their token in logprobs: stops can be told apart
    assert gen.capabilities == {caps.LOGPROBS, caps.PROMPT_SCORING, caps.STEP_CONTINUATION, caps.STRUCTURED_OUTPUT}


def test_greedy_generation_is_plain_text_with_its_cost(gen):
    params = SamplingParams(temperature=0.0, max_tokens=8)
    first, second = gen.generate(PROMPT, params), gen.generate(PROMPT, params)
    completion = first.completions[0]
    assert completion.text and completion.text == second.text
    assert completion.finish_reason == "length" and completion.token_ids is None  # unknown, not guessed
    cost = first.cost
    assert cost.model_calls == 1 and cost.generated_tokens == 8 and cost.prompt_tokens_computed > 0
    assert cost.flops is None and cost.wall_seconds > 0


def test_n_3_fans_out_into_3_requests_with_distinct_completions(gen):
    result = gen.generate(PROMPT, SamplingParams(n=3, max_tokens=12, seed=1))
    texts = [c.text for c in result.completions]
    assert len(texts) == 3 and len(set(texts)) == 3
    assert result.cost.model_calls == 3 and result.cost.generated_tokens == sum(
        len(c.logprobs) for c in result.completions)
    again = gen.generate(PROMPT, SamplingParams(n=3, max_tokens=12, seed=1))
    assert [c.text for c in again.completions] == texts  # same seeds sent, same samples


def test_logprobs_and_top_logprobs(gen):
    result = gen.generate(PROMPT, SamplingParams(max_tokens=6, logprobs=3, seed=2))
    completion = result.completions[0]
    assert len(completion.logprobs) == 6 == len(completion.tokens)
    assert "".join(completion.tokens) == completion.text
    assert all(value <= 0 for value in completion.logprobs)
    assert len(completion.top_logprob_texts) == 6
    for top, token, value in zip(completion.top_logprob_texts, completion.tokens, completion.logprobs):
        assert len(top) == 3 and all(v <= 0 for v in top.values())
        # the sampled token is in the top 3 or below the 3rd
        assert token in top or value <= min(top.values()) + 1e-6
    assert completion.top_logprobs is None  # no ids: TOP_LOGPROBS is not claimed


def test_stop_strings_end_the_completion(gen):
    greedy = gen.generate(PROMPT, SamplingParams(temperature=0.0, max_tokens=12)).text
    stop = greedy.strip().split()[1]
    result = gen.generate(PROMPT, SamplingParams(temperature=0.0, max_tokens=12, stop=[stop]))
    completion = result.completions[0]
    assert completion.finish_reason == "stop" and stop not in completion.text
    assert greedy.startswith(completion.text)


def test_stop_reason_names_the_stop_string_the_server_cut(gen):
    """llama.cpp's server reports no matched stop; the generator reads it from the tokens."""
    greedy = gen.generate(PROMPT, SamplingParams(temperature=0.0, max_tokens=12)).text
    stop = greedy.strip().split()[1]
    completion = gen.generate(PROMPT, SamplingParams(temperature=0.0, max_tokens=12, stop=["zzz", stop])).completions[0]
    assert completion.finish_reason == "stop" and completion.stop_reason == stop
    unstopped = gen.generate(PROMPT, SamplingParams(temperature=0.0, max_tokens=4)).completions[0]
    assert unstopped.finish_reason == "length" and unstopped.stop_reason is None


def test_refusals_are_clear(gen):
    with pytest.raises(ValueError, match="token-id prompts"):
        gen.generate([1, 2, 3], SamplingParams(max_tokens=2))
    with pytest.raises(ValueError, match="stop_token_ids=.*llama.cpp"):
        gen.generate(PROMPT, SamplingParams(stop_token_ids=[2]))


def test_chat_messages_use_the_servers_template(gen):
    result = gen.generate([{"role": "user", "content": "Say hello."}],
                          SamplingParams(temperature=0.0, max_tokens=6, logprobs=1))
    completion = result.completions[0]
    assert completion.text and len(completion.logprobs) == result.cost.generated_tokens
    assert result.cost.prompt_tokens_computed > 10  # the template's system prompt and markers


def test_self_consistency_end_to_end(gen):
    from metagen.strategies.self_consistency import (
        SelfConsistencyConfig,
        self_consistency,
    )

    config = SelfConsistencyConfig(n=3, params=SamplingParams(temperature=0.8, max_tokens=16, seed=3),
                                   pattern=r"(\w+)")
    result = self_consistency(gen, "Q: What is the capital of France?\nA:", config)
    assert len(result.completions) == 3 and result.cost.model_calls == 3
    assert result.answer in result.votes and sum(result.votes.values()) == 3
    assert all(candidate.token_ids is None for candidate in result.completions)


def test_a_supplied_tokenizer_gives_the_ids_the_server_does_not(llama_server):
    import gguf

    from metagen.models import embedded_model_path
    from metagen.models.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_gguf(gguf.GGUFReader(embedded_model_path()))
    with OpenAIGenerator(llama_server, tokenizer=tokenizer, chat=False) as generator:
        assert caps.TOKEN_IDS in generator.capabilities
        completion = generator.generate(PROMPT, SamplingParams(temperature=0.0, max_tokens=6)).completions[0]
        assert completion.token_ids and tokenizer.decode(completion.token_ids) == completion.text
        assert generator.decode(completion.token_ids) == completion.text


# continuing a final assistant message ------------------------------------------------------

CONVERSATION = [{"role": "user", "content": "What is the capital of France?"},
                {"role": "assistant", "content": "The capital of France is"}]


@pytest.fixture(scope="module")
def tokenizer():
    import gguf

    from metagen.models import embedded_model_path
    from metagen.models.tokenizer import Tokenizer

    return Tokenizer.from_gguf(gguf.GGUFReader(embedded_model_path()))


def test_the_server_closes_a_final_assistant_message_whatever_it_is_asked(gen, tokenizer):
    """What engines.py's table says of llama.cpp: continue_final_message is ignored, and the
    prompt is the conversation closed plus a new assistant turn."""
    base = {"model": gen.profile.model, "messages": CONVERSATION, "max_tokens": 1, "temperature": 0.0}
    plain = gen.transport.post("chat/completions", base)
    asked = gen.transport.post("chat/completions", {**base, "continue_final_message": True,
                                                   "add_generation_prompt": False})
    closed = tokenizer.apply_chat_template(CONVERSATION, add_generation_prompt=True)
    continued = tokenizer.apply_chat_template(CONVERSATION, add_generation_prompt=False, continue_final_message=True)
    assert plain["usage"]["prompt_tokens"] == asked["usage"]["prompt_tokens"] == len(tokenizer.encode(closed))
    assert len(tokenizer.encode(continued)) < len(tokenizer.encode(closed))
    assert not gen.profile.engine.continues_final_message


def test_chains_are_refused_without_a_tokenizer_before_any_request(gen):
    from metagen.strategies.registry import StrategyOptions, get_strategy

    assert caps.ASSISTANT_CONTINUATION not in gen.capabilities
    answered = gen.transport.requests
    with pytest.raises(ValueError, match="strategy 'chain_of_thought' needs assistant_continuation.*tokenizer="):
        get_strategy("chain_of_thought").run(gen, "What is 2 + 2?", 1, SamplingParams(max_tokens=8),
                                             StrategyOptions(), None)
    assert gen.transport.requests == answered


def test_with_its_tokenizer_the_message_is_continued_and_a_chain_runs(llama_server, tokenizer):
    from metagen.strategies.chain import ChainConfig
    from metagen.strategies.chain_programs import chain_of_thought

    with OpenAIGenerator(llama_server, tokenizer=tokenizer, max_retries=1) as generator:
        assert caps.ASSISTANT_CONTINUATION in generator.capabilities
        result = generator.generate(CONVERSATION, SamplingParams(temperature=0.0, max_tokens=8, stop=["."]))
        completion = result.completions[0]
        assert completion.text.strip() == "Paris" and completion.stop_reason == "."  # continued, not restated
        config = ChainConfig(params=SamplingParams(temperature=0.0, max_tokens=12), answer_tokens=6)
        chain = chain_of_thought(generator, "What is 2 + 3?", config)
        assert chain.cost.model_calls == 2 and chain.values["reasoning"] and chain.chosen.token_ids is not None


def test_a_json_schema_request_answers_json_that_validates(gen):
    jsonschema = pytest.importorskip("jsonschema")
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                               "year": {"type": "integer", "minimum": 1900, "maximum": 2100}},
              "required": ["name", "year"], "additionalProperties": False}
    messages = [{"role": "user", "content": "Taylor Swift was born in 1989. Give her name and birth year as JSON."}]
    result = gen.generate(messages, SamplingParams(temperature=0.0, max_tokens=60, structured_outputs={"json": schema}))
    completion = result.completions[0]
    assert completion.finish_reason == "stop" and completion.complete is True, completion.text
    jsonschema.validate(json.loads(completion.text), schema)


def test_a_choice_is_sent_as_a_gbnf_grammar_the_server_honours(gen):
    result = gen.generate("Is Paris in France? Answer:", SamplingParams(
        temperature=1.0, max_tokens=8, n=3, seed=3, structured_outputs={"choice": [" yes", " no", ' "maybe"']}))
    assert {c.text for c in result.completions} <= {" yes", " no", ' "maybe"'}
