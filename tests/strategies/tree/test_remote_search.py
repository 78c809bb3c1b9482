"""Tree searches over a remote engine (`RemoteStepExpander`): exact against the local expander
on the toy model, end to end on a real llama.cpp server, and the refusals."""

import math
from dataclasses import replace
from typing import ClassVar

import pytest
import torch

from metagen.decoding import capabilities as caps
from metagen.sampling import SamplingParams
from metagen.scoring.process_reward import FunctionValue, HeadValue
from metagen.strategies.registry import StrategyOptions, get_strategy
from metagen.strategies.tree.astar import AStarConfig, astar
from metagen.strategies.tree.dvts import DVTSConfig, dvts
from metagen.strategies.tree.expand import StepConfig, StepExpander
from metagen.strategies.tree.expander import open_expander
from metagen.strategies.tree.rebase import RebaseConfig, rebase
from metagen.strategies.tree.remote_expand import RemoteStepExpander
from metagen.strategies.tree.step_beam_search import StepBeamConfig, step_beam_search
from tests.decoding.toy_model import BOS, EOS, ToyModel, step_logprobs
from tests.remote.conftest import llama_server  # noqa: F401  (the session fixture, for the slow test)
from tests.strategies.tree.test_search_toy import (
    PARAMS,
    PROMPT,
    SEARCHES,
    TARGET,
    VALUE,
    exact_value,
)
from tests.strategies.tree.toy_server import FULL, ToyServer

NO_LOGPROBS = FULL - {caps.LOGPROBS}
TEXT_ONLY = frozenset({caps.STEP_CONTINUATION, caps.LOGPROBS})  # llama.cpp: text prompts, no ids


@pytest.mark.parametrize("name", SEARCHES)
def test_each_search_finds_the_optimum_through_a_server(name, one_thread):
    """The searches of test_search_toy, unchanged, on a server instead of the local cache."""
    for seed in range(3):
        server = ToyServer()
        result = SEARCHES[name](server, torch.Generator().manual_seed(seed))
        assert tuple(result.chosen.token_ids) == TARGET, (name, seed, result.chosen.token_ids)
        assert result.chosen.score == pytest.approx(1.0)
        assert result.chosen.finish_reason == "stop"
        assert result.cost.model_calls >= len(server.prefixes) > 0  # a request per completion (fan-out)
        assert all(isinstance(prefix, list) and prefix[: len(PROMPT)] == PROMPT for prefix in server.prefixes)


GREEDY = SamplingParams(temperature=0.0, max_tokens=5)
DELIMITED = StepConfig(delimiter="b", max_step_tokens=3)
GREEDY_SEARCHES = {
    "beam": lambda m: step_beam_search(m, PROMPT, VALUE, StepBeamConfig(params=GREEDY, step=DELIMITED, beam_width=2,
                                                                         expansions=3)),
    "dvts": lambda m: dvts(m, PROMPT, VALUE, DVTSConfig(params=GREEDY, step=DELIMITED, subtrees=2, expansions=2)),
    "rebase": lambda m: rebase(m, PROMPT, VALUE, RebaseConfig(params=GREEDY, step=DELIMITED, width=4)),
    "astar": lambda m: astar(m, PROMPT, VALUE, AStarConfig(params=GREEDY, step=DELIMITED, logprob_weight=1.0)),
}


@pytest.mark.parametrize("name", GREEDY_SEARCHES)
def test_greedy_remote_search_returns_what_the_local_one_does(name, one_thread):
    local = GREEDY_SEARCHES[name](ToyModel())
    remote = GREEDY_SEARCHES[name](ToyServer())
    assert [(c.text, c.token_ids, c.finish_reason, c.score) for c in remote.completions] == \
           [(c.text, c.token_ids, c.finish_reason, c.score) for c in local.completions]
    for mine, theirs in zip(remote.completions, local.completions):
        assert mine.logprobs == pytest.approx(theirs.logprobs, abs=1e-5)


