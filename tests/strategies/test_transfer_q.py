"""Transfer Q* on the enumerable toy chain: Q̂ from a baseline's rollouts against Q computed by
hand (greedy rollouts) or by enumerating every rollout (sampled ones), the token choice against
the exp(Q/β)-tilted reference, the reduction to greedy decoding, the Cost and the refusals."""

import math

import pytest
import torch
from scipy.stats import chisquare

from metagen.decoding.cost import Cost, forward_flops
from metagen.sampling import SamplingParams
from metagen.scoring.base import Scorer, Scores
from metagen.scoring.process_reward import FunctionValue, HeadValue
from metagen.scoring.rollout_q import RolloutQ
from metagen.strategies.transfer_q import TransferQConfig, transfer_q
from tests.decoding.toy_companions import TransformedToy
from tests.decoding.toy_model import A, B, BOS, C, EOS, VOCAB, ToyModel, next_logits

TOKEN_REWARD = {EOS: 0.0, A: 0.3, B: 0.1, C: 1.0, BOS: 0.0}


def reward(prompt, sequence):
    """r(x, y): the mean reward of y's tokens (EOS counts 0)."""
    return sum(TOKEN_REWARD[t] for t in sequence) / len(sequence)


def baseline_model():
    """π_BL: the toy chain sharpened and pushed towards "b" (same tokenizer)."""
    return TransformedToy("baseline", 1.5, [0.0, 0.0, 0.8, 0.0, 0.0])


def greedy_rollout(baseline, context, tokens):
    """The baseline's greedy continuation of `context` for at most `tokens` tokens (ends at EOS)."""
    out = []
    while len(out) < tokens and (not out or out[-1] != EOS):
        out.append(int(torch.argmax(baseline.logits_after([*context, *out]))))
    return out


def greedy_q(baseline, prefix, length, max_tokens):
    """Q of `prefix` (after [BOS]) with one greedy rollout of at most `length` tokens, none past
    max_tokens, none after EOS."""
    room = min(length, max_tokens - len(prefix))
    tail = [] if prefix[-1] == EOS else greedy_rollout(baseline, [BOS, *prefix], room)
    return reward(None, prefix + tail)


def tilted(context, path, k, beta, q_of):
    """(top-k tokens of π_ref, softmax over them of log π_ref + Q/β) after context + path."""
    logp = torch.log_softmax(next_logits([*context, *path]).double(), dim=-1)
    top = torch.topk(logp, k).indices.tolist()
    scores = torch.tensor([float(logp[z]) + q_of(path + [z]) / beta for z in top], dtype=torch.float64)
    return top, torch.softmax(scores, 0)


def exact_q(baseline, context, prefix, tokens, log_weight=None):
    """E over τ ~ π_BL(· | context + prefix), at most `tokens` tokens (ending at EOS), of
    r(prefix + τ), by enumerating every τ; with `log_weight(sequence)`, the self-normalised
    E[w r] / E[w] of indirect transfer."""
    total = norm = 0.0

    def walk(tail, p):
        nonlocal total, norm
        if (tail and tail[-1] == EOS) or len(tail) == tokens:
            sequence = prefix + tail
            w = 1.0 if log_weight is None else math.exp(log_weight(sequence))
            total += p * w * reward(None, sequence)
            norm += p * w
            return
        probs = torch.softmax(baseline.logits_after([*context, *prefix, *tail]), 0)
        for t in range(VOCAB):
            walk(tail + [t], p * float(probs[t]))

    walk([], 1.0)
    return total / norm


def test_argmax_with_greedy_rollouts_follows_the_hand_computed_tilt(one_thread):
    k, beta, length, max_tokens = 3, 0.2, 2, 6
    baseline = baseline_model()
    path = []
    while len(path) < max_tokens and (not path or path[-1] != EOS):
        top, probs = tilted([BOS], path, k, beta, lambda prefix: greedy_q(baseline, prefix, length, max_tokens))
        path.append(top[int(torch.argmax(probs))])
    config = TransferQConfig(top_k=k, kl_beta=beta, rollout_tokens=length, params=SamplingParams(max_tokens=max_tokens))
    result = transfer_q(ToyModel(), [BOS], FunctionValue(reward), config, baseline=baseline)
    assert result.chosen.token_ids == path
    plain = [int(torch.argmax(next_logits([BOS])))]
    assert path[0] != plain[0]  # the tilt moved the first token off the reference's greedy choice


def test_sampled_first_token_follows_the_tilted_distribution(one_thread):
    """token_choice="sample", greedy rollouts (Q exact): the first tokens of n rows against the
    softmax over the top-k of log π_ref + Q/β (chi-square, fixed seed)."""
    n, k, beta, length = 2000, 4, 0.5, 2
    baseline = baseline_model()
    config = TransferQConfig(n=n, top_k=k, kl_beta=beta, rollout_tokens=length, token_choice="sample",
                             params=SamplingParams(max_tokens=3))
    result = transfer_q(ToyModel(), [BOS], FunctionValue(reward), config, baseline=baseline,
                        rng=torch.Generator().manual_seed(11))
    top, probs = tilted([BOS], [], k, beta, lambda prefix: greedy_q(baseline, prefix, length, 3))
    counts = [sum(c.token_ids[0] == z for c in result.completions) for z in top]
    assert sum(counts) == n  # nothing outside the top-k
    assert chisquare(counts, [n * float(p) for p in probs]).pvalue > 1e-3
    assert max(probs) < 0.9  # a real spread, not a point mass


