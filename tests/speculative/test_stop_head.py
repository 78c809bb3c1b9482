"""SpecDec++ stop heads on the enumerable toy: the stop rule on hand-computed probabilities,
the features, training where rejection is predictable (after "a" the draft guesses "c", which
the target never ranks first), the drafter stopping where the rule says, and the output law
unchanged (chi-square against plain sampling)."""

from __future__ import annotations

import math

import pytest
import torch

from metagen.decoding import generate
from metagen.models.base import ForwardOutput
from metagen.sampling import SamplerChain, SamplingParams
from metagen.speculative import ModelDrafter, SpeculativeConfig, speculative_generate
from metagen.speculative.registry import DrafterOptions, check_speculative
from metagen.speculative.stop_head import StopHead, stop_features, stop_probability, stops
from metagen.speculative.stop_training import fit_stop_head, stop_training_data

from tests.decoding.helpers import assert_follows
from tests.decoding.toy_model import BOS, VOCAB, A, B, C, ToyModel
from tests.speculative.test_loop import DRAFT_SHIFT, PROMPT, chain_distribution

pytestmark = pytest.mark.usefixtures("one_thread")


class HiddenToyModel(ToyModel):
    """The toy chain with hidden states: the one-hot (V,) of each position's token. `shift`:
    added to the logits (a draft); `after_a`: added to the logits after "a" only."""

    name = "toy-hidden"

    def __init__(self, shift: torch.Tensor | None = None, after_a: torch.Tensor | None = None) -> None:
        super().__init__()
        self.shift, self.after_a = shift, after_a

    def forward(self, cache, tokens, *, logits="last", hidden=False) -> ForwardOutput:
        rows = tokens.tolist() if isinstance(tokens, torch.Tensor) else [list(row) for row in tokens]
        out = super().forward(cache, rows, logits="all" if logits != "none" else "none")
        width = max(len(row) for row in rows)
        fed = torch.tensor([row + [row[-1]] * (width - len(row)) for row in rows])  # (B, T)
        states = torch.nn.functional.one_hot(fed, VOCAB).float()  # (B, T, V)
        values = out.logits
        if values is not None:
            if self.shift is not None:
                values = values + self.shift
            if self.after_a is not None:
                values = values + (fed == A)[..., None] * self.after_a
            if logits == "last":
                last = torch.tensor([len(row) - 1 for row in rows])
                values, states = values[torch.arange(len(rows)), last], states[torch.arange(len(rows)), last]
        elif logits == "last":
            states = states[torch.arange(len(rows)), torch.tensor([len(row) - 1 for row in rows])]
        return ForwardOutput(values, states if hidden else None, out.num_new)


def hand_head(bias: float, on_a: float = 0.0) -> StopHead:
    """r = σ(bias + on_a · 1[last token is "a"]) (features unstandardised)."""
    head = StopHead(VOCAB + 2, {})
    head.tensors["weight"][A] = on_a
    head.tensors["bias"] = torch.tensor(bias)
    return head


def logit(p: float) -> float:
    return math.log(p / (1 - p))


def test_the_stop_rule_on_hand_computed_probabilities():
    rejects = torch.tensor([0.1, 0.2, 0.5])
    # 1 − 0.9 = 0.1;  1 − 0.9·0.8 = 0.28;  1 − 0.72·0.5 = 0.64
    torch.testing.assert_close(stop_probability(rejects), torch.tensor([0.1, 0.28, 0.64]))
    survival, stopped = torch.ones(2), []
    for r in rejects:  # row 0 at threshold 0.25 stops after token 2; row 1 at 0.7 never does
        survival, stop = stops(survival, torch.stack([r, r]), torch.tensor([0.25, 0.7]))
        stopped.append(stop.tolist())
    assert stopped == [[False, False], [True, False], [True, False]]
    torch.testing.assert_close(survival, torch.tensor([0.36, 0.36]))


def test_features_are_the_state_the_drafts_log_probability_and_the_entropy():
    logits = torch.tensor([[math.log(0.5), math.log(0.25), math.log(0.25)], [0.0, -math.inf, 0.0]])
    features = stop_features(torch.tensor([[1.0, 2.0], [3.0, 4.0]]), logits, torch.tensor([1, 2]))
    expected = torch.tensor([[1.0, 2.0, math.log(0.25), 1.5 * math.log(2)], [3.0, 4.0, math.log(0.5), math.log(2)]])
    torch.testing.assert_close(features, expected)


def predictable_data(temperature: float):
    target, draft = HiddenToyModel(), HiddenToyModel(after_a=torch.tensor([0.0, 0.0, 0.0, 3.0, 0.0]))
    generator = torch.Generator().manual_seed(0)
    sequences = [[BOS] + torch.randint(1, 4, (30,), generator=generator).tolist() for _ in range(20)]
    return sequences, stop_training_data(target, draft, sequences, temperature=temperature)


def test_greedy_labels_mark_exactly_the_positions_after_a():
    sequences, data = predictable_data(0.0)
    after_a = torch.tensor([token == A for sequence in sequences for token in sequence]).float()
    assert torch.equal(data.labels, after_a)


def test_soft_labels_are_token_verifications_rejection_probability():
    _, data = predictable_data(1.0)
    after_a = data.features[:, A] == 1
    assert torch.all(data.labels[~after_a] == 0)  # draft = target there: min(1, q/p) = 1
    assert 0 < float(data.labels[after_a].mean()) < 1


