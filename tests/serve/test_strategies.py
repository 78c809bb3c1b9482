"""Strategies through the API: `metagen` in the body (openai's extra_body) or the model name
`strategy:model`, run over the engine, checked against the same strategy on a LocalGenerator."""

from __future__ import annotations


import pytest

from metagen.decoding import LocalGenerator
from metagen.sampling import SamplingParams
from metagen.strategies.registry import STRATEGIES, get_strategy

openai = pytest.importorskip("openai")
pytestmark = pytest.mark.slow

QUESTION = [{"role": "user", "content": "What is 7 + 5? Answer with a number."}]
SAMPLING = {"temperature": 0.9, "max_tokens": 12, "seed": 11}


def _local(model, name: str, n: int, given: dict | None = None):
    """The strategy run by the library on a LocalGenerator with the request's seed. The engine
    decodes one token per step, so the local run does too (jump_forward=False): a constraint's
    forced run fed in one forward rounds its logits differently, which can move a seeded draw."""
    spec = get_strategy(name)
    n, options, overrides = spec.parse({"n": n, **(given or {})})
    params = SamplingParams(**SAMPLING)
    return spec.run(LocalGenerator(model, chat=True, jump_forward=False), QUESTION, n, params, options,
                    params.make_generator(), overrides)


def test_self_consistency_equals_a_local_run_and_counts_every_token(client, served_model, model):
    answer = client.chat.completions.create(model=served_model, messages=QUESTION, **SAMPLING,
                                            extra_body={"metagen": {"strategy": "self_consistency", "n": 4}})
    block = answer.model_extra["metagen"]
    local = _local(model, "self_consistency", 4)
    # the engine draws from the strategy's generator exactly as the local loop does
    assert [c["text"] for c in block["candidates"]] == [c.text for c in local.completions]
    assert block["answer"] == local.answer
    assert block["votes"] == local.votes
    assert answer.choices[0].message.content == local.chosen.text
    assert block["candidates"][block["chosen"]]["text"] == local.chosen.text
    # usage: one request of 4 rows: its prompt once, every row's tokens
    tokens = sum(c["tokens"] for c in block["candidates"])
    assert answer.usage.completion_tokens == tokens == block["cost"]["generated_tokens"]
    assert answer.usage.prompt_tokens == block["cost"]["prompt_tokens_computed"]
    assert answer.usage.total_tokens == answer.usage.prompt_tokens + tokens
    assert block["requests"] == 1 and len(block["candidates"]) == 4


def test_model_name_form_runs_the_strategy(client, served_model, model):
    answer = client.chat.completions.create(model=f"self_consistency:{served_model}", messages=QUESTION, **SAMPLING,
                                            extra_body={"metagen": {"n": 3}})
    assert answer.model == f"self_consistency:{served_model}"
    block = answer.model_extra["metagen"]
    assert block["strategy"] == "self_consistency" and len(block["candidates"]) == 3
    assert block["answer"] == _local(model, "self_consistency", 3).answer


def test_a_multi_request_strategy_counts_all_its_requests(client, served_model, model):
    """self_refine makes 2n - 1 requests (draft, then critique + revision per round): usage is
    their sum, and the texts equal a local run (each request draws from the same generator)."""
    answer = client.chat.completions.create(model=served_model, messages=QUESTION, **SAMPLING,
                                            extra_body={"metagen": {"strategy": "self_refine", "n": 2}})
    block = answer.model_extra["metagen"]
    local = _local(model, "self_refine", 2)
    assert answer.choices[0].message.content == local.chosen.text
    assert block["requests"] == 3
    assert answer.usage.completion_tokens == block["cost"]["generated_tokens"] == local.cost.generated_tokens
    assert answer.usage.prompt_tokens == block["cost"]["prompt_tokens_computed"] == local.cost.prompt_tokens_computed