@pytest.mark.parametrize("indirect", [False, True])
def test_sampled_rollouts_estimate_the_exact_q(indirect, one_thread):
    """m sampled rollouts per candidate: Q̂ within 4 standard errors of the Q of every rollout
    enumerated; indirect transfer's self-normalised weights exp((r − r_BL)/α) likewise."""
    m, length, alpha = 4000, 2, 0.5
    baseline = baseline_model()
    r_bl = FunctionValue(lambda prompt, sequence: float(sequence.count(B)))  # the baseline's own reward
    value = RolloutQ(baseline, FunctionValue(reward), rollouts=m, rollout_tokens=length, sample=True, max_tokens=8,
                     stop_ids={EOS}, generator=torch.Generator().manual_seed(2),
                     baseline_reward=r_bl if indirect else None, alpha=alpha if indirect else None)
    continuations = [[A], [B], [C], [A, C]]
    got = value.values([BOS], continuations).values
    value.close()

    def log_weight(sequence):
        return (reward(None, sequence) - sequence.count(B)) / alpha

    for continuation, estimate in zip(continuations, got):
        want = exact_q(baseline, [BOS], continuation, length, log_weight if indirect else None)
        assert abs(estimate - want) < 4 * 0.5 / math.sqrt(m) * (3 if indirect else 1), (continuation, estimate, want)
    if indirect:  # the weights moved the estimate away from the direct one
        direct = exact_q(baseline, [BOS], [A], length)
        assert abs(exact_q(baseline, [BOS], [A], length, log_weight) - direct) > 0.05


def test_the_reference_as_its_own_baseline_with_infinite_beta_is_greedy(one_thread):
    context, path = [BOS, A], []
    for _ in range(6):
        path.append(int(torch.argmax(next_logits(context + path))))
        if path[-1] == EOS:
            break
    config = TransferQConfig(top_k=3, kl_beta=math.inf, rollouts=2, rollout="sample",
                             params=SamplingParams(max_tokens=6))
    model = ToyModel()
    result = transfer_q(model, [BOS, A], FunctionValue(lambda p, s: 100.0 * s.count(C)), config,
                        rng=torch.Generator().manual_seed(0))
    assert result.chosen.token_ids == path


