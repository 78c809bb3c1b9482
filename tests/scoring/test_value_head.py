import itertools
import math

import numpy as np
import pytest
import torch

from metagen.eval.tasks import arithmetic_problems
from metagen.sampling import SamplingParams
from metagen.scoring.base import Scores
from metagen.scoring.exact_answer import ExactAnswerVerifier
from metagen.scoring.value_head import ValueHead, ValueScorer, model_identity
from metagen.scoring.value_training import (
    ValueDataset,
    auc,
    brier,
    collect_value_data,
    expected_calibration_error,
    train_value_head,
)
from metagen.decoding.result import Completion


def brute_force_auc(scores, labels):
    """Count pairs: 1 when the positive scores higher, ½ on a tie."""
    pos = [s for s, y in zip(scores, labels) if y]
    neg = [s for s, y in zip(scores, labels) if not y]
    wins = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p, n in itertools.product(pos, neg))
    return wins / (len(pos) * len(neg))


def test_auc_known_cases():
    assert auc([0.1, 0.2, 0.8, 0.9], [0, 0, 1, 1]) == 1.0
    assert auc([0.9, 0.8, 0.2, 0.1], [0, 0, 1, 1]) == 0.0
    assert auc([0.5, 0.5, 0.5], [0, 1, 1]) == 0.5
    # positives 0.4 and 0.8 against negatives 0.3 and 0.6: wins 1 + 0 + 1 + 1 = 3 of 4
    assert auc([0.3, 0.4, 0.6, 0.8], [0, 1, 0, 1]) == 0.75
    assert math.isnan(auc([0.1, 0.2], [1, 1]))


def test_auc_matches_brute_force_pair_count():
    rng = np.random.default_rng(0)
    for _ in range(20):
        scores = rng.integers(0, 6, size=30) / 5.0  # many ties
        labels = rng.integers(0, 2, size=30)
        if labels.min() == labels.max():
            continue
        assert auc(scores, labels) == pytest.approx(brute_force_auc(scores, labels), abs=1e-12)


def test_brier_and_ece_by_hand():
    assert brier([0.0, 1.0, 0.5], [0, 1, 1]) == pytest.approx(0.25 / 3)
    # bin [0.2, 0.3): p = 0.2, 0.2 vs y = 0, 1 → |0.2 − 0.5| · 2/4
    # bin [0.9, 1]:   p = 0.9, 0.9 vs y = 1, 1 → 0.1 · 2/4
    assert expected_calibration_error([0.2, 0.2, 0.9, 0.9], [0, 1, 1, 1]) == pytest.approx(0.15 + 0.05)
    assert expected_calibration_error([1.0, 0.0], [1, 0]) == 0.0


def synthetic_dataset(completions=60, length=5, hidden_size=8, seed=0) -> ValueDataset:
    """Prefix states whose first coordinate carries the label's sign plus noise."""
    generator = torch.Generator().manual_seed(seed)
    rewards = (torch.arange(completions) % 2).float()
    rows = length + 1
    hidden = torch.randn(completions * rows, hidden_size, generator=generator)
    labels = rewards.repeat_interleave(rows)
    hidden[:, 0] += 3.0 * (2 * labels - 1)
    return ValueDataset(
        hidden=hidden, labels=labels,
        completion=torch.arange(completions).repeat_interleave(rows),
        position=torch.arange(rows).repeat(completions),
        lengths=torch.full((completions,), length), rewards=rewards,
        problem=torch.arange(completions) // 2, identity={},
    )


@pytest.mark.parametrize("mlp_hidden", [None, 4])
def test_head_learns_separable_data(mlp_hidden):
    head, report = train_value_head(synthetic_dataset(), mlp_hidden=mlp_hidden, steps=200, lr=0.05, seed=0)
    assert report.held_out_completions == 12 and report.train_completions == 48
    assert report.held_out_auc > 0.95
    assert [m.fraction for m in report.at_fraction] == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert all(m.auc > 0.95 and m.count == 12 for m in report.at_fraction)
    values = head(torch.randn(3, 8))
    assert values.shape == (3,) and bool(((values >= 0) & (values <= 1)).all())


