"""A PRM served by vLLM's pooling API (`PoolingPRM`, --value reward:URL) against a fake vLLM
server answering with a tiny transformers model: scores equal the model-card recipe run on the
same model, requests have vLLM's shape, malformed answers are ServerErrors, a tree search runs."""

import pytest
import torch

from metagen.decoding import LocalGenerator
from metagen.remote.transport import ServerError
from metagen.sampling import SamplingParams
from metagen.strategies.registry import StrategyOptions, get_strategy
from tests.decoding.toy_model import ToyModel
from tests.scoring import prm_checkpoints as checkpoints
from tests.scoring.fake_pooling_server import FakePoolingServer

pytest.importorskip("transformers")
pytest.importorskip("httpx")

QUESTION = "Tom has 3 apples and buys 4 more. How many?"
SOLUTIONS = [["3 + 4 = 7\n", "He has 7 apples.\n", "The answer is 7"], ["3 + 4 = 8\n", "The answer is 8"],
             ["Apples are red.\n", "So 3 x 4 = 12\n", "Then 12 - 4 = 8\n", "The answer is 8"]]


@pytest.fixture(scope="module")
def qwen_server(tmp_path_factory):
    model, tok = checkpoints.save_qwen(tmp_path_factory.mktemp("qwen"))
    with FakePoolingServer(model, tok, tok.convert_tokens_to_ids("<extra_0>")) as server:
        yield server


@pytest.fixture(scope="module")
def shepherd_server(tmp_path_factory):
    model, tok = checkpoints.save_shepherd(tmp_path_factory.mktemp("shepherd"))
    good, bad = tok.encode("+ -", add_special_tokens=False)
    with FakePoolingServer(model, tok, tok.convert_tokens_to_ids("ки"), returned_token_ids=[good, bad]) as server:
        yield server


@pytest.fixture
def prm_of():
    made = []

    def make(*args, **kwargs):
        from metagen.scoring.remote_prm import PoolingPRM

        made.append(PoolingPRM(*args, **kwargs))
        return made[-1]

    yield make
    for prm in made:
        prm.close()


def test_qwen_scores_equal_the_model_card_recipe(qwen_server, prm_of, one_thread):
    server = qwen_server
    server.requests.clear()
    prm = prm_of(server.url + "/v1", "qwen", parameter_count=1000)  # the /v1 root works too
    scored = prm.score_many(QUESTION, SOLUTIONS)
    expected = [checkpoints.qwen_reference(server.model, server.tokenizer, QUESTION, s) for s in SOLUTIONS]
    for values, (scores, _) in zip(scored, expected):
        assert values.values == pytest.approx(scores, abs=1e-6)
    flat = [v for scores, _ in expected for v in scores]
    assert max(flat) - min(flat) > 0.05 and all(0 < v < 1 for v in flat)
    # one chat request per solution, no model named (the server's own)
    assert server.requests == [{"messages": checkpoints.qwen_conversation(QUESTION, s)} for s in SOLUTIONS]
    tokens = sum(length for _, length in expected)
    cost = scored[0].cost + scored[1].cost + scored[2].cost
    assert (cost.model_calls, cost.prompt_tokens_computed) == (3, tokens)
    assert cost.flops == cost.scorer_flops == 2.0 * 1000 * tokens
    assert prm_of(server.url).score_steps(QUESTION, SOLUTIONS[0]).cost.flops is None  # unknown model size


def test_shepherd_scores_in_one_batched_request(shepherd_server, prm_of, one_thread):
    server = shepherd_server
    server.requests.clear()
    scored = prm_of(server.url, "shepherd", model="tiny-prm").score_many(QUESTION, SOLUTIONS)
    expected = [checkpoints.shepherd_reference(server.model, server.tokenizer, QUESTION, s) for s in SOLUTIONS]
    for values, (scores, _) in zip(scored, expected):
        assert values.values == pytest.approx(scores, abs=1e-6)
    [body] = server.requests
    assert body["model"] == "tiny-prm" and len(body["input"]) == 3
    assert sum(v.cost.model_calls for v in scored) == 1


def _all_tokens(payload):  # a server without step_tag_id: a row for every token
    for entry in payload["data"]:
        entry["data"] = entry["data"] * 5
    return payload


def _logits(payload):  # softmax off: raw class logits
    for entry in payload["data"]:
        entry["data"] = [[row[0] * 4, row[1] - 3] for row in entry["data"]]
    return payload


BROKEN = {
    "all tokens": (_all_tokens, "holds 15 rows for 3 steps"),
    "logits": (_logits, "not two class probabilities summing to 1"),
    "no data": (lambda p: {**p, "data": None}, "data holds NoneType entries for 1 inputs"),
    "two entries": (lambda p: {**p, "data": p["data"] * 2}, "data holds 2 entries for 1 inputs"),
    "no usage": (lambda p: {k: v for k, v in p.items() if k != "usage"}, "usage.prompt_tokens is None"),
    "three classes": (lambda p: {**p, "data": [{**p["data"][0], "data": [r + [0.0] for r in p["data"][0]["data"]]}]},
                      "not two class probabilities"),
    "embedding": (lambda p: {**p, "data": [{**p["data"][0], "data": [0.1, 0.2, 0.7]}]}, "the row 0.1"),
}


