"""Tree searches on the enumerable toy model with an exact value function.

Problem: reward r(y) = 1[y = "b </s>"], the toy model's most likely sequence, which greedy
decoding misses (it starts with "a"). The exact value of a prefix is the probability that the
model completes it into the target: V(y) = p(rest of target | y) on the target's path, else 0.
"""

import math

import pytest
import torch

from metagen.sampling import SamplingParams
from metagen.scoring.process_reward import FunctionValue
from metagen.strategies.tree.astar import AStarConfig, astar, priority
from metagen.strategies.tree.blockwise_cd import BlockwiseCDConfig, blockwise_cd
from metagen.strategies.tree.dvts import DVTSConfig, dvts
from metagen.strategies.tree.expand import StepConfig, StepExpander
from metagen.strategies.tree.mcts import MCTSConfig, mcts
from metagen.strategies.tree.particle_filter import ParticleFilterConfig, particle_filter
from metagen.strategies.tree.rebase import RebaseConfig, rebase, rebase_allocation
from metagen.strategies.tree.step_beam_search import StepBeamConfig, step_beam_search
from tests.decoding.toy_model import A, B, BOS, C, EOS, ToyModel, step_logprobs

PROMPT = [BOS]
TARGET = (B, EOS)
PARAMS = SamplingParams(temperature=1.0, max_tokens=5)
TOKEN_STEPS = StepConfig(delimiter=None, max_step_tokens=1)


def exact_value(prompt, continuation):
    k = len(continuation)
    if tuple(continuation) != TARGET[:k]:
        return 0.0
    return math.exp(sum(step_logprobs(prompt + continuation, TARGET[k:])))


VALUE = FunctionValue(exact_value)

SEARCHES = {
    "beam": lambda m, rng: step_beam_search(m, PROMPT, VALUE, StepBeamConfig(
        params=PARAMS, step=TOKEN_STEPS, beam_width=2, expansions=12), rng=rng),
    "dvts": lambda m, rng: dvts(m, PROMPT, VALUE, DVTSConfig(
        params=PARAMS, step=TOKEN_STEPS, subtrees=12, expansions=4), rng=rng),
    "rebase": lambda m, rng: rebase(m, PROMPT, VALUE, RebaseConfig(
        params=PARAMS, step=TOKEN_STEPS, width=12), rng=rng),
    "mcts": lambda m, rng: mcts(m, PROMPT, VALUE, MCTSConfig(
        params=PARAMS, step=TOKEN_STEPS, iterations=6, expansions=12), rng=rng),
    "astar": lambda m, rng: astar(m, PROMPT, VALUE, AStarConfig(
        params=PARAMS, step=TOKEN_STEPS, expansions=12, max_expansions=6), rng=rng),
    "particle_filter": lambda m, rng: particle_filter(m, PROMPT, VALUE, ParticleFilterConfig(
        params=PARAMS, step=TOKEN_STEPS, particles=12), rng=rng),
    "blockwise_cd": lambda m, rng: blockwise_cd(m, PROMPT, VALUE, BlockwiseCDConfig(
        params=PARAMS, blocks=12, block_tokens=1), rng=rng),
}


@pytest.mark.parametrize("name", SEARCHES)
def test_each_search_finds_the_optimum_greedy_misses(name, one_thread):
    from metagen.decoding.sample_loop import generate

    greedy = generate(ToyModel(), PROMPT, SamplingParams(temperature=0.0, max_tokens=5))
    assert tuple(greedy.completions[0].token_ids) != TARGET
    for seed in range(3):  # P(no child on the target's path at some depth) < 1% per run
        result = SEARCHES[name](ToyModel(), torch.Generator().manual_seed(seed))
        assert tuple(result.chosen.token_ids) == TARGET, (name, seed, result.chosen.token_ids)
        assert result.chosen.score == pytest.approx(1.0)
        assert result.chosen.finish_reason == "stop"


@pytest.mark.parametrize("name", SEARCHES)
def test_prefixes_are_never_recomputed(name, one_thread):
    """After the one prefill, every forward feeds exactly one new token per row, and the cost
    counts each child's parent prefix as reused."""
    model = ToyModel()
    result = SEARCHES[name](model, torch.Generator().manual_seed(0))
    assert model.calls[0] == [len(PROMPT)]
    assert all(counts == [1] * len(counts) for counts in model.calls[1:])
    cost = result.cost
    assert cost.prompt_tokens_computed == len(PROMPT)
    assert cost.generated_tokens == sum(len(c) for c in model.calls[1:])
    assert cost.model_calls == len(model.calls)
    assert cost.prompt_tokens_reused > 0