def test_group_by_problem_keeps_problems_on_one_side():
    dataset = synthetic_dataset()
    _, report = train_value_head(dataset, steps=5, group_by_problem=True, seed=1)
    assert report.held_out_completions % 2 == 0  # problems hold two completions each


class FakeModel:
    """Only what model_identity reads."""

    def __init__(self, hidden_size=8, dtype="int4"):
        self.config = type("Config", (), {"name": "toy", "hidden_size": hidden_size, "num_hidden_layers": 2})()
        self.vocab_size, self.source, self.dtype = 100, "/some/dir/toy.gguf", dtype


def test_save_load_round_trip_and_identity_check(tmp_path):
    model = FakeModel()
    head = ValueHead(8, 3, identity=model_identity(model), generator=torch.Generator().manual_seed(0))
    head.params["w2"] = torch.arange(3.0)
    path = tmp_path / "head.safetensors"
    head.save(path)
    loaded = ValueHead.load(path, model)
    x = torch.randn(5, 8)
    assert torch.equal(loaded(x), head(x))
    assert loaded.identity["source"] == "toy.gguf"
    with pytest.raises(ValueError, match="dtype"):
        ValueHead.load(path, FakeModel(dtype="fp32"))
    with pytest.raises(ValueError, match="hidden_size"):
        ValueHead.load(path, FakeModel(hidden_size=16))


def test_collect_value_data_on_real_model(model):
    problems = arithmetic_problems(2, seed=3)
    dataset = collect_value_data(model, problems, lambda p: ExactAnswerVerifier(p.answer), 2,
                                 SamplingParams(temperature=0.8, max_tokens=16),
                                 generator=torch.Generator().manual_seed(0))
    hidden_size = model.config.hidden_size
    assert len(dataset.lengths) == 4 and dataset.problem.tolist() == [0, 0, 1, 1]
    rows = int((dataset.lengths + 1).sum())  # one row per prefix t = 0..|y|
    assert dataset.hidden.shape == (rows, hidden_size) and dataset.labels.shape == (rows,)
    assert set(dataset.labels.tolist()) <= {0.0, 1.0}
    assert bool((dataset.lengths >= 1).all()) and bool((dataset.lengths <= 16).all())
    for c in range(4):
        mine = dataset.completion == c
        assert dataset.position[mine].tolist() == list(range(int(dataset.lengths[c]) + 1))
        assert bool((dataset.labels[mine] == dataset.rewards[c]).all())
    # the t = 0 states of one problem's completions are the same prompt state
    first = dataset.hidden[dataset.position == 0]
    assert torch.allclose(first[0], first[1]) and not torch.allclose(first[0], first[2])
    # the last prefix state of each completion is the state a fresh forward over prompt + completion ends in
    last = dataset.hidden[dataset.position == dataset.lengths[dataset.completion]]  # (4, H)
    fresh = model.forward(model.new_cache(4), dataset.sequences, logits="none", hidden=True).hidden  # (4, H)
    # bf16 activations through 30 layers: step-by-step decoding and one prefill round differently
    # (about 1% of each state's norm; a state one position off is ~100% away)
    assert ((last - fresh).norm(dim=-1) / fresh.norm(dim=-1)).max().item() < 0.03
    assert dataset.cost.model_calls > 0 and dataset.identity == model_identity(model)


def test_value_scorer_scores_each_candidate(model):
    head = ValueHead(model.config.hidden_size, identity=model_identity(model))
    head.params["weight"] = torch.randn(model.config.hidden_size, generator=torch.Generator().manual_seed(0)) * 0.1
    scorer = ValueScorer(model, head)
    candidates = [Completion("The answer is 12."), Completion("I am not sure."), Completion("12")]
    scores = scorer("Ava has 5 apples and finds 7 more. How many apples?", candidates)
    assert isinstance(scores, Scores) and len(scores.values) == 3
    assert all(0.0 <= v <= 1.0 for v in scores.values)
    assert len(set(scores.values)) == 3
    assert scores.cost.model_calls == 1 and scores.cost.prompt_tokens_computed > 0 and scores.cost.flops > 0


