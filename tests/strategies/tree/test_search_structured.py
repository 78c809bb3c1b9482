"""Tree searches and controlled decoding under a constraint: each node keeps its matcher state
(restored with its cache snapshot, concatenated into a batch, forked at a step's end), so every
finished output satisfies the constraint; cut outputs are flagged and never chosen over complete
ones; the remote expander refuses a constraint by name."""

from __future__ import annotations

import re

import pytest
import torch

pytest.importorskip("llguidance")

from metagen.decoding import capabilities as caps  # noqa: E402
from metagen.sampling import SamplingParams  # noqa: E402
from metagen.scoring.process_reward import FunctionValue  # noqa: E402
from metagen.strategies.registry import StrategyOptions, get_strategy  # noqa: E402
from metagen.strategies.tokenwise_cd import TokenwiseCDConfig, tokenwise_cd  # noqa: E402
from metagen.strategies.tree.astar import AStarConfig, astar  # noqa: E402
from metagen.strategies.tree.blockwise_cd import BlockwiseCDConfig, blockwise_cd  # noqa: E402
from metagen.strategies.tree.dvts import DVTSConfig, dvts  # noqa: E402
from metagen.strategies.tree.expand import StepConfig, StepExpander  # noqa: E402
from metagen.strategies.tree.expander import open_expander  # noqa: E402
from metagen.strategies.tree.mcts import MCTSConfig, mcts  # noqa: E402
from metagen.strategies.tree.particle_filter import ParticleFilterConfig, particle_filter  # noqa: E402
from metagen.strategies.tree.rebase import RebaseConfig, rebase  # noqa: E402
from metagen.strategies.tree.step_beam_search import StepBeamConfig, step_beam_search  # noqa: E402
from tests.decoding.toy_choice_constraint import StructuredToyModel, choice_sequences  # noqa: E402
from tests.decoding.toy_model import BOS, C  # noqa: E402
from tests.strategies.tree.toy_server import FULL, ToyServer  # noqa: E402

PROMPT = [BOS]
CHOICES = ("ab", "b", "bab", "cb", "cccc", "acb")
PARAMS = SamplingParams(temperature=1.0, max_tokens=4, structured_outputs={"choice": list(CHOICES)})
STEPS = StepConfig(delimiter=None, max_step_tokens=1)
ALLOWED = choice_sequences(CHOICES, 4)
VALUE = FunctionValue(lambda prompt, continuation: float(continuation.count(C)))  # favours "cccc"

SEARCHES = {
    "beam": lambda m, rng, p: step_beam_search(m, PROMPT, VALUE, StepBeamConfig(
        params=p, step=STEPS, beam_width=2, expansions=4), rng=rng),
    "dvts": lambda m, rng, p: dvts(m, PROMPT, VALUE, DVTSConfig(params=p, step=STEPS, subtrees=3, expansions=3),
                                   rng=rng),
    "rebase": lambda m, rng, p: rebase(m, PROMPT, VALUE, RebaseConfig(params=p, step=STEPS, width=6), rng=rng),
    "mcts": lambda m, rng, p: mcts(m, PROMPT, VALUE, MCTSConfig(params=p, step=STEPS, iterations=4, expansions=3),
                                   rng=rng),
    "astar": lambda m, rng, p: astar(m, PROMPT, VALUE, AStarConfig(params=p, step=STEPS, expansions=3,
                                                                   max_expansions=6), rng=rng),
    "particle_filter": lambda m, rng, p: particle_filter(m, PROMPT, VALUE, ParticleFilterConfig(
        params=p, step=STEPS, particles=6), rng=rng),
    "blockwise_cd": lambda m, rng, p: blockwise_cd(m, PROMPT, VALUE, BlockwiseCDConfig(
        params=p, blocks=4, block_tokens=1), rng=rng),
}


@pytest.mark.parametrize("name", SEARCHES)
def test_every_output_of_a_search_is_allowed_and_flagged_as_the_constraint_judges(name, one_thread):
    for seed in range(4):
        result = SEARCHES[name](StructuredToyModel(), torch.Generator().manual_seed(seed), PARAMS)
        for candidate in result.completions:
            if candidate.finish_reason in ("stop", "length") and tuple(candidate.token_ids) in ALLOWED:
                assert candidate.complete == ALLOWED[tuple(candidate.token_ids)]
            else:  # a frontier node returned unfinished: an allowed prefix, judged as it stands
                text = candidate.text
                assert any(choice.startswith(text) for choice in CHOICES)
                assert candidate.complete == (text in CHOICES)
            assert (candidate.complete is True) == (candidate.text in CHOICES)
        if any(c.complete for c in result.completions):
            assert result.chosen.complete is True
        assert result.incomplete == [i for i, c in enumerate(result.completions) if c.complete is False]