@pytest.mark.parametrize("name", list(BROKEN))
def test_malformed_answers_are_server_errors(name, qwen_server, prm_of, one_thread):
    edit, message = BROKEN[name]
    qwen_server.edit = edit
    try:
        with pytest.raises(ServerError, match=f"/pooling: HTTP 200: not a step-pooling answer: .*{message}"):
            prm_of(qwen_server.url, "qwen").score_steps(QUESTION, SOLUTIONS[0])
    finally:
        qwen_server.edit = None


def test_server_refusals_and_absent_servers(qwen_server, prm_of):
    with pytest.raises(ServerError, match="HTTP 404: The model `other` does not exist"):
        prm_of(qwen_server.url, "qwen", model="other").score_steps(QUESTION, SOLUTIONS[0])
    from tests.remote.conftest import free_port

    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with pytest.raises(ServerError, match=f"{url}/pooling: no response: ConnectError"):
        prm_of(url, "qwen", max_retries=0).score_steps(QUESTION, SOLUTIONS[0])
    with pytest.raises(ValueError, match="kind='orm'"):
        prm_of(url, "orm")


@pytest.mark.parametrize("name", ["best_of_n_value", "step_beam", "tokenwise_cd"])
def test_a_tree_search_runs_with_the_served_prm(name, qwen_server, one_thread):
    from metagen.scoring.process_reward import split_steps
    from metagen.scoring.step_prm import release_prms

    options = StrategyOptions(value=f"reward:{qwen_server.url}", step_delimiter="b")
    try:
        result = get_strategy(name).run(LocalGenerator(ToyModel()), "a", 4,
                                        SamplingParams(temperature=1.0, max_tokens=6), options,
                                        torch.Generator().manual_seed(0))
    finally:
        release_prms()
    assert result.completions and result.chosen in result.completions
    assert result.cost.flops is None  # the served PRM's size is unknown: so is the total
    if name == "tokenwise_cd":  # its candidates carry no value
        return
    for candidate in result.completions:
        steps = split_steps(candidate.text, "b") or [candidate.text]
        scores, _ = checkpoints.qwen_reference(qwen_server.model, qwen_server.tokenizer, "a", steps)
        assert candidate.score == pytest.approx(min(scores), abs=1e-6)


@pytest.mark.parametrize("name", ["best_of_n_value", "step_beam"])
def test_a_served_prms_parameters_give_its_flops_in_the_searchs_cost(name, qwen_server, one_thread):
    """value_parameters (--value-parameters) is the served PRM's size: its FLOPs, 2 · N per
    token read, join the generator's in the one Cost, so the point has a place on the frontier."""
    from metagen.scoring.step_prm import release_prms

    options = StrategyOptions(value=f"reward:{qwen_server.url}", step_delimiter="b", value_parameters=1.5e9)
    try:
        result = get_strategy(name).run(LocalGenerator(ToyModel()), "a", 4,
                                        SamplingParams(temperature=1.0, max_tokens=6), options,
                                        torch.Generator().manual_seed(0))
    finally:
        release_prms()
    cost = result.cost
    assert cost.scorer_flops > 0 and cost.flops > cost.scorer_flops  # the generator's own come on top
    tokens = cost.scorer_flops / (2 * 1.5e9)
    assert tokens == pytest.approx(round(tokens)) and round(tokens) > 0  # whole tokens through the PRM


def test_value_parameters_apply_to_a_served_prm_only():
    with pytest.raises(ValueError, match=r"value_parameters=1000000000.0 applies to a served PRM \(--value reward:URL"):
        StrategyOptions(value="steps", value_parameters=1e9)
    with pytest.raises(ValueError, match=r"value_parameters=1000000000.0 applies to a served PRM"):
        StrategyOptions(value_parameters=1e9)
    with pytest.raises(ValueError, match=r"value_parameters=-1.0 is out of range"):
        StrategyOptions(value="reward:http://x", value_parameters=-1.0)


def test_eval_passes_value_parameters(capsys):
    from metagen.cli import main

    argv = ["eval", "--task", "arithmetic", "--count", "2", "--strategy", "greedy", "--n", "1"]
    assert main(argv + ["--value-parameters", "1.5B"]) == 2  # refused before any model: it reached the options
    assert "value_parameters=1500000000.0 applies to a served PRM" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # an argparse usage error
        main(argv + ["--value-parameters", "lots"])
    assert "--value-parameters 'lots' is not a parameter count" in capsys.readouterr().err
