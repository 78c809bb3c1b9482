"""What each registry strategy needs from a generator, and the refusal before any request when
the generator lacks it (the CLI and the harness call `spec.run`, which checks first); the
registering modules the registry finds by itself, in its listing order."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from metagen.decoding import Cost, Generator
from metagen.decoding import capabilities as caps
from metagen.decoding.result import Completion, GenerationResult
from metagen.sampling import SamplingParams
from metagen.strategies import registry
from metagen.strategies.registry import STRATEGIES, StrategyOptions, get_strategy

HEAD = StrategyOptions(value="/some/value_head.pt")  # a trained value head: reads hidden states
STEPS = StrategyOptions(value="steps")

EXPECTED_NEEDS = {
    "best_of_n": {caps.FULL_DISTRIBUTIONS},
    "weighted_voting": {caps.FULL_DISTRIBUTIONS},
    "borda": {caps.FULL_DISTRIBUTIONS},
    "best_of_n_logprob": {caps.LOGPROBS},
    "chain_of_thought": {caps.ASSISTANT_CONTINUATION},  # continue the assistant's own message
    "self_ask": {caps.ASSISTANT_CONTINUATION},
    "calculator": {caps.ASSISTANT_CONTINUATION},
    "search": {caps.ASSISTANT_CONTINUATION},
    "s2a": {caps.ASSISTANT_CONTINUATION},
    "self_ask_search": {caps.ASSISTANT_CONTINUATION},
    "dsp": {caps.ASSISTANT_CONTINUATION},
    "tokenwise_cd": {caps.LOCAL_CACHE},  # values the top-k next tokens at every position
    "transfer_q": {caps.LOCAL_CACHE},  # ... by rollouts of a second local model
    "pg_td": {caps.LOCAL_CACHE},  # expands and completes token prefixes from cache snapshots
    "mbr_judge": {caps.TOP_LOGPROBS},  # the model judges pairs by P(Yes) among its top tokens
}
SEARCHES = [name for name, spec in STRATEGIES.items() if spec.uses_value and name not in ("tokenwise_cd", "transfer_q")]
# tree searches run on a local cache, or on a server continuing prefixes to the step delimiter
EXPECTED_ALTERNATIVES = {name: ({caps.LOCAL_CACHE}, {caps.STEP_CONTINUATION}) for name in SEARCHES}
SEQUENCE_LEVEL = [name for name in STRATEGIES if name not in EXPECTED_NEEDS and name not in EXPECTED_ALTERNATIVES]


def _options(name, head=False):
    if not get_strategy(name).uses_value:
        return StrategyOptions()
    return HEAD if head else STEPS


class MustNotGenerate(Generator):
    """Declares every capability but `lacking`; fails the test if asked to generate."""

    def __init__(self, lacking):
        self.capabilities = caps.ALL - {lacking}

    def generate(self, prompt, params, *, generator=None):
        raise AssertionError("a strategy the generator cannot run sent a request")


def test_each_strategy_declares_what_it_reads():
    assert {name: set(spec.required(_options(name))) for name, spec in STRATEGIES.items()
            if spec.required(_options(name))} == EXPECTED_NEEDS
    assert {name: tuple(map(set, spec.needs_any)) for name, spec in STRATEGIES.items()
            if spec.needs_any} == EXPECTED_ALTERNATIVES
    assert set(SEQUENCE_LEVEL) >= {"greedy", "self_consistency", "mbr_chrf", "mbr_bleu", "mbr_edit",
                                   "mbr_embedding", "self_refine"}


@pytest.mark.parametrize("name", [name for name, spec in STRATEGIES.items() if spec.uses_value])
def test_a_value_head_adds_hidden_states_and_steps_or_judge_do_not(name):
    spec = get_strategy(name)
    base = EXPECTED_NEEDS.get(name, set())
    assert spec.required(HEAD) == base | {caps.HIDDEN_STATES}
    assert spec.required(STEPS) == spec.required(StrategyOptions(value="judge")) == base


class Lacking(Generator):
    """Declares every capability but `lacking`; fails the test if asked to generate."""

    def __init__(self, *lacking):
        self.capabilities = caps.ALL - set(lacking)

    def generate(self, prompt, params, *, generator=None):
        raise AssertionError("a strategy the generator cannot run sent a request")


def test_supported_by_agrees_with_check():
    for name, spec in STRATEGIES.items():
        for lacking in [(), (caps.LOCAL_CACHE,), (caps.LOCAL_CACHE, caps.STEP_CONTINUATION), (caps.HIDDEN_STATES,),
                        (caps.ASSISTANT_CONTINUATION,)]:
            generator = Lacking(*lacking)
            for options in (STEPS, HEAD):
                try:
                    spec.check(generator, options)
                    passes = True
                except ValueError:
                    passes = False
                assert spec.supported_by(generator, options) == passes, (name, lacking, options)
    assert not get_strategy("rebase").supported_by(Lacking(caps.LOCAL_CACHE, caps.STEP_CONTINUATION))
    assert get_strategy("rebase").supported_by(Lacking(caps.LOCAL_CACHE))


@pytest.mark.parametrize("name", SEARCHES)
def test_a_search_is_refused_when_the_generator_has_neither_alternative(name):
    generator = Lacking(caps.LOCAL_CACHE, caps.STEP_CONTINUATION)
    pattern = (f"strategy '{name}' needs local_cache, which Lacking does not provide, or else step_continuation, "
               "which it does not provide either")
    # best_of_n_value is a search with a value that reads more than the text (the judge)
    options = StrategyOptions(value="judge") if name == "best_of_n_value" else STEPS
    with pytest.raises(ValueError, match=pattern) as error:
        get_strategy(name).run(generator, "q", 1, SamplingParams(max_tokens=4), options, None)
    assert caps.PROVIDERS[caps.LOCAL_CACHE] in str(error.value)
    assert caps.PROVIDERS[caps.STEP_CONTINUATION] in str(error.value)


CASES = [(name, need) for name in STRATEGIES for need in sorted(get_strategy(name).required(_options(name, True)))]


@pytest.mark.parametrize(("name", "need"), CASES)
def test_a_missing_capability_is_refused_before_any_request(name, need):
    spec = get_strategy(name)
    options = _options(name, head=True)
    generator = MustNotGenerate(need)
    pattern = f"strategy '{name}' needs {need}, which MustNotGenerate does not provide"
    with pytest.raises(ValueError, match=pattern) as error:
        spec.run(generator, "q", 1, SamplingParams(max_tokens=4), options, None)
    assert caps.PROVIDERS[need] in str(error.value)  # what would provide it
    with pytest.raises(ValueError, match=pattern):
        spec.check(generator, options)


def test_every_registry_strategy_has_a_refusal_case():
    assert {name for name, _ in CASES} == set(EXPECTED_NEEDS) | set(EXPECTED_ALTERNATIVES)


class TextOnly(Generator):
    """A minimal custom generator: text completions only (no ids, logprobs or distributions),
    FLOPs unknown; declares no capabilities."""

    def __init__(self):
        self.calls = 0

    def generate(self, prompt, params, *, generator=None):
        self.calls += 1
        texts = ["The answer is 4", "so 4", "The answer is 5", "4 it is"]
        completions = [Completion(text=texts[(self.calls + i) % len(texts)], finish_reason="stop")
                       for i in range(params.n)]
        return GenerationResult(completions, [], cost=Cost(model_calls=1, flops=None))


@pytest.mark.parametrize("name", [name for name in SEQUENCE_LEVEL if name != "mbr_embedding"])
def test_sequence_level_strategies_run_on_a_generator_without_capabilities(name):
    spec = get_strategy(name)
    generator = TextOnly()
    n = 1 if spec.budget == "none" else 3
    result = spec.run(generator, "What is 2 + 2?", n, SamplingParams(temperature=1.0, max_tokens=8),
                      StrategyOptions(), torch.Generator().manual_seed(0))
    assert generator.calls >= 1 and result.chosen.text
    assert result.cost.flops is None  # unknown stays unknown through the strategy's sums


def _calls_register(path: Path) -> bool:
    """Whether the module calls `register(...)` anywhere (module level, a loop, a function)."""
    return any(isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "register"
               for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))))


def test_the_registry_imports_every_module_that_calls_register():
    """Every module under src/metagen/strategies calling `register` is found by its text (a
    call the scan cannot see, inside a block, fails here) and registered its entries."""
    package = Path(registry.__file__).parent
    calling = {"metagen.strategies." + ".".join(path.relative_to(package).with_suffix("").parts)
               for path in package.rglob("*.py") if _calls_register(path)}
    assert len(calling) >= 18  # the scan finds the modules (a new strategy adds one)
    assert set(registry.MODULES) == calling
    assert all(registry.registered(module) for module in registry.MODULES)
    assert set(registry.ORDER) <= calling  # the listing order names no stale module
    assert list(STRATEGIES)[:3] == ["greedy", "best_of_n", "best_of_n_logprob"]  # runners, then best_of_n
    assert list(STRATEGIES)[-4:] == ["blockwise_cd", "tokenwise_cd", "transfer_q", "pg_td"]


def test_a_new_registering_module_is_found_and_listed_after_the_ordered_ones(tmp_path):
    (tmp_path / "tree").mkdir()
    (tmp_path / "runners.py").write_text('"""Helpers."""\n\nregister(StrategySpec("greedy", ...), __name__)\n')
    (tmp_path / "zeta.py").write_text("x = 1\nregister(StrategySpec('zeta', ...), __name__)\n")
    (tmp_path / "tree" / "alpha.py").write_text("register(\n    spec, __name__)\n")
    (tmp_path / "tree" / "mcts.py").write_text("register(spec, __name__)\n")
    (tmp_path / "helpers.py").write_text('"""Each module ends with a `register(...)` line."""\n'
                                         "def f():\n    register(spec, __name__)\n")
    (tmp_path / "other.py").write_text("spec.register(x)\nunregister(x)\n")
    assert registry.registering_module_names(tmp_path) == [
        "metagen.strategies.runners", "metagen.strategies.tree.mcts",  # in ORDER's order
        "metagen.strategies.tree.alpha", "metagen.strategies.zeta"]  # the others after, by name


def test_a_module_registering_without_a_register_line_is_refused():
    """A registration the scan cannot find (here: from outside a register line) stops the
    registry's import with the module's name, rather than the entry going missing."""
    run = ("from metagen.strategies.spec import StrategySpec, register\n"
           "register(StrategySpec('hidden', 'h', print, pooled=False), 'metagen.strategies.hidden')\n"
           "import metagen.strategies.registry\n")
    done = subprocess.run([sys.executable, "-c", run], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert ("ImportError: metagen.strategies.hidden register strategies without a line starting 'register('"
            in done.stderr)
