"""AdaDec (`decoding.adadec`) on the enumerable toy chain, against hand computations.

On the toy, greedy takes "a" after BOS (p = 0.45) where the row is uncertain (H ≈ 1.733 bits),
and "a" is followed by a nearly flat distribution; "b" (p = 0.33) is followed by EOS with
p ≈ 0.78. A lookahead therefore prefers "b": S(a) = (ln 0.45 + ln 0.2808) / 2 ≈ −1.0343 and
S(b) = (ln 0.33 + ln 0.7805) / 2 ≈ −0.6782 for L = 1. `adadec_by_hand` is the rule written out
on contexts (no cache, no forks), the reference of the general cases.
"""

from __future__ import annotations

import math

import pytest
import torch

import metagen.decoding.memory as memory
from metagen.decoding import AdaDecConfig, ContrastiveConfig, generate
from metagen.decoding.adadec import fit_entropy_threshold
from metagen.decoding.entropy_adaptive import entropy_bits
from metagen.sampling import SamplingParams
from tests.decoding.test_combine import ExpertWithBytes
from tests.decoding.toy_model import BOS, EOS, A, B, C, ToyModel, next_logits

GREEDY = SamplingParams(temperature=0, max_tokens=6)


def logprob(context: list[int], token: int) -> float:
    return float(torch.log_softmax(next_logits(context).double(), dim=-1)[token])


def adadec_by_hand(prompt: list[int], tau: float, candidates: int, lookahead: int, max_tokens: int,
                   penalty: float = 0.0) -> list[int]:
    """Greedy AdaDec from `prompt` on the toy: at a step with entropy > τ the top `candidates` tokens
    of the processed scores (logits − `penalty` · (1 + count) on every token generated `count` > 0
    times: presence and frequency penalties both `penalty`) are scored by the mean model log-prob
    of the token and its greedy continuation (argmax of the processed scores) of up to
    `lookahead` tokens, ending at EOS or at max_tokens."""

    def processed(context: list[int], output: list[int]) -> torch.Tensor:
        counts = torch.bincount(torch.tensor(output, dtype=torch.long), minlength=5).double()
        return next_logits(context).double() - penalty * ((counts > 0).double() + counts)

    context, output = list(prompt), []
    while len(output) < max_tokens and (not output or output[-1] != EOS):
        scores = processed(context, output)
        token = int(scores.argmax())
        if float(entropy_bits(next_logits(context)[None])) > tau:
            best = -math.inf
            for candidate in torch.topk(scores, candidates).indices.tolist():
                path, made, total = [*context, candidate], [*output, candidate], logprob(context, candidate)
                length = 0
                while length < lookahead and made[-1] != EOS and len(made) < max_tokens:
                    following = int(processed(path, made).argmax())
                    total += logprob(path, following)
                    path, made, length = [*path, following], [*made, following], length + 1
                score = total / (length + 1)
                if score > best:
                    best, token = score, candidate
        output.append(token)
        context.append(token)
    return output


def test_lookahead_prefers_b_whose_continuation_is_likelier():
    assert float(entropy_bits(next_logits([BOS])[None])) == pytest.approx(1.7330, abs=1e-4)
    s_a = (logprob([BOS], A) + logprob([BOS, A], A)) / 2
    s_b = (logprob([BOS], B) + logprob([BOS, B], EOS)) / 2
    assert (s_a, s_b) == (pytest.approx(-1.0343, abs=1e-4), pytest.approx(-0.6782, abs=1e-4))
    plain = generate(ToyModel(), [BOS], GREEDY)
    assert plain.completions[0].token_ids == [A, A, B, EOS]  # greedy takes "a"
    result = generate(ToyModel(), [BOS], GREEDY, rerank=AdaDecConfig(threshold=1.5, candidates=2, lookahead=1))
    assert result.completions[0].token_ids == [B, EOS]  # "b", then below τ (H ≈ 1.147 bits): greedy's EOS
    assert result.lookahead_steps == 1
    # the record keeps the model's own log-prob of the chosen token
    assert result.completions[0].logprobs[0] == pytest.approx(math.log(0.33), abs=1e-6)


def test_below_threshold_every_step_equals_greedy_token_for_token():
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    plain = generate(ToyModel(), [BOS, C], params)
    # after "c" the entropy is ≈ 0.45 bits at every step: τ = 1 never pauses
    result = generate(ToyModel(), [BOS, C], params, rerank=AdaDecConfig(threshold=1.0))
    assert result.completions[0].token_ids == plain.completions[0].token_ids == [C] * 8
    assert result.completions[0].logprobs == plain.completions[0].logprobs
    assert result.lookahead_steps == 0
    assert (result.cost.model_calls, result.cost.flops) == (plain.cost.model_calls, plain.cost.flops)
    # τ = 0 pauses at every step; the lookahead confirms "c" (its continuation "c c" is near certain)
    paused = generate(ToyModel(), [BOS, C], params, rerank=AdaDecConfig(threshold=0.0))
    assert paused.completions[0].token_ids == [C] * 8 and paused.lookahead_steps == 8