@pytest.mark.parametrize(("metagen", "param", "words"), [
    ({"strategy": "no_such_strategy"}, "metagen.strategy", "no_such_strategy"),
    ({"strategy": "self_consistency", "width": 4}, "metagen.width", "width"),
    ({"strategy": "self_consistency", "n": 0}, "metagen.n", ">= 1"),
    ({"strategy": "self_consistency", "n": "four"}, "metagen.n", "must be an int"),
    ({"strategy": "rebase", "value": "steps", "temperature": -1.0}, "metagen.temperature", "> 0"),
    ({"strategy": "rebase", "value": "/etc/passwd"}, "metagen.value", "steps or judge"),
    ({"strategy": "rebase"}, "metagen.value", "needs metagen.value"),
    ({"n": 2}, "metagen.strategy", "required"),
    ({"strategy": "self_consistency", "pattern": "(a)\\1"}, "metagen.pattern", "no backreferences"),
])
def test_bad_strategy_configuration_is_400_naming_the_field(client, served_model, metagen, param, words):
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model=served_model, messages=QUESTION, max_tokens=4,
                                       extra_body={"metagen": metagen})
    error = raised.value.body
    assert error["param"] == param
    assert words in error["message"]


def test_unknown_strategy_in_the_model_name_is_400(client, served_model):
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model=f"nonesuch:{served_model}", messages=QUESTION, max_tokens=4)
    assert raised.value.body["param"] == "model" and "nonesuch" in raised.value.body["message"]


def test_a_strategy_needing_a_local_cache_is_400_naming_the_capability(client, served_model):
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model=served_model, messages=QUESTION, max_tokens=4,
                                       extra_body={"metagen": {"strategy": "tokenwise_cd", "value": "steps"}})
    assert raised.value.body["param"] == "metagen.strategy"
    assert "local_cache" in raised.value.body["message"]


@pytest.mark.parametrize(("fields", "param"), [({"stream": True}, "stream"), ({"n": 2}, "n"),
                                               ({"logprobs": True}, "logprobs")])
def test_request_fields_a_strategy_cannot_honour_are_refused(client, served_model, fields, param):
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model=served_model, messages=QUESTION, max_tokens=4, **fields,
                                       extra_body={"metagen": {"strategy": "self_consistency", "n": 2}})
    assert raised.value.body["param"] == param


def test_a_tree_search_runs_through_step_continuations(client, served_model):
    """rebase over the engine: no local cache, so its steps are continuations of raw prefixes
    (STEP_CONTINUATION); every one is an engine request, and usage sums them all."""
    answer = client.chat.completions.create(
        model=served_model, messages=QUESTION, temperature=0.9, max_tokens=8, seed=3,
        extra_body={"metagen": {"strategy": "rebase", "n": 2, "value": "steps", "max_steps": 2,
                                "max_step_tokens": 4}})
    block = answer.model_extra["metagen"]
    assert block["requests"] > 1
    assert block["candidates"] and answer.choices[0].message.content == block["candidates"][block["chosen"]]["text"]
    assert answer.usage.completion_tokens == block["cost"]["generated_tokens"]
    assert answer.usage.prompt_tokens == block["cost"]["prompt_tokens_computed"]


def test_strategies_are_batched_with_other_clients_and_answer_as_alone(client, served_model, server):
    """Two strategies and a plain request at once: every answer equals the one it gets alone, and
    the strategies' rows shared decode steps (mean rows per step above one strategy's n)."""
    requests = [
        dict(model=served_model, seed=1, extra_body={"ignore_eos": True, "metagen": {"strategy": "self_consistency",
                                                                                       "n": 3}}),
        dict(model=f"borda:{served_model}", seed=2, extra_body={"ignore_eos": True, "metagen": {"n": 3}}),
        dict(model=served_model, seed=3, extra_body={"ignore_eos": True}),
    ]

    def run(kwargs):
        answer = client.chat.completions.create(messages=QUESTION, temperature=0.9, max_tokens=10, **kwargs)
        block = answer.model_extra.get("metagen")
        return answer.choices[0].message.content, block and [c["text"] for c in block["candidates"]], answer.usage

    alone, together, rows_per_step = server.alone_and_together(run, requests)
    assert together == alone
    assert rows_per_step > 3.5, rows_per_step


def test_a_client_that_goes_away_cancels_its_strategy(server, served_model):
    """The client gives up after 1 s of a long strategy: its request in flight is cancelled and
    the batch empties (the remaining requests are never sent)."""
    import time

    cancelled = server.metric('metagen_requests_finished_total{outcome="cancelled"}')
    with openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=1.0) as impatient:
        with pytest.raises(openai.APITimeoutError):
            impatient.chat.completions.create(
                model=served_model, messages=QUESTION, max_tokens=4000, temperature=0.9,
                extra_body={"ignore_eos": True, "metagen": {"strategy": "self_consistency", "n": 2}})
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and server.metric("metagen_batch_rows") > 0:
        time.sleep(0.2)
    assert server.metric("metagen_batch_rows") == 0
    assert server.metric('metagen_requests_finished_total{outcome="cancelled"}') == cancelled + 1