def test_long_prompt_reuse_is_over_ninety_percent(one_thread):
    prompt = [BOS] + [A, C] * 10  # a 21-token prompt
    result = step_beam_search(ToyModel(), prompt, FunctionValue(lambda p, c: 0.5), StepBeamConfig(
        params=PARAMS, step=TOKEN_STEPS, beam_width=4, expansions=4), rng=torch.Generator().manual_seed(0))
    assert result.cost.prompt_reuse_fraction > 0.9


def test_rebase_allocation_by_hand():
    # softmax([0.9, 0.5, 0.1] / 0.2) = (1, e^-2, e^-4) / 1.15365 = (0.8668, 0.1173, 0.0159)
    assert rebase_allocation([0.9, 0.5, 0.1], 8, 0.2) == [7, 1, 0]
    assert rebase_allocation([0.3, 0.3, 0.3, 0.3], 8, 1.0) == [2, 2, 2, 2]
    assert rebase_allocation([0.9, 0.1], 6, 100.0) == [3, 3]  # large T: even split
    assert rebase_allocation([], 4, 1.0) == []


def test_rebase_expands_each_node_by_its_share(monkeypatch, one_thread):
    calls = []
    original = StepExpander.expand

    def spy(self, parents, counts):
        groups = original(self, parents, counts)
        calls.append((list(counts), [c for group in groups for c in group]))
        return groups

    monkeypatch.setattr(StepExpander, "expand", spy)
    value = FunctionValue(lambda p, c: 0.2 * sum(c) / max(len(c), 1))  # differs between paths
    config = RebaseConfig(params=PARAMS, step=TOKEN_STEPS, width=10, temperature=0.2)
    rebase(ToyModel(), PROMPT, value, config, rng=torch.Generator().manual_seed(1))
    assert calls[0][0] == [10] and len(calls) >= 3
    finished = 0
    for (_, children), (counts, _) in zip(calls, calls[1:]):
        finished += sum(c.finished for c in children)
        frontier = [c.value for c in children if not c.finished]
        shares = rebase_allocation(frontier, 10 - finished, 0.2)
        assert counts == [w for w in shares if w > 0]
    assert any(len(counts) > 1 and len(set(counts)) > 1 for counts, _ in calls)  # uneven splits happened


def test_steps_end_at_the_delimiter(one_thread):
    expander = StepExpander(ToyModel(), PROMPT, PARAMS, StepConfig(delimiter="b", max_step_tokens=3), VALUE,
                            generator=torch.Generator().manual_seed(0))
    children = expander.expand([expander.root], [40])[0]
    assert len(children) == 40
    for node in children:
        assert node.token_ids[-1] in (B, EOS) or len(node.token_ids) == 3
        assert B not in node.token_ids[:-1]
        assert node.text == "".join("abc"[t - 1] for t in node.token_ids if t in (A, B, C))
        assert node.value == pytest.approx(exact_value(PROMPT, node.path_ids()))
    grandchildren = expander.expand(children[:2], [2, 3])
    assert [len(g) for g in grandchildren] == [2, 3]
    assert all(g.parent is children[1] and g.path_ids()[: len(children[1].token_ids)] == children[1].token_ids
               for g in grandchildren[1])


def test_astar_priority_is_cost_so_far_plus_heuristic(one_thread):
    config = AStarConfig(params=PARAMS, step=TOKEN_STEPS, step_cost=0.5, logprob_weight=2.0)
    expander = StepExpander(ToyModel(), PROMPT, PARAMS, TOKEN_STEPS, VALUE, generator=torch.Generator().manual_seed(0))
    node = expander.expand([expander.root], [1])[0][0]
    expected = 0.5 * 1 - 2.0 * node.logprobs[0] - math.log(max(node.value, 1e-6))
    assert priority(node, config) == pytest.approx(expected)
    assert node.logprobs[0] == pytest.approx(step_logprobs(PROMPT, node.token_ids)[0], abs=1e-6)