def test_value_scorer_rejects_head_of_another_model(model):
    head = ValueHead(model.config.hidden_size, identity={**model_identity(model), "dtype": "fp32-other"})
    with pytest.raises(ValueError, match="dtype"):
        ValueScorer(model, head)


def markov_dataset():
    """States as one-hot hidden vectors: 0 → 1 → 3 (reward 1, twice) and 0 → 2 → 3 (reward 0,
    twice). Monte Carlo (CD-FUDGE) credits state 1 with 1 and state 2 with 0; the Bellman
    identity (CD-Q) passes both the value of the shared state 3, which is 1/2."""
    paths = [((0, 1, 3), 1.0), ((0, 1, 3), 1.0), ((0, 2, 3), 0.0), ((0, 2, 3), 0.0)]
    hidden, labels, completion, position = [], [], [], []
    for c, (states, reward) in enumerate(paths):
        for t, state in enumerate(states):
            hidden.append(torch.nn.functional.one_hot(torch.tensor(state), 4).float())
            labels.append(reward)
            completion.append(c)
            position.append(t)
    return ValueDataset(
        hidden=torch.stack(hidden), labels=torch.tensor(labels), completion=torch.tensor(completion),
        position=torch.tensor(position), lengths=torch.full((4,), 2), rewards=torch.tensor([1.0, 1.0, 0.0, 0.0]),
        problem=torch.arange(4), identity={})


def test_cd_q_follows_the_bellman_identity_where_fudge_follows_returns():
    states = torch.eye(4)
    fudge, _ = train_value_head(markov_dataset(), steps=600, lr=0.2, weight_decay=0.0, held_out=0.0)
    values = fudge(states)
    assert values[1] > 0.9 and values[2] < 0.1 and abs(values[3] - 0.5) < 0.02
    cd_q, _ = train_value_head(markov_dataset(), steps=600, lr=0.2, weight_decay=0.0, held_out=0.0,
                               method="cd_q", rounds=6)
    values = cd_q(states)
    assert abs(values[3] - 0.5) < 0.02
    assert abs(values[1] - 0.5) < 0.05 and abs(values[2] - 0.5) < 0.05  # V(s) = V(next state)
    assert abs(values[0] - 0.5) < 0.05
    with pytest.raises(ValueError, match="method='td'"):
        train_value_head(markov_dataset(), method="td")


def toy_tree_dataset():
    """A two-step toy tree, states one-hot: 0 -a(0.7)-> 1, 0 -b(0.3)-> 2; 1 -> leaves 3 (reward 0.9)
    and 4 (0.2) with probability 1/2 each; 2 -> leaves 5 (0.6, prob 0.6) and 6 (0.1, prob 0.4).
    Exact values: V*(1) = 0.55, V*(2) = 0.4, V*(0) = 0.7·0.55 + 0.3·0.4 = 0.505. The sampled
    paths are skewed (leaf 3 three times, 4 once, 5 once, 6 three times), so returns and the
    one-sample Bellman target give V(1) = 0.725, V(2) = 0.225 instead."""
    children = {0: [(1, 0.7), (2, 0.3)], 1: [(3, 0.5), (4, 0.5)], 2: [(5, 0.6), (6, 0.4)]}
    reward = {3: 0.9, 4: 0.2, 5: 0.6, 6: 0.1}
    paths = [(0, 1, 3)] * 3 + [(0, 1, 4), (0, 2, 5)] + [(0, 2, 6)] * 3
    eye = torch.eye(7)
    hidden, labels, completion, position, next_hidden, next_probs, sampled = [], [], [], [], [], [], []
    for c, states in enumerate(paths):
        for t, state in enumerate(states):
            hidden.append(eye[state])
            labels.append(reward[states[-1]])
            completion.append(c)
            position.append(t)
            kids = children.get(state, [(0, 0.0), (0, 0.0)])
            next_hidden.append(torch.stack([eye[kid] if state in children else torch.zeros(7) for kid, _ in kids]))
            next_probs.append(torch.tensor([prob for _, prob in kids]))
            sampled.append(state in children)
    return ValueDataset(
        hidden=torch.stack(hidden), labels=torch.tensor(labels), completion=torch.tensor(completion),
        position=torch.tensor(position), lengths=torch.full((len(paths),), 2),
        rewards=torch.tensor([reward[p[-1]] for p in paths]), problem=torch.arange(len(paths)), identity={},
        next_hidden=torch.stack(next_hidden), next_probs=torch.stack(next_probs), next_sampled=torch.tensor(sampled))