@pytest.mark.parametrize("report_stops", [True, False], ids=["stop_reason", "token_texts"])
@pytest.mark.parametrize("capabilities", [FULL, TEXT_ONLY], ids=["token_prompts", "text_prompts"])
def test_remote_steps_are_exact(report_stops, capabilities, one_thread):
    """Every sampled child ends at the delimiter (put back into its text), EOS or the step cap,
    with log p of its tokens under the model; text prefixes are the prompt plus the path text."""
    server = ToyServer(capabilities, report_stops=report_stops)
    prompt = "a"  # text: BOS + "a" for the server and for the value's prompt ids
    params = replace(PARAMS, logit_bias={BOS: -100.0})  # every token but EOS has a text
    value = FunctionValue(exact_value) if caps.TOKEN_IDS in capabilities else None
    expander = RemoteStepExpander(server, prompt, params, DELIMITED, value, generator=torch.Generator().manual_seed(0))
    children = expander.expand([expander.root], [30])[0]
    grandchildren = [g for group in expander.expand([c for c in children if not c.finished][:3], [2, 2, 2])
                     for g in group]
    prompt_ids = [BOS, 1]
    for node in children + grandchildren:
        step = node.text[len(node.parent.text):]
        ids = [1 + "abc".index(ch) for ch in step] + ([EOS] if node.finish_reason == "stop" else [])
        if not node.finished:
            assert step.endswith("b") or len(step) == DELIMITED.max_step_tokens
        assert "b" not in step[:-1]
        if node.token_ids is not None:
            assert node.token_ids == ids
        full = [1 + "abc".index(ch) for ch in node.text] + ([EOS] if node.finish_reason == "stop" else [])
        assert node.path_logprobs() == pytest.approx(step_logprobs(prompt_ids, full), abs=1e-5)
        if value is not None:
            assert node.value == pytest.approx(exact_value(prompt_ids, full))
    assert any(n.finished for n in children) and any(not n.finished for n in children)
    if caps.TOKEN_PROMPTS in capabilities:
        assert server.prefixes[-1] == prompt_ids + grandchildren[-1].parent.path_ids()
    else:
        assert server.prefixes[-1] == prompt + grandchildren[-1].parent.text


def test_remote_cost_counts_requests_and_tokens(one_thread):
    server = ToyServer()
    result = rebase(server, PROMPT, VALUE, RebaseConfig(params=PARAMS, step=DELIMITED, width=6),
                    rng=torch.Generator().manual_seed(0))
    assert result.cost.model_calls >= len(server.prefixes) >= 2  # one request per completion (fan-out)
    assert result.cost.prompt_tokens_computed >= len(PROMPT) * result.cost.model_calls
    assert result.cost.generated_tokens > 0
    assert result.cost.flops is None  # unknown FLOPs stay unknown


def test_registry_searches_run_on_a_server(one_thread):
    options = StrategyOptions(value="steps", step_delimiter="b")
    # (best_of_n_value with the step verifier is no search: it values finished samples of one call)
    for name in ("step_beam", "dvts", "rebase", "mcts", "astar", "particle_filter", "blockwise_cd"):
        server = ToyServer(TEXT_ONLY, report_stops=False)
        result = get_strategy(name).run(server, "a", 4, SamplingParams(temperature=1.0, max_tokens=6), options,
                                        torch.Generator().manual_seed(0))
        assert result.completions and server.prefixes, name
        assert all(c.score == 0.5 for c in result.completions)  # no equations in toy text: neutral


# ----------------------------------------------------------------------------- refusals


class FakeHead:
    identity: ClassVar[dict] = {}


def test_a_trained_value_head_is_refused_on_a_server():
    with pytest.raises(ValueError, match="reads the model's final hidden states, which a remote server"):
        open_expander(ToyServer(), PROMPT, PARAMS, DELIMITED, HeadValue(FakeHead()))
    with pytest.raises(ValueError, match="strategy 'rebase' needs hidden_states, which ToyServer does not provide"):
        get_strategy("rebase").run(ToyServer(), "a", 4, PARAMS, StrategyOptions(value="/a/head.pt"), None)


def test_tokenwise_cd_is_refused_on_a_server_with_the_reason():
    with pytest.raises(ValueError, match="strategy 'tokenwise_cd' needs local_cache, which ToyServer does not "
                                         "provide.*top-k next tokens at every position"):
        get_strategy("tokenwise_cd").run(ToyServer(), "a", 4, PARAMS, StrategyOptions(value="steps"), None)


def test_astar_reading_path_logprobs_is_refused_without_logprobs(one_thread):
    config = AStarConfig(params=PARAMS, step=DELIMITED, logprob_weight=1.0)
    with pytest.raises(ValueError, match=r"logprob_weight=1.0: A\*'s cost g reads −log p"):
        astar(ToyServer(NO_LOGPROBS), PROMPT, VALUE, config)
    assert astar(ToyServer(NO_LOGPROBS), PROMPT, VALUE, AStarConfig(params=PARAMS, step=DELIMITED),
                 rng=torch.Generator().manual_seed(0)).completions  # β = 0 reads none


def test_a_server_that_cannot_tell_eos_from_the_delimiter_is_an_error(one_thread):
    server = ToyServer(FULL - {caps.LOGPROBS}, report_stops=False)  # no stop_reason, no token texts
    expander = RemoteStepExpander(server, PROMPT, PARAMS, DELIMITED, generator=torch.Generator().manual_seed(0))
    with pytest.raises(RuntimeError, match="EOS and the step delimiter cannot be told apart"):
        expander.expand([expander.root], [20])


def test_a_generator_without_either_backend_is_refused():
    with pytest.raises(ValueError, match="needs local_cache, which ToyServer does not provide, or else "
                                         "step_continuation, which it does not provide either"):
        open_expander(ToyServer(FULL - {caps.STEP_CONTINUATION}), PROMPT, PARAMS, DELIMITED)


