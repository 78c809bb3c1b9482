"""PG-TD (token-level MCTS with P-UCB and greedy rollouts valued by tests): a toy model whose
tree and values are computed by hand, the refusal of prompts without examples, and the embedded
model on a HumanEval prompt."""

import math

import pytest

from metagen.decoding.cost import Cost
from metagen.decoding.result import Completion
from metagen.sampling import SamplingParams
from metagen.strategies.registry import StrategyOptions, get_strategy
from metagen.strategies.tree.pg_td import PGTDConfig, PlanningSearch, p_ucb

LETTERS = "ABC"  # token ids 0, 1, 2; every program is 3 tokens long
PASS_RATE = {"AAA": 0.0, "BAA": 0.5, "ABA": 1.0, "AAB": 0.25}  # others 0


class ToyDecoder:
    """A state is its prefix. p(A) = 0.5, p(B) = 0.3, p(C) = 0.2 after every prefix, so the top 2
    are A then B and the greedy completion appends A up to 3 tokens."""

    def __init__(self):
        self.cost, self.children, self.completed = Cost(), [], []

    def root(self):
        return ()

    def child(self, state, token):
        self.children.append(state + (token,))
        return state + (token,)

    def ended(self, state):
        return len(state) == 3

    def top_tokens(self, state, k):
        return [(0, 0.5), (1, 0.3), (2, 0.2)][:k]

    def complete(self, state):
        self.completed.append(state)
        ids = state + (0,) * (3 - len(state))
        return Completion("".join(LETTERS[t] for t in ids), list(ids), [math.log((0.5, 0.3, 0.2)[t]) for t in ids],
                          finish_reason="length")


def _search(rollouts=0):
    runs = []

    def reward(text):
        runs.append(text)
        return PASS_RATE.get(text, 0.0), Cost(wall_seconds=0.25)

    search = PlanningSearch(ToyDecoder(), reward, PGTDConfig(top_k=2, c_base=10.0, c=4.0))
    for _ in range(rollouts):
        search.rollout()
    return search, runs


def _prefix(path):
    return "".join(LETTERS[t] for t in path[-1].prefix)


def test_p_ucb_matches_the_formula_by_hand():
    # N(s) = 3, n(s, a) = 2: β = ln(14 / 10) + 4 = 4.336472; sqrt(ln 3) = 1.048147
    assert p_ucb(0.5, 0.3, 3, 2, 10.0, 4.0) == pytest.approx(0.5 + 4.336472 * 0.3 * 1.048147 / 3, abs=1e-6)
    assert p_ucb(0.25, 0.9, 1, 0, 10.0, 4.0) == 0.25  # ln 1 = 0: no exploration at a node's first visit


def test_selection_follows_p_ucb_and_the_sequence_cache_saves_completions():
    search, runs = _search()
    decoder = search.decoder
    # 1: every Q is 0 and ln N(root) = 0, so the first edge (most probable) wins: A; completes AAA
    assert _prefix(search.rollout()) == "A" and decoder.completed == [(0,)]
    # 2: N(root) = 2, β = 4.262364, sqrt(ln 2) = 0.832555: A 0 + β·0.5·0.8326/2 = 0.887 < B β·0.3·0.8326 = 1.065
    assert _prefix(search.rollout()) == "B" and decoder.completed == [(0,), (1,)]
    # 3: N(root) = 3: A 1.136 < B 0.5 + 0.682 = 1.182; at B (N = 2) BA 1.774 > BB 1.065. BA lies on
    # BAA, B's greedy completion: valued from the sequence cache, no completion and no test run
    assert _prefix(search.rollout()) == "BA" and decoder.completed == [(0,), (1,)]
    # 4: N(root) = 4, β = 4.405465, sqrt(ln 4) = 1.177410: A 1.297 > B 0.5 + 0.519 = 1.019; then AA (cached)
    assert _prefix(search.rollout()) == "AA" and decoder.completed == [(0,), (1,)]
    assert runs == ["AAA", "BAA"]  # each program is tested once
    root = search.root
    a, b = root.edges
    assert (a.returns, b.returns) == ([0.0, 0.0], [0.5, 0.5])  # backed up along each path
    assert (root.visits, a.child.visits, b.child.visits) == (5, 3, 3)
    assert [e.returns for e in b.child.edges] == [[0.5], []] and b.child.edges[0].child.visits == 2
    assert a.q == 0.0 and b.q == 0.5
    assert decoder.children == [(0,), (1,), (1, 0), (0, 0)]  # one new node per rollout