class FlopsToy(TransformedToy):
    """The transformed toy chain recording the FLOPs of every forward it runs (`forward_flops`
    of each row's new tokens at its cached positions)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.spent = 0.0

    def forward(self, cache, tokens, *, logits="last", hidden=False):
        rows = tokens.tolist() if isinstance(tokens, torch.Tensor) else tokens
        self.spent += sum(forward_flops(self, start, len(row)) for start, row in zip(cache.lengths, rows))
        return super().forward(cache, tokens, logits=logits, hidden=hidden)


class CountingScorer(Scorer):
    """A reward of the decoded text (the share of "c") that reports one model call of 1000 FLOPs."""

    name = "counting"

    def __init__(self) -> None:
        self.calls = self.scored = 0

    def score(self, prompt, candidates):
        self.calls += 1
        self.scored += len(candidates)
        values = [c.text.count("c") / max(1, len(c.text)) for c in candidates]
        return Scores(values, Cost(model_calls=1, flops=1000.0))


def test_cost_counts_every_forward_of_both_models_and_every_reward_call(one_thread):
    reference, baseline, scorer = FlopsToy("reference", 1.0, [0.0] * VOCAB, 100.0), FlopsToy(
        "baseline", 1.5, [0.0, 0.0, 0.8, 0.0, 0.0], 10.0), CountingScorer()
    k, m, length = 3, 2, 3
    config = TransferQConfig(n=2, top_k=k, rollouts=m, rollout_tokens=length, rollout="sample", token_choice="sample",
                             params=SamplingParams(max_tokens=4, ignore_eos=True))
    result = transfer_q(reference, [BOS], scorer, config, baseline=baseline, rng=torch.Generator().manual_seed(1))
    cost = result.cost
    assert cost.model_calls == len(reference.calls) + len(baseline.calls) + scorer.calls
    assert cost.flops == pytest.approx(reference.spent + baseline.spent + 1000.0 * scorer.calls)
    assert cost.scorer_flops == pytest.approx(baseline.spent + 1000.0 * scorer.calls)
    assert scorer.calls == 4  # one reward call per decoded token
    # rows of 4 tokens, no EOS: at token t the k·n candidates roll out min(L, 4 − t) tokens, m times each
    assert scorer.scored == sum(2 * k * (m if min(length, 4 - t) > 0 else 1) for t in range(1, 5))
    # the rollout forwards run n·k·m rows: L − 1 = 2 fed tokens at the first token, then 1
    assert [len(call) for call in baseline.calls].count(2 * k * m) == 2 + 1
    assert cost.generated_tokens == cost.target_steps == k * 2 * 4  # the reference's candidate rows


def test_refusals():
    with pytest.raises(ValueError, match=r"kl_beta=0 is out of range: must be > 0"):
        TransferQConfig(kl_beta=0)
    with pytest.raises(ValueError, match=r"rollouts=0 is out of range: must be >= 1"):
        TransferQConfig(rollouts=0)
    with pytest.raises(ValueError, match=r"rollout_tokens=-1 is out of range: must be >= 0"):
        TransferQConfig(rollout_tokens=-1)
    with pytest.raises(ValueError, match=r"rollout='beam' is not known; choose from greedy, sample"):
        TransferQConfig(rollout="beam")
    with pytest.raises(ValueError, match=r"token_choice='max' is not known; choose from sample, argmax"):
        TransferQConfig(token_choice="max")
    with pytest.raises(ValueError, match="indirect transfer needs both"):
        TransferQConfig(baseline_value="steps")
    with pytest.raises(ValueError, match=r"baseline_alpha=-1.0 is out of range: must be > 0"):
        TransferQConfig(baseline_value="steps", baseline_alpha=-1.0)

    class Wider(ToyModel):
        @property
        def vocab_size(self):
            return VOCAB + 1

    with pytest.raises(ValueError, match="has vocab_size=6, model 'toy' has 5: a combiner needs one tokenizer"):
        transfer_q(ToyModel(), [BOS], FunctionValue(reward), baseline=Wider())
    with pytest.raises(ValueError, match="HeadValue reads hidden states, but Transfer Q"):
        transfer_q(ToyModel(), [BOS], HeadValue(None))


def test_the_registry_entry_and_its_options():
    from metagen.decoding import capabilities as caps
    from metagen.strategies.registry import get_strategy

    spec = get_strategy("transfer_q")
    assert spec.needs == {caps.LOCAL_CACHE} and spec.uses_value
    n, _, overrides = spec.parse({"n": 4, "kl_beta": 0.5, "rollouts": 2, "baseline": "embedded"})
    assert (n, overrides) == (4, {"kl_beta": 0.5, "rollouts": 2, "baseline": "embedded"})
    with pytest.raises(ValueError, match=r"metagen\.rollout_tokens=1.5 must be an int"):
        spec.parse({"rollout_tokens": 1.5}, "metagen.")
    with pytest.raises(ValueError, match=r"strength is not an option of strategy 'transfer_q'"):
        spec.parse({"strength": 2.0})


@pytest.mark.parametrize(("argv", "named"), [
    (["--kl-beta", "0"], "kl_beta=0.0 is out of range: must be > 0"),
    (["--baseline", "early-exit:x"], "baseline 'early-exit:x': early-exit:L needs L"),
    (["--baseline-alpha", "0.5"], "indirect transfer needs both"),
    (["--rollouts", "0"], "rollouts=0 is out of range: must be >= 1"),
])
def test_the_command_line_refuses_bad_options_by_name_before_loading(monkeypatch, capsys, argv, named):
    from metagen.cli import common, main

    monkeypatch.setattr(common, "load_model", lambda args: pytest.fail("the model was loaded before the check"))
    assert main(["generate", "2 + 3 =", "--strategy", "transfer_q", "--value", "steps", *argv]) == 2
    assert named in capsys.readouterr().err


@pytest.mark.slow
def test_embedded_model_with_its_early_exit_baseline_runs_end_to_end(capsys):
    """The embedded SmolLM2 decoding, its own first 20 layers the baseline: every forward of both
    models is counted (reference: prefill + one per token; baseline: prefill + one per token to
    reach the candidates + L − 1 per rollout step that has room)."""
    import json

    from metagen.cli import main

    argv = ["generate", "What is 2 + 3?", "--strategy", "transfer_q", "--value", "steps", "--baseline",
            "early-exit:20", "--n", "2", "--max-tokens", "3", "--rollout-tokens", "2", "--rollout", "sample",
            "--rollouts", "2", "--seed", "1", "--json"]
    assert main(argv) == 0
    payload = json.loads(capsys.readouterr().out)
    tokens = payload["chosen"]["tokens"] if "tokens" in payload["chosen"] else payload["candidates"][0]["tokens"]
    assert tokens == 3 and payload["chosen"]["text"]
    cost = payload["cost"]
    assert cost["generated_tokens"] == cost["target_steps"] == 2 * 3  # top-2 candidate rows per token
    # reference 1 + 3; baseline 1 + 3 + (1 rollout forward at the first token, none after: room 2, 1, 0)
    assert cost["model_calls"] == (1 + 3) + (1 + 3 + 1)
    assert 0 < cost["scorer_flops"] < cost["flops"]
