"""Planning-Guided Transformer Decoding (PG-TD; Zhang, Chen, Shen, Ding, Tenenbaum & Gan, ICLR 2023,
"Planning with Large Language Models for Code Generation"): Monte Carlo tree search over tokens,
each new state valued by completing it greedily and running the program on the prompt's public
tests (a code prompt's docstring examples, `scoring/example_tests.py`).

A node is a state s: the prompt plus the tokens on its path. When made it gets the model's top-k
next tokens a with their probabilities p(a | s) (its edges, computed once: the tree-structure
cache) and N(s) = 1. Each edge (s, a) keeps the returns backed up through it: n(s, a) of them,
Q(s, a) = their max (PG-TD's default: the model and the tests are deterministic, so the best
program seen below an edge is what it is worth; 0 before any). One rollout:

    select:   from the root, follow argmax_a P-UCB(s, a) down the tree (first among equal scores)
              P-UCB(s, a) = Q(s, a) + β(s) · p(a | s) · sqrt(ln N(s)) / (1 + n(s, a))
              β(s)        = ln((N(s) + c_base + 1) / c_base) + c
              until the edge has no node yet (or s is a finished program)
    expand:   make the edge's node s' = s + a (one forward of a: its top-k edges)
    evaluate: complete s' greedily (a finished s' is its own program); value = the share of the
              public tests the program passes
    backup:   every edge on the path appends the value; every node on it gets N(s) += 1

Sequence cache: a greedy completion y of prefix x is also the greedy completion of every prefix
of y that extends x (greedy decoding is prefix-consistent), so each of them maps to y and a node
on an earlier completion's path (the top-1 child of a node already evaluated, among others) is
valued with no model call. Test results are kept per program: a program is run once. So n
rollouts evaluate at most n programs, and fewer when a confident model keeps P-UCB on the paths of
earlier completions (each such rollout costs one forward: the new node's).

Returns every program evaluated as a candidate (score: its pass rate), the chosen one the best by
pass rate, ties broken by log-likelihood Σ log p(token). Cost: the decoder's (one forward per new
node and per completion token; `token_rollouts.py`) plus the sandbox's wall seconds.
Bookkeeping O(rollouts · depth · top_k); the model work is the new nodes plus the completions
the sequence cache does not cover.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Protocol

from metagen.decoding import capabilities as caps
from metagen.decoding.cost import Cost
from metagen.decoding.result import Completion, GenerationResult
from metagen.sampling import SamplingParams
from metagen.strategies.options import check_options, configure, option
from metagen.strategies.spec import StrategySpec, register

if TYPE_CHECKING:
    from metagen.decoding.prompts import Prompt
    from metagen.scoring.example_tests import ExampleTests


@dataclass(frozen=True)
class PGTDConfig:
    """rollouts: select-expand-evaluate-backup rounds (each values at most one new node); top_k:
    children per node; c_base, c: β(s) of P-UCB; max_rollout_tokens: a program (path plus greedy
    completion) ends after min(this, params.max_tokens) tokens; params: max_tokens, stop strings
    and stop tokens (the search ranks tokens by the model's own p: temperature and the sampling
    adapters do not apply)."""

    rollouts: int = option(16, int, "select-expand-evaluate-backup rounds (programs evaluated at most)", low=1,
                           sizes_work=True)
    top_k: int = option(3, int, "children per node: the model's k most probable next tokens", low=1, sizes_work=True)
    c_base: float = option(10.0, float, "c_base of P-UCB's β(s) = ln((N(s) + c_base + 1) / c_base) + c", above=0)
    c: float = option(4.0, float, "c of P-UCB's β(s), the least weight of the exploration term", low=0)
    max_rollout_tokens: int = option(256, int, "a program (path plus greedy completion) ends after this many "
                                     "tokens (and params.max_tokens)", low=1)
    params: SamplingParams = SamplingParams(temperature=0.0, max_tokens=256)

    def __post_init__(self) -> None:
        check_options(self)


class TokenDecoder(Protocol):
    """What the search asks of a model (`token_rollouts.LocalTokenDecoder`; a test's toy model).
    A state is the decoder's own object for a prefix; the search never looks inside."""

    cost: Cost

    def root(self) -> object: ...

    def child(self, state: object, token: int) -> object: ...

    def ended(self, state: object) -> bool: ...

    def top_tokens(self, state: object, k: int) -> list[tuple[int, float]]:
        """The k most probable next tokens after `state` and p(token | state), most probable first."""

    def complete(self, state: object) -> Completion:
        """The greedy completion of `state`: the whole path after the prompt, token ids, text
        (stop strings cut) and log p of each token (a finished state: its own program)."""


@dataclass(eq=False)
class Edge:
    """(s, a): token a after its node, prior p(a | s), the returns backed up through it, the node s + a."""

    token: int
    prior: float
    returns: list[float] = field(default_factory=list)
    child: PlanNode | None = None

    @property
    def q(self) -> float:
        return max(self.returns, default=0.0)


@dataclass(eq=False)
class PlanNode:
    prefix: tuple[int, ...]
    state: object = field(repr=False)
    terminal: bool
    edges: list[Edge] = field(default_factory=list)
    visits: int = 1  # N(s): 1 when made, so ln N(s) is defined; +1 per rollout through s


def p_ucb(q: float, prior: float, parent_visits: int, edge_visits: int, c_base: float, c: float) -> float:
    """Q + β(s) · p(a|s) · sqrt(ln N(s)) / (1 + n(s, a)), β(s) = ln((N(s) + c_base + 1) / c_base) + c. O(1)."""
    beta = math.log((parent_visits + c_base + 1) / c_base) + c
    return q + beta * prior * math.sqrt(math.log(parent_visits)) / (1 + edge_visits)


class PlanningSearch:
    """The search state of one PG-TD run over `decoder`, valuing programs by `reward(text) ->
    (pass rate, Cost)`. `run(rollouts)` does the rollouts; `completions` is the sequence cache
    (prefix -> the greedy program through it), `scores` the pass rate per program."""

    def __init__(self, decoder: TokenDecoder, reward: Callable[[str], tuple[float, Cost]], config: PGTDConfig):
        self.decoder, self.reward, self.config = decoder, reward, config
        self.completions: dict[tuple[int, ...], Completion] = {}
        self.scores: dict[tuple[int, ...], float] = {}
        self.programs: list[Completion] = []  # in the order they were first evaluated
        self.reward_cost = Cost()
        self.root = self._node((), decoder.root())

    def _node(self, prefix: tuple[int, ...], state: object) -> PlanNode:
        terminal = self.decoder.ended(state)
        edges = [] if terminal else [Edge(token, prior) for token, prior in
                                     self.decoder.top_tokens(state, self.config.top_k)]
        return PlanNode(prefix, state, terminal, edges)

    def select(self, node: PlanNode) -> Edge:
        """The edge of `node` of highest P-UCB (the first among equal scores: the most probable)."""
        config = self.config
        return max(node.edges, key=lambda e: p_ucb(e.q, e.prior, node.visits, len(e.returns), config.c_base, config.c))

    def evaluate(self, node: PlanNode) -> float:
        """The pass rate of `node`'s greedy program: from the sequence cache, else completed (and
        every prefix of the completion past the node's cached); a program is tested once."""
        program = self.completions.get(node.prefix)
        if program is None:
            program = self.decoder.complete(node.state)
            ids = tuple(program.token_ids)
            for end in range(len(node.prefix), len(ids) + 1):
                self.completions.setdefault(ids[:end], program)
        ids = tuple(program.token_ids)
        if ids not in self.scores:
            score, spent = self.reward(program.text)
            self.scores[ids] = score
            self.reward_cost += spent
            self.programs.append(program)
        return self.scores[ids]

    def rollout(self) -> list[PlanNode]:
        """One select-expand-evaluate-backup round; returns the nodes it passed (root first)."""
        node, path = self.root, [self.root]
        edges: list[Edge] = []
        while not node.terminal:
            edge = self.select(node)
            edges.append(edge)
            if edge.child is None:
                edge.child = self._node(node.prefix + (edge.token,), self.decoder.child(node.state, edge.token))
                path.append(edge.child)
                break
            node = edge.child
            path.append(node)
        value = self.evaluate(path[-1])
        for edge in edges:
            edge.returns.append(value)
        for passed in path:
            passed.visits += 1
        return path

    def run(self, rollouts: int) -> GenerationResult:
        for _ in range(rollouts):
            self.rollout()
        candidates = [replace(p, score=self.scores[tuple(p.token_ids)]) for p in self.programs]
        chosen = max(candidates, key=lambda c: (c.score, c.cumulative_logprob))
        return GenerationResult(candidates, cost=self.decoder.cost + self.reward_cost, chosen=chosen)


def pg_td(model, prompt: Prompt, tests: ExampleTests, config: PGTDConfig | None = None, *,
          chat: bool | None = None) -> GenerationResult:
    """PG-TD on local `model` for `prompt`, valuing programs by `tests` (`ExampleTests` of the
    prompt; ValueError when it holds no examples, before any model call)."""
    require_examples(tests)
    config = config or PGTDConfig()
    from metagen.strategies.tree.token_rollouts import LocalTokenDecoder

    params = replace(config.params, max_tokens=min(config.params.max_tokens, config.max_rollout_tokens))
    decoder = LocalTokenDecoder(model, prompt, params, chat=chat)
    try:
        return PlanningSearch(decoder, tests.score, config).run(config.rollouts)
    finally:
        decoder.close()


def require_examples(tests: ExampleTests) -> None:
    """ValueError when the prompt's docstrings hold no examples (PG-TD has nothing to value programs by)."""
    if tests.verifier is None:
        raise ValueError("pg_td values programs by the prompt's docstring examples (its public tests), and this "
                         "prompt holds none: give a code prompt whose docstring has examples (>>> f(x) then the "
                         "expected value), or use another strategy")


def _runner(generator, prompt, n, params, options, rng, overrides):
    from metagen.scoring.base import prompt_text
    from metagen.scoring.example_tests import ExampleTests

    tests = ExampleTests(prompt_text(prompt))
    require_examples(tests)  # before the model is touched
    config = configure(PGTDConfig(rollouts=n, params=replace(params, n=1)), overrides)
    local = generator.local_model()
    return pg_td(local.model, prompt, tests, config, chat=local.chat)

register(StrategySpec("pg_td", "PG-TD: token-level MCTS (P-UCB), n rollouts valued by the docstring examples passed",
                      _runner, pooled=False, budget="rounds", samples=False, needs=frozenset({caps.LOCAL_CACHE}),
                      why="it expands and completes token prefixes from a local model's cache snapshots",
                      constrains=False, why_unconstrained="its rollouts rank tokens by the model's own distribution",
                      config=PGTDConfig, set_by_run=frozenset({"rollouts", "params"})), __name__)