def test_completions_endpoint_and_a_constrained_vote(client, served_model, model):
    """On /v1/completions the prompt is raw text (no chat template), as on LocalGenerator(chat=False);
    a json_schema response_format constrains every sample and the vote is over its `answer` field."""
    schema = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"],
              "additionalProperties": False}
    answer = client.completions.create(
        model=served_model, prompt="7 + 5 = ? Reply in JSON.", temperature=0.9, max_tokens=16, seed=4,
        extra_body={"structured_outputs": {"json": schema},
                    "metagen": {"strategy": "self_consistency", "n": 3, "answer_field": "answer"}})
    block = answer.model_extra["metagen"]
    spec = get_strategy("self_consistency")
    n, options, overrides = spec.parse({"n": 3, "answer_field": "answer"})
    params = SamplingParams(temperature=0.9, max_tokens=16, seed=4, structured_outputs={"json": schema})
    local = spec.run(LocalGenerator(model, chat=False, jump_forward=False), "7 + 5 = ? Reply in JSON.", n, params, options,
                     params.make_generator(), overrides)
    assert [c["text"] for c in block["candidates"]] == [c.text for c in local.completions]
    assert [c["complete"] for c in block["candidates"]] == [c.complete for c in local.completions]
    assert block["answer"] == local.answer and block["votes"] == local.votes
    assert answer.choices[0].text == local.chosen.text


# local cache (tokenwise_cd, transfer_q, pg_td); a 2nd model; a corpus, which this server was started without
# (search, self_ask_search, dsp: test_search_strategies.py starts one with --retriever)
NOT_RUNNABLE = ("tokenwise_cd", "transfer_q", "pg_td", "mbr_embedding", "search", "self_ask_search", "dsp")
RUNNABLE = [name for name in STRATEGIES if name not in NOT_RUNNABLE]


@pytest.mark.parametrize("name", RUNNABLE)
def test_every_strategy_the_engine_can_run_answers_and_accounts_for_its_tokens(client, served_model, name):
    """Each strategy over the engine: 200, and the server's tally of its requests (usage) equals
    the Cost the strategy summed itself."""
    spec = get_strategy(name)
    extra = {"strategy": name, **({"n": 2} if spec.budget != "none" else {}),
             **({"value": "steps"} if spec.uses_value else {}),
             **({"max_steps": 2} if "max_steps" in spec.fields() else {})}
    answer = client.chat.completions.create(model=served_model, messages=QUESTION, temperature=0.8, max_tokens=6,
                                            seed=1, extra_body={"metagen": extra})
    block = answer.model_extra["metagen"]
    assert block["strategy"] == name and block["candidates"] and block["requests"] >= 1
    assert answer.usage.completion_tokens == block["cost"]["generated_tokens"]
    assert answer.usage.prompt_tokens == block["cost"]["prompt_tokens_computed"]


def test_a_backtracking_answer_pattern_never_holds_the_server(client, served_model, server):
    """pattern (a+)+$ against a forced output of 60 a's and a "!": Python's backtracking re
    would try 2^60 splits holding the GIL, so no stream and no /health would answer again. On
    RE2 the request answers (no match) and /health answers all along (10 s each: a loaded
    machine's bound, against never)."""
    import threading

    forced = "a" * 60 + "!"
    outcome = {}

    def run():
        outcome["answer"] = client.chat.completions.create(
            model=served_model, messages=QUESTION, max_tokens=64, temperature=0.9, seed=1,
            extra_body={"structured_outputs": {"regex": "a{60}!"},
                        "metagen": {"strategy": "self_consistency", "n": 2, "pattern": "(a+)+$"}})

    request = threading.Thread(target=run)
    request.start()
    while request.is_alive():
        assert '"ok"' in server.get("/health")  # urlopen times out after 10 s
        request.join(0.2)
    block = outcome["answer"].model_extra["metagen"]
    assert [c["text"] for c in block["candidates"]] == [forced, forced]
    assert block["answer"] is None