@pytest.mark.parametrize("hidden_units", [None, 8], ids=["logistic", "mlp"])
def test_training_learns_a_predictable_rejection(hidden_units):
    _, data = predictable_data(0.0)
    head, report = fit_stop_head(data, {}, hidden_units=hidden_units, steps=200, lr=0.05, held_out=0.25)
    assert report.accuracy >= 0.97 > report.baseline_accuracy + 0.2
    assert report.bce_after < report.bce_before / 3
    after_a = data.features[:, A] == 1
    assert float(head(data.features[after_a]).min()) > 0.5 > float(head(data.features[~after_a]).max())


def test_save_and_load_keep_the_head(tmp_path, monkeypatch):
    _, data = predictable_data(0.0)
    identity = {"target": {"name": "t"}, "draft": "toy-hidden"}
    head, _ = fit_stop_head(data, identity, steps=20)
    monkeypatch.setattr("metagen.speculative.stop_head.model_identity", lambda target: {"name": target})
    head.save(tmp_path / "stop.safetensors")
    loaded = StopHead.load(tmp_path / "stop.safetensors", "t", HiddenToyModel())
    torch.testing.assert_close(loaded(data.features), head(data.features))
    with pytest.raises(ValueError, match="draft 'toy-hidden'.*runs 'toy'"):
        StopHead.load(tmp_path / "stop.safetensors", "t", ToyModel())
    with pytest.raises(ValueError, match="name='t'"):
        StopHead.load(tmp_path / "stop.safetensors", "other", HiddenToyModel())
    with pytest.raises(FileNotFoundError):
        StopHead.load(tmp_path / "missing.safetensors", "t", HiddenToyModel())


def test_the_drafter_stops_where_the_rule_passes_the_threshold():
    # after "c" the draft repeats "c" and the head says r = 0.1 each time: 1 − 0.9^k is
    # 0.1, 0.19, 0.271 -> the draft stops after its third token at threshold 0.25
    drafter = ModelDrafter(HiddenToyModel(), stop_head=hand_head(logit(0.1)), stop_threshold=0.25)
    drafter.start([BOS, A, C], 1)
    chain = SamplerChain.from_params(SamplingParams(temperature=0), 1, VOCAB, [BOS, A, C])
    draft = drafter.propose([[BOS, A, C]], [8], chain, None)
    assert draft.tokens == [[C, C, C]]
    # after "a" the head says r = 0.9: the draft stops after one token
    drafter = ModelDrafter(HiddenToyModel(), stop_head=hand_head(logit(0.1), logit(0.9) - logit(0.1)),
                           stop_threshold=0.25)
    drafter.start([BOS, C, A], 1)
    assert len(drafter.propose([[BOS, C, A]], [8], chain, None).tokens[0]) == 1


def test_sampled_output_follows_the_target_with_the_stop_head():
    params = SamplingParams(n=3000, max_tokens=4, seed=3)
    drafter = ModelDrafter(HiddenToyModel(shift=DRAFT_SHIFT), stop_head=hand_head(logit(0.3)), stop_threshold=0.5)
    result = speculative_generate(ToyModel(), drafter, PROMPT, params, SpeculativeConfig(num_draft_tokens=4))
    assert_follows((tuple(c.token_ids) for c in result.completions), chain_distribution(params, PROMPT, 4))
    # 1 − 0.7 = 0.3, 1 − 0.49 = 0.51 > 0.5: every draft stops after two tokens
    assert result.cost.draft_tokens <= 2 * (result.cost.target_steps - params.n)
    assert 0 < result.cost.accepted_tokens < result.cost.draft_tokens


@pytest.mark.parametrize("prompt", [[BOS], PROMPT, [BOS, B, A, C]])
def test_greedy_with_the_stop_head_equals_plain_greedy(prompt):
    params = SamplingParams(temperature=0, max_tokens=8)
    plain = generate(ToyModel(), prompt, params).completions[0]
    drafter = ModelDrafter(HiddenToyModel(shift=DRAFT_SHIFT), stop_head=hand_head(logit(0.2)), stop_threshold=0.5)
    spec = speculative_generate(ToyModel(), drafter, prompt, params, SpeculativeConfig(num_draft_tokens=6))
    assert spec.completions[0].token_ids == plain.token_ids


@pytest.mark.parametrize("options, message", [
    ({"stop_threshold": 0.3}, "given with stop_head"),
    ({"stop_head": "h", "stop_threshold": 1.0}, "must be in \\(0, 1\\)"),
    ({"stop_head": "h", "tree_widths": (2, 2)}, "does not apply to tree drafts"),
    ({"stop_head": "h", "confidence": 0.4}, "give one"),
])
def test_stop_options_are_checked_before_anything_loads(options, message):
    with pytest.raises(ValueError, match=message):
        check_speculative("early-exit", DrafterOptions(**options))


def test_the_drafter_checks_its_stop_arguments():
    with pytest.raises(ValueError, match="stop_threshold=1.5"):
        ModelDrafter(ToyModel(), stop_head=hand_head(0.0), stop_threshold=1.5)
    with pytest.raises(ValueError, match="two stopping rules"):
        ModelDrafter(ToyModel(), stop_head=hand_head(0.0), confidence=0.5)