def test_cost_counts_every_lookahead_forward_exactly():
    model = ToyModel()
    result = generate(model, [BOS], GREEDY, rerank=AdaDecConfig(threshold=1.5, candidates=2, lookahead=2))
    assert result.completions[0].token_ids == [B, EOS]
    # prefill [BOS]; lookahead: candidates a, b fed at position 1 (2 rows), then a's "a" at position 2
    # (b's row ended on EOS); the main step feeds "b" at position 1; EOS ends the row.
    assert model.calls == [[1], [1, 1], [1], [1]]
    cost = result.cost
    assert cost.flops == 101 + 2 * 102 + 103 + 102  # toy FLOPs: 100 + context per token
    assert (cost.model_calls, cost.target_steps, cost.generated_tokens) == (4, 2, 2)


def test_rows_of_a_batch_pause_and_rerank_each_on_their_own_parent():
    model = ToyModel()
    params = SamplingParams(temperature=0, max_tokens=6, n=2)
    result = generate(model, [BOS], params, rerank=AdaDecConfig(threshold=1.5, candidates=2, lookahead=2))
    assert [c.token_ids for c in result.completions] == [[B, EOS], [B, EOS]]
    assert model.calls == [[1], [1, 1, 1, 1], [1, 1], [1, 1]]
    assert result.cost.flops == 101 + 4 * 102 + 2 * 103 + 2 * 102
    assert result.lookahead_steps == 2


@pytest.mark.parametrize(("prompt", "tau", "candidates", "lookahead"), [
    ([BOS], 1.5, 2, 1), ([BOS], 1.5, 3, 3), ([BOS], 1.0, 3, 2), ([BOS], 2.235, 2, 4), ([BOS, A], 0.5, 4, 2),
    ([BOS, B, A], 1.2, 3, 5), ([BOS], 0.0, 5, 2)])
def test_greedy_adadec_follows_the_rule_written_out_by_hand(prompt, tau, candidates, lookahead):
    params = SamplingParams(temperature=0, max_tokens=7)
    result = generate(ToyModel(), prompt, params, rerank=AdaDecConfig(tau, candidates, lookahead))
    assert result.completions[0].token_ids == adadec_by_hand(prompt, tau, candidates, lookahead, 7)


def test_lookahead_stops_at_max_tokens_and_then_scores_the_candidate_alone():
    model = ToyModel()
    result = generate(model, [BOS], SamplingParams(temperature=0, max_tokens=1),
                      rerank=AdaDecConfig(threshold=0.0, candidates=3, lookahead=5))
    assert result.completions[0].token_ids == [A]  # every candidate ends the row: S(c) = log p(c)
    assert model.calls == [[1]] and result.cost.model_calls == 1 and result.lookahead_steps == 1


def test_candidates_come_from_the_processed_scores():
    # a bias of −100 on "b" leaves "a" and "c" as the top two; "c" is followed by "c" (p ≈ 0.94)
    s_a = (logprob([BOS], A) + logprob([BOS, A], A)) / 2
    s_c = (logprob([BOS], C) + logprob([BOS, C], C)) / 2
    assert s_c > s_a
    params = SamplingParams(temperature=0, max_tokens=2, logit_bias={B: -100.0})
    result = generate(ToyModel(), [BOS], params, rerank=AdaDecConfig(threshold=1.5, candidates=2, lookahead=1))
    assert result.completions[0].token_ids[0] == C


@pytest.mark.parametrize(("tau", "candidates", "lookahead"), [(1.0, 3, 2), (1.5, 4, 4)])
def test_lookahead_rows_carry_the_chains_state_and_leave_the_live_rows_as_they_were(tau, candidates, lookahead):
    # presence and frequency penalties keep per-row state: the lookahead continues under each
    # fork's own history ("c" then "c" is penalised by 4, so "c"'s lookahead ends on EOS and "b"
    # wins), and the live rows' history is untouched by it (else later steps would differ)
    params = SamplingParams(temperature=0, max_tokens=7, presence_penalty=2.0, frequency_penalty=2.0)
    result = generate(ToyModel(), [BOS], params, rerank=AdaDecConfig(tau, candidates, lookahead))
    expected = adadec_by_hand([BOS], tau, candidates, lookahead, 7, penalty=2.0)
    assert result.completions[0].token_ids == expected
    assert expected != adadec_by_hand([BOS], tau, candidates, lookahead, 7)  # the penalty mattered
    never = generate(ToyModel(), [BOS], params, rerank=AdaDecConfig(threshold=math.inf))
    assert never.completions[0].token_ids == generate(ToyModel(), [BOS], params).completions[0].token_ids


def test_sampled_rows_draw_as_usual_below_tau_and_take_the_reranked_token_above():
    params = SamplingParams(temperature=1.0, max_tokens=4, n=40, seed=3)
    plain = generate(ToyModel(), [BOS], params)
    never = generate(ToyModel(), [BOS], params, rerank=AdaDecConfig(threshold=math.inf))
    assert [c.token_ids for c in never.completions] == [c.token_ids for c in plain.completions]
    result = generate(ToyModel(), [BOS], params, rerank=AdaDecConfig(threshold=1.5, candidates=2, lookahead=1))
    assert {c.token_ids[0] for c in result.completions} == {B}  # the first step always pauses
    assert result.lookahead_steps >= 40
    assert len({c.token_ids[1] for c in result.completions}) > 1  # below τ after "b": the rows still draw