def test_errors_name_the_field():
    with pytest.raises(ValueError, match="params.n=2"):
        StepExpander(ToyModel(), PROMPT, SamplingParams(n=2), TOKEN_STEPS)
    with pytest.raises(ValueError, match="beam_width=0"):
        StepBeamConfig(beam_width=0)
    with pytest.raises(ValueError, match="aggregation='mean'"):
        RebaseConfig(aggregation="mean")
    with pytest.raises(ValueError, match="temperature=0"):
        RebaseConfig(temperature=0)
    with pytest.raises(ValueError, match="max_step_tokens=0"):
        StepConfig(max_step_tokens=0)
    with pytest.raises(ValueError, match="pass a PrefixValue"):
        mcts(ToyModel(), PROMPT, None)
    with pytest.raises(ValueError, match="logprob_weight=-1"):
        AStarConfig(logprob_weight=-1)


def test_blockwise_cd_derives_its_steps_from_the_block_length():
    assert BlockwiseCDConfig(block_tokens=5).step == StepConfig(delimiter=None, max_step_tokens=5)
    with pytest.raises(ValueError, match="set block_tokens instead"):
        BlockwiseCDConfig(step=StepConfig("\n", 8))


# ------------------------------------------------------------------ stateful processors


def test_each_node_keeps_its_own_processor_state_through_snapshot_and_restore(one_thread):
    """BanRepeats (a row bans the tokens it generated) snapshotted with each node and restored,
    several parents in one batch: every node's state is its own path, and children are drawn
    with their parent's path banned."""
    from tests.decoding.ban_repeats import BanRepeats, no_repeats
    from tests.decoding.helpers import assert_follows
    from tests.decoding.toy_model import next_logits

    given = BanRepeats(never_banned=[C])  # 5 tokens: "c" may repeat, so no row runs out of tokens
    expander = StepExpander(ToyModel(), PROMPT, SamplingParams(temperature=1.0, max_tokens=6, ignore_eos=True),
                            StepConfig(delimiter=None, max_step_tokens=2), generator=torch.Generator().manual_seed(1),
                            processors=[given])
    children = expander.expand([expander.root], [40])[0]
    parents = [c for c in children if not c.finished][:3]
    grandchildren = expander.expand(parents, [2, 3, 4])
    deeper = expander.expand([g for group in grandchildren for g in group][:4], [1, 2, 1, 2])
    for node in children + [g for group in grandchildren + deeper for g in group]:
        path = node.path_ids()
        assert no_repeats(path, allowed_repeats=[C])
        assert node.sampler.processors[0].histories == [path]
    assert given.histories == [[]] and "concat" in given.events
    # One token per step, two different parents in one batch: each child follows its parent's bans.
    one = StepExpander(ToyModel(), PROMPT, SamplingParams(temperature=1.0, max_tokens=6), TOKEN_STEPS,
                       generator=torch.Generator().manual_seed(2), processors=[BanRepeats()])
    first = {tuple(n.token_ids): n for n in one.expand([one.root], [60])[0]}
    a, c = first[(A,)], first[(C,)]
    for parent, group in zip((a, c), one.expand([a, c], [2500, 2500])):
        logits = next_logits(PROMPT + parent.token_ids).double()
        logits[parent.token_ids] = float("-inf")
        expected = dict(enumerate(torch.softmax(logits, dim=-1).tolist()))
        assert_follows((n.token_ids[0] for n in group), expected)


def test_penalties_follow_each_path(one_thread):
    """Greedy one-token steps with a presence penalty: the path is plain greedy decoding with the
    same penalty (the node's penalty state is its own path's tokens)."""
    from metagen.decoding.sample_loop import generate

    params = SamplingParams(temperature=0.0, max_tokens=5, presence_penalty=2.0, ignore_eos=True)
    plain = generate(ToyModel(), [BOS, A], params).completions[0]
    expander = StepExpander(ToyModel(), [BOS, A], params, TOKEN_STEPS)
    node = expander.root
    while not node.finished:
        node = expander.expand([node], [1])[0][0]
    assert node.path_ids() == plain.token_ids and len(set(plain.token_ids)) > 2


def test_expander_refuses_children_that_cannot_fit(monkeypatch):
    """An expansion forwards one row per open child: the memory check counts them before the cache
    is restored, naming n (the budget that sizes a search's expansions). A toy row holds 6 copies
    of 5 float32 logits (120 bytes, no cache): 1000 bytes fit 8 rows."""
    monkeypatch.setattr("metagen.decoding.memory.available_memory", lambda: 1000)
    expander = StepExpander(ToyModel(), PROMPT, PARAMS, TOKEN_STEPS, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match=r"n=12 is too large .* use n <= 8"):
        expander.expand([expander.root], [12])
    assert expander.cost.model_calls == 1  # nothing ran: only the root's prefill
    assert len(expander.expand([expander.root], [8])[0]) == 8