def test_the_search_finds_the_passing_program_and_returns_every_evaluated_one():
    search, runs = _search()
    result = search.run(12)
    assert result.chosen.text == "ABA" and result.chosen.score == 1.0
    texts = [c.text for c in result.completions]
    assert len(texts) == len(set(texts)) == len(runs) and set(texts) == set(runs)
    assert {c.text: c.score for c in result.completions} == {t: PASS_RATE.get(t, 0.0) for t in texts}
    assert result.cost.wall_seconds == pytest.approx(0.25 * len(runs))  # the sandbox's seconds, once per program
    # the completions the decoder ran are fewer than the nodes valued: the cache answered the rest
    assert len(search.decoder.completed) < len(search.decoder.children)


def test_ties_in_pass_rate_go_to_the_more_likely_program():
    search, _ = _search()
    search.reward = lambda text: (0.0, Cost())  # every program fails: the first two rollouts are A, then B
    result = search.run(2)
    assert [(c.text, c.score) for c in result.completions] == [("AAA", 0.0), ("BAA", 0.0)]
    assert result.chosen.text == "AAA"  # log p(AAA) = 3 ln 0.5 > log p(BAA) = ln 0.3 + 2 ln 0.5


def test_a_prompt_without_examples_is_refused_before_the_model_runs():
    class NoModel:
        capabilities = get_strategy("pg_td").needs

        def local_model(self):
            raise AssertionError("the model was asked for before the prompt was checked")

    with pytest.raises(ValueError, match="docstring examples"):
        get_strategy("pg_td").run(NoModel(), 'def double(x):\n    """Double x."""\n', 4, SamplingParams(),
                                  StrategyOptions(), None)


@pytest.mark.parametrize(("field", "value"), [("top_k", 0), ("c_base", 0.0), ("c", -1.0), ("rollouts", 0)])
def test_config_ranges(field, value):
    with pytest.raises(ValueError, match=field):
        PGTDConfig(**{field: value})


@pytest.mark.slow
def test_on_the_embedded_model_pg_td_keeps_greedy_and_its_cache_matches_fresh_forwards(model):
    """HumanEval/0 with its docstring examples: the first program evaluated is the greedy one (the
    root's completion, decoded through snapshots and restores), the chosen one passes at least as
    many examples, and every candidate's log p matches one fresh forward of prompt + program."""
    import torch

    from metagen.decoding import LocalGenerator
    from metagen.decoding.prompts import encode_prompt
    from metagen.eval.code_prompts import STOP
    from metagen.eval.tasks import humaneval_problems
    from metagen.scoring.example_tests import ExampleTests
    from metagen.strategies.tree.pg_td import pg_td

    problem = humaneval_problems()[0]
    tests = ExampleTests(problem.question)
    params = SamplingParams(temperature=0.0, max_tokens=96, stop=list(STOP))
    greedy = LocalGenerator(model, chat=False).generate(problem.question, params).completions[0]
    greedy_score, _ = tests.score(greedy.text)
    result = pg_td(model, problem.question, tests, PGTDConfig(rollouts=6, top_k=3, params=params), chat=False)
    assert result.completions[0].text == greedy.text and result.completions[0].token_ids == greedy.token_ids
    assert result.chosen.score >= greedy_score
    assert all(c.score == tests.score(c.text)[0] for c in result.completions)
    assert len({tuple(c.token_ids) for c in result.completions}) == len(result.completions) >= 2
    prompt_ids = encode_prompt(model.tokenizer, problem.question, False, vocab_size=model.vocab_size)
    for candidate in result.completions:
        ids = prompt_ids + candidate.token_ids
        logits = model.forward(model.new_cache(1), torch.tensor([ids]), logits="all").logits[0]
        fresh = torch.log_softmax(logits.float(), dim=-1)[len(prompt_ids) - 1:-1].gather(
            1, torch.tensor(candidate.token_ids)[:, None]).squeeze(1)
        assert candidate.logprobs == pytest.approx(fresh.tolist(), abs=0.05)
    cost = result.cost
    assert cost.prompt_tokens_computed == len(prompt_ids) and cost.model_calls == cost.generated_tokens + 1
    assert cost.wall_seconds > 0 and cost.prompt_tokens_reused > 0