def test_memory_check_counts_the_rows_held_aside_and_their_lookahead_rows(monkeypatch):
    model = ExpertWithBytes(1000)
    # per row of 10 new tokens: 6·5·4 + 10·1000 = 10,120 bytes; n = 2 with B = 3: 2·(3 + 1) = 8 rows
    monkeypatch.setattr(memory, "available_memory", lambda: 8 * 10_120)
    params = SamplingParams(temperature=0, max_tokens=10, n=2)
    generate(model, [BOS], params, rerank=AdaDecConfig(threshold=1.5, candidates=3))  # exactly fits
    with pytest.raises(ValueError, match=r"n·\(candidates \+ 1\)=10 is too large"):
        generate(model, [BOS], params, rerank=AdaDecConfig(threshold=1.5, candidates=4))


def test_config_checks_name_field_value_and_range():
    for threshold in (-0.1, math.nan, "1", True):
        with pytest.raises(ValueError, match=r"threshold=.* is out of range: must be a number of bits >= 0"):
            AdaDecConfig(threshold=threshold)
    with pytest.raises(ValueError, match=r"candidates=1 is out of range: must be an int >= 2"):
        AdaDecConfig(threshold=1.0, candidates=1)
    with pytest.raises(ValueError, match=r"lookahead=0 is out of range: must be an int >= 1"):
        AdaDecConfig(threshold=1.0, lookahead=0)
    assert AdaDecConfig(threshold=math.inf) == AdaDecConfig(math.inf, 3, 5)  # the paper's B = 3, L = 5
    with pytest.raises(ValueError, match="cannot be combined with a combiner"):
        generate(ToyModel(), [BOS], GREEDY, combiner=ContrastiveConfig(ToyModel()), rerank=AdaDecConfig(1.0))


def test_fitted_threshold_sits_where_balanced_odds_are_even():
    # symmetric about 1.5 bits (1.2 diverged and 1.8 did not mirror each other): τ = 1.5
    entropies = [0.5, 1.0, 1.8, 1.2, 2.0, 2.5]
    diverged = [False, False, False, True, True, True]
    assert fit_entropy_threshold(entropies, diverged) == pytest.approx(1.5, abs=1e-9)
    # class balance: repeating the diverged steps does not move it
    assert fit_entropy_threshold(entropies + entropies[3:] * 3, diverged + diverged[3:] * 3) == pytest.approx(
        1.5, abs=1e-9)
    # the fit is a stationary point of the weighted, ridge-penalised log-loss (gradient 0)
    x = torch.tensor([0.2, 0.4, 0.9, 1.1, 1.6, 2.2, 0.7], dtype=torch.float64)
    y = torch.tensor([0, 0, 1, 0, 1, 1, 0], dtype=torch.float64)
    tau = fit_entropy_threshold(x.tolist(), y.bool().tolist())
    weights = torch.where(y > 0, 7 / (2 * 3), 7 / (2 * 4))
    w = torch.tensor(1.0, dtype=torch.float64, requires_grad=True)
    # at the optimum, b = −τ w; solve the 1-d stationarity in w and check the b-gradient vanishes
    for _ in range(60):
        p = torch.sigmoid(w * (x - tau))
        loss = (weights * torch.nn.functional.binary_cross_entropy(p, y, reduction="none")).sum() + w ** 2 / 2
        (grad,) = torch.autograd.grad(loss, w, create_graph=True)
        (hess,) = torch.autograd.grad(grad, w)
        w = (w - grad / hess).detach().requires_grad_(True)
    p = torch.sigmoid(w.detach() * (x - tau))
    assert float((weights * (p - y)).sum()) == pytest.approx(0.0, abs=1e-9)  # ∂/∂b = 0 at b = −τ w


@pytest.mark.parametrize(("entropies", "diverged", "named"), [
    ([1.0, 2.0], [True], "one label per step"),
    ([1.0, 2.0], [True, True], "both classes are needed"),
    ([1.0, math.inf], [False, True], "must be finite"),
    ([1.0, 2.0, 3.0], [True, False, False], "no threshold separates them"),
])
def test_fit_refuses_what_has_no_threshold(entropies, diverged, named):
    with pytest.raises(ValueError, match=named):
        fit_entropy_threshold(entropies, diverged)


def test_local_generator_reranks_every_call_and_withholds_its_cache():
    from metagen.decoding import LocalGenerator
    from metagen.decoding import capabilities as caps

    generator = LocalGenerator(ToyModel(), rerank=AdaDecConfig(threshold=1.5, candidates=2, lookahead=1))
    result = generator.generate([BOS], GREEDY)
    assert result.completions[0].token_ids == [B, EOS] and result.lookahead_steps == 1
    assert caps.LOCAL_CACHE not in generator.capabilities  # a search decoding on the cache would skip AdaDec
    assert caps.LOCAL_CACHE in LocalGenerator(ToyModel()).capabilities