def test_nodes_keep_their_matcher_through_snapshot_restore_and_concat(one_thread):
    """Expanding the same parents again (restored from their snapshots, their chains concatenated
    in one batch) continues each from its own constraint state: "c" may only go on with "b" or
    "c", "a" only with "b" or "c" — never a token another node's state allows."""
    expander = StepExpander(StructuredToyModel(), PROMPT, PARAMS, STEPS, generator=torch.Generator().manual_seed(0))
    first = expander.expand([expander.root], [24])[0]
    by_text = {node.text: node for node in first}
    assert set(by_text) <= {"a", "b", "c"} and len(by_text) == 3
    parents = [by_text["a"], by_text["c"], by_text["b"]]
    for _ in range(2):  # twice: restoring must not consume the parents' states
        groups = expander.expand(parents, [12, 12, 12])
        for parent, children in zip(parents, groups):
            for child in children:
                assert any(choice.startswith(child.text) for choice in CHOICES), (parent.text, child.text)
                if child.finished:
                    assert child.complete is True and child.text in CHOICES
    assert {c.text for c in groups[1]} <= {"cb", "cc"}


def test_tokenwise_cd_outputs_are_allowed_and_a_cut_one_is_not_chosen(one_thread):
    config = TokenwiseCDConfig(n=6, top_k=3, strength=2.0, params=PARAMS)
    for seed in range(3):
        result = tokenwise_cd(StructuredToyModel(), PROMPT, VALUE, config, rng=torch.Generator().manual_seed(seed))
        for candidate in result.completions:
            assert ALLOWED[tuple(candidate.token_ids)] == candidate.complete
        if any(c.complete for c in result.completions):
            assert result.chosen.complete is True


def test_the_remote_expander_refuses_a_constraint_by_name():
    with pytest.raises(ValueError, match=r"structured_outputs \(choice\) cannot be honoured by a remote step search"):
        open_expander(ToyServer(FULL | {caps.STRUCTURED_OUTPUT}), PROMPT, PARAMS, StepConfig("\n", 4))
    # a server that takes constraints in plain requests still cannot carry one across steps
    with pytest.raises(ValueError, match=r"structured_outputs \(choice\) cannot be honoured by a remote step search"):
        get_strategy("rebase").run(ToyServer(FULL | {caps.STRUCTURED_OUTPUT}), "a", 4, PARAMS,
                                   StrategyOptions(value="steps"), None)
    # one that takes none is refused by the capability contract, before any request
    server = ToyServer()
    with pytest.raises(ValueError, match="strategy 'rebase' needs structured_output, which ToyServer does not provide"):
        get_strategy("rebase").run(server, "a", 4, PARAMS, StrategyOptions(value="steps"), None)
    assert server.prefixes == []


@pytest.mark.slow
def test_rebase_and_step_beam_with_a_regex_on_the_real_model(model):
    from metagen.decoding import LocalGenerator

    regex = r"(yes|no), because [a-z ]{1,12}\."
    params = SamplingParams(temperature=1.0, max_tokens=16, seed=0, structured_outputs={"regex": regex})
    value = FunctionValue(lambda prompt, continuation: -0.01 * len(continuation))
    generator = LocalGenerator(model)
    runs = [
        rebase(model, "Is the sky blue? Answer yes or no and why.", value, RebaseConfig(
            params=params, step=StepConfig(" ", 8), width=4, max_steps=6), rng=torch.Generator().manual_seed(0)),
        get_strategy("step_beam").run(generator, "Is water wet? Answer yes or no and why.", 4, params,
                                      StrategyOptions(value="steps", step_delimiter=" "),
                                      torch.Generator().manual_seed(1)),
    ]
    for result in runs:
        assert any(c.complete for c in result.completions)  # measured: every leaf of both runs is complete
        for candidate in result.completions:
            if candidate.complete:
                assert re.fullmatch(regex, candidate.text), candidate.text
            else:  # cut or unfinished: still a prefix the regex allows, and never chosen over a complete one
                assert candidate.complete is False
        if any(c.complete for c in result.completions):
            assert result.chosen.complete is True