def test_the_local_backend_stays_the_local_expander():
    from metagen.decoding import LocalGenerator

    assert isinstance(open_expander(ToyModel(), PROMPT, PARAMS, DELIMITED), StepExpander)
    assert isinstance(open_expander(LocalGenerator(ToyModel()), PROMPT, PARAMS, DELIMITED), StepExpander)


# ----------------------------------------------------------------------------- llama.cpp


@pytest.mark.slow
@pytest.mark.parametrize("name", ["rebase", "step_beam"])
def test_searches_on_a_real_llama_cpp_server(name, llama_server):  # noqa: F811
    from metagen.remote import OpenAIGenerator

    question = "Question: What is 12 + 7?\nAnswer step by step.\n"
    options = StrategyOptions(value="steps", step_delimiter="\n")
    with OpenAIGenerator(llama_server, chat=False, max_retries=1) as server:  # the raw question, continued
        assert caps.STEP_CONTINUATION in server.capabilities and caps.LOCAL_CACHE not in server.capabilities
        result = get_strategy(name).run(server, question, 4, SamplingParams(temperature=0.8, max_tokens=24),
                                        options, torch.Generator().manual_seed(0))
    assert result.completions and result.chosen in result.completions
    assert all(0.0 <= c.score <= 1.0 for c in result.completions)
    assert all(math.isfinite(sum(c.logprobs)) and c.logprobs for c in result.completions)
    cost = result.cost
    assert cost.model_calls >= 4 and cost.generated_tokens > 0
    # every request re-sends prompt + path; llama-cpp-python reports no cached_tokens, so all count as computed
    assert cost.prompt_tokens_computed + cost.prompt_tokens_reused > cost.model_calls * 5
    assert cost.flops is None  # no parameter count declared


def test_a_generator_without_the_local_cache_continues_prefixes_its_own_way(one_thread):
    """A local generator that withholds its cache (speculative decoding) runs searches through
    its own decoding: `continue_prefix` on token ids, exact as the local search's steps."""
    from metagen.decoding import LocalGenerator

    class NoCache(LocalGenerator):
        capabilities = LocalGenerator.capabilities - {caps.LOCAL_CACHE, caps.HIDDEN_STATES}

    generator = NoCache(ToyModel())
    expander = open_expander(generator, PROMPT, PARAMS, DELIMITED, VALUE, generator=torch.Generator().manual_seed(0))
    assert isinstance(expander, RemoteStepExpander)
    result = GREEDY_SEARCHES["rebase"](generator)
    local = GREEDY_SEARCHES["rebase"](ToyModel())
    assert [(c.text, c.token_ids, c.score) for c in result.completions] == \
           [(c.text, c.token_ids, c.score) for c in local.completions]


class JudgingServer(ToyServer):
    """A ToyServer that also answers judge prompts: P(Yes) = 0.8, P(No) = 0.2 at the first token."""

    def __init__(self):
        super().__init__(FULL | {caps.TOP_LOGPROBS})
        self.judged = []

    def generate(self, prompt, params, *, generator=None):
        from metagen.decoding.cost import Cost
        from metagen.decoding.result import Completion, GenerationResult

        self.judged.append(prompt)
        completion = Completion(text=" Yes", token_ids=[1], top_logprobs=[{1: math.log(0.8), 2: math.log(0.2)}])
        return GenerationResult([completion], [], cost=Cost(model_calls=1, flops=None))

    def decode(self, token_ids):
        return {1: " Yes", 2: " No"}[token_ids[0]]


def test_the_judge_value_asks_the_same_remote_generator(one_thread):
    server = JudgingServer()
    options = StrategyOptions(value="judge", step_delimiter="b")
    result = get_strategy("step_beam").run(server, "a", 4, SamplingParams(temperature=1.0, max_tokens=4), options,
                                           torch.Generator().manual_seed(0))
    assert server.judged and server.prefixes  # steps continued, and judged, by the one generator
    assert all(c.score == pytest.approx(0.8) for c in result.completions)


def test_llama_style_answers_are_read_from_the_sampled_tokens():
    """No stop_reason: the tokens' text past the cut text tells the delimiter (kept with the rest
    of its token, as the local expander keeps whole tokens) from EOS (nothing past the text)."""
    from metagen.remote.responses import RemoteCompletion

    expander = RemoteStepExpander(ToyServer(TEXT_ONLY, report_stops=False), "a", PARAMS, StepConfig("\n", 8))

    def answer(text, tokens):
        completion = RemoteCompletion(text=text, token_ids=None, tokens=tokens)
        completion.finish_reason, completion.logprobs = "stop", [-1.0] * len(tokens)
        return expander._child(expander.root, completion, 0)

    step = answer("x=2.", ["x", "=2", ".\n\n"])
    assert step.text == "x=2.\n\n" and not step.finished and step.logprobs == [-1.0] * 3
    assert answer("x=2.", ["x", "=2", "."]).finish_reason == "stop"  # EOS: nothing past the text
    with pytest.raises(RuntimeError, match="none of the stop strings"):
        answer("x", ["x", "!"])