def test_cd_q_with_the_exact_bellman_target_reaches_the_true_values_on_a_toy_tree():
    states = torch.eye(7)
    options = {"steps": 600, "lr": 0.2, "weight_decay": 0.0, "held_out": 0.0, "rounds": 8}
    one_sample, _ = train_value_head(toy_tree_dataset(), method="cd_q", **options)
    values = one_sample(states)
    assert abs(values[1] - 0.725) < 0.03 and abs(values[2] - 0.225) < 0.03  # the skewed samples' averages
    exact, _ = train_value_head(toy_tree_dataset(), method="cd_q_exact", **options)
    values = exact(states)
    for state, expected in ((3, 0.9), (4, 0.2), (5, 0.6), (6, 0.1), (1, 0.55), (2, 0.4), (0, 0.505)):
        assert abs(values[state] - expected) < 0.02, (state, float(values[state]))
    with pytest.raises(ValueError, match="collect_value_data\\(next_top_k=k\\)"):
        train_value_head(markov_dataset(), method="cd_q_exact")


def test_collect_value_data_keeps_the_states_after_each_prefix_top_k_tokens(model):
    problems = arithmetic_problems(1, seed=3)
    k = 3
    dataset = collect_value_data(model, problems, lambda p: ExactAnswerVerifier(p.answer), 2,
                                 SamplingParams(temperature=0.8, max_tokens=6),
                                 generator=torch.Generator().manual_seed(0), next_top_k=k)
    rows, hidden_size = dataset.hidden.shape
    assert dataset.next_hidden.shape == (rows, k, hidden_size) and dataset.next_probs.shape == (rows, k)
    last = dataset.position == dataset.lengths[dataset.completion]
    assert bool((dataset.next_probs[last] == 0).all()) and not bool(dataset.next_sampled[last].any())
    inner = ~last
    assert bool((dataset.next_probs[inner][:, 0] >= dataset.next_probs[inner][:, -1]).all())
    assert bool((dataset.next_probs[inner].sum(-1) <= 1 + 1e-6).all())
    prompt = dataset.sequences[0][:len(dataset.sequences[0]) - int(dataset.lengths[0])]
    for c in range(2):
        sequence = dataset.sequences[c]
        start = len(sequence) - int(dataset.lengths[c])
        first = int((dataset.completion < c).sum())
        for t in range(int(dataset.lengths[c])):
            # the top-k after prefix t, fed alone after [x, y^t], give the same probabilities and states
            cache, out = model.prefill(sequence[:start + t], logits="last", hidden=False)
            probs = torch.softmax(out.logits[0].float(), -1)
            top = probs.topk(k)
            assert dataset.next_probs[first + t].tolist() == pytest.approx(top.values.tolist(), abs=2e-3)
            cache.select([0] * k)
            fresh = model.forward(cache, [[z] for z in top.indices.tolist()], logits="none", hidden=True).hidden
            got = dataset.next_hidden[first + t]
            assert ((got - fresh).norm(dim=-1) / fresh.norm(dim=-1)).max().item() < 0.03
            assert bool(dataset.next_sampled[first + t]) == (sequence[start + t] in top.indices.tolist())
    assert len(prompt) > 0
