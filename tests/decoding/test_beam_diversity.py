"""Diverse beam search (BeamSearchConfig.groups, diversity_penalty) on the enumerable toy model.

After the prompt [BOS] the toy's first token has p = (EOS .04, a .45, b .33, c .17, BOS .01), so
with one beam per group: group 0 takes "a"; group 1 sees log p(a) − λ·1 against log p(b) and
duplicates "a" while λ < log(.45/.33) = 0.310, takes "b" above it; a third group sees
log p(a) − λ·Δ(a) with Δ(a) = 2 when both earlier groups took "a".
"""

from __future__ import annotations

import math

import pytest
import torch

from metagen.decoding import BeamSearchConfig, beam_search
from metagen.decoding.beam_diversity import StepSelections

from .test_beam_search import reference_beam_search
from .toy_model import BOS, EOS, VOCAB, A, B, C, ToyModel, next_logits, step_logprobs

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPT = [BOS]
A_OVER_B = math.log(0.45 / 0.33)  # 0.3102: the λ at which one earlier "a" makes "b" the better choice


def first_tokens(groups: int, penalty: float, diversity: str = "hamming") -> list[int]:
    """The one-token hypotheses of `groups` groups of one beam, ranked by the model's
    log-probability (a > b > c)."""
    config = BeamSearchConfig(width=groups, groups=groups, n_best=groups, diversity_penalty=penalty,
                              diversity=diversity, length_penalty=0.0, max_tokens=1)
    return [h.token_ids[0] for h in beam_search(ToyModel(), PROMPT, config).completions]


def test_the_toy_first_step_is_the_one_the_module_docstring_computes_by_hand():
    logprobs = step_logprobs(PROMPT, [A]) + step_logprobs(PROMPT, [B]) + step_logprobs(PROMPT, [C])
    assert logprobs == pytest.approx([math.log(0.45), math.log(0.33), math.log(0.17)], abs=1e-6)


@pytest.mark.parametrize(("penalty", "expected"), [
    (0.0, [A, A]),                   # no penalty: group 1 duplicates group 0
    (A_OVER_B - 0.01, [A, A]),       # log .45 − λ still above log .33
    (A_OVER_B + 0.01, [A, B]),       # the next-best token
    (5.0, [A, B]),
])
def test_group_two_duplicates_group_one_until_the_penalty_outweighs_the_gap(penalty, expected):
    assert first_tokens(2, penalty) == expected


@pytest.mark.parametrize(("penalty", "expected"), [
    # Δ(a) = 2 for the third group once the first two took "a": it switches at λ = 0.310 / 2.
    (0.14, [A, A, A]),
    (0.16, [A, A, B]),
    # λ > 0.310: group 1 takes b, so group 2 sees Δ(a) = Δ(b) = 1 and takes c once
    # log .45 − λ < log .17, λ > log(.45/.17) = 0.973.
    (0.9, [A, B, A]),
    (1.0, [A, B, C]),
])
def test_the_hamming_penalty_counts_every_earlier_selection(penalty, expected):
    assert math.log(0.45 / 0.17) == pytest.approx(0.9734, abs=1e-4)
    assert sorted(first_tokens(3, penalty)) == sorted(expected)


def test_two_steps_by_hand():
    """width 2, two groups of one beam, λ = 0.5, α = 0, two tokens.

    step 1: group 0 keeps "a" (log .45); group 1: log .45 − 0.5 = −1.299 < log .33 = −1.109: "b".
    step 2: group 0, from "a": p(·|a) = (EOS .224, a .281, b .210, c .205): keeps "a a", cut at
    two tokens. Group 1, from "b": "b EOS" (.781) is its best candidate, a finished hypothesis;
    its next beam is "b a" (log .106 − 0.5 · 1, Δ(a) = 1 from group 0's "a a") against "b c"
    (log .051): −2.744 > −2.976, "b a". Group 1 then holds one finished hypothesis (−1.356) better
    than anything "b a" can reach, and stops. The two best by log p: "b EOS" and "a a" ("b a",
    log .33·.106 = −3.35, comes third).
    Without the penalty both groups are the same width-1 beam search: "a a" twice.
    """
    config = BeamSearchConfig(width=2, n_best=2, groups=2, diversity_penalty=0.5, length_penalty=0.0, max_tokens=2)
    hypotheses = beam_search(ToyModel(), PROMPT, config).completions
    assert [h.token_ids for h in hypotheses] == [[B, EOS], [A, A]]
    assert [h.score for h in hypotheses] == pytest.approx(
        [sum(step_logprobs(PROMPT, [B, EOS])), sum(step_logprobs(PROMPT, [A, A]))], abs=1e-5)
    duplicate = BeamSearchConfig(width=2, n_best=2, groups=2, length_penalty=0.0, max_tokens=2)
    assert [h.token_ids for h in beam_search(ToyModel(), PROMPT, duplicate).completions] == [[A, A], [A, A]]


def test_the_penalty_of_a_step_is_the_count_of_earlier_selections():
    """Δ as the formula gives it: hamming counts earlier selections of the token, whatever came
    before it; ngram (n = 2) counts those whose last two tokens equal the candidate's."""
    hamming = StepSelections("hamming", 2, VOCAB)
    assert hamming.penalty([[A]]) is None  # the first group: nothing selected yet
    for prefix, token in [([A], B), ([C], B), ([A], A)]:
        hamming.add(prefix, token)
    assert hamming.penalty([[A], [B]]).tolist() == [[0, 1, 2, 0, 0]] * 2
    bigram = StepSelections("ngram", 2, VOCAB)
    for prefix, token in [([A], B), ([C], B), ([A], A), ([B, A], B)]:
        bigram.add(prefix, token)
    assert bigram.penalty([[A], [C], [B], [C, A]]).tolist() == [
        [0, 1, 2, 0, 0],  # (a, a) once; (a, b) twice: after "a" and after "b a"
        [0, 0, 1, 0, 0],  # (c, b)
        [0, 0, 0, 0, 0],  # nothing selected after "b"
        [0, 1, 2, 0, 0],  # only the last token before the candidate counts for n = 2
    ]
    trigram = StepSelections("ngram", 3, VOCAB)
    trigram.add([B, A], B)
    trigram.add([C, A], B)
    assert trigram.penalty([[B, A], [C, A], [A]]).tolist() == [[0, 0, 1, 0, 0], [0, 0, 1, 0, 0], [0, 0, 0, 0, 0]]


def reference_diverse_beam_search(prompt, width, groups, penalty, alpha, max_tokens, diversity="hamming", n=2):
    """Diverse beam search written out in float64 (the paper's algorithm with this library's beam
    bookkeeping): each step the groups in turn rank candidates by log p − λ·Δ, Δ counting the
    beams earlier groups kept this step whose last min(n, step) tokens (1 for hamming) equal the
    candidate's; the 2·w best are scanned (EOS among the first w finishes), w live ones kept; a
    group stops once it has w finished hypotheses better than any score its beams can still
    reach (logp / max_tokens^α for α > 0). Every hypothesis (score, logp, tokens), best first."""
    per_group = width // groups
    live = [[((), 0.0)] for _ in range(groups)]
    finished = [[] for _ in range(groups)]
    for step in range(1, max_tokens + 1):
        last = 1 if diversity == "hamming" else min(n, step)
        chosen = []  # the beams earlier groups kept at this step
        for group in range(groups):
            if not live[group]:
                continue
            candidates = []
            for tokens, logprob in live[group]:
                steps = torch.log_softmax(next_logits([*prompt, *tokens]).double(), dim=-1).tolist()
                for token in range(VOCAB):
                    new = (*tokens, token)
                    delta = sum(other[-last:] == new[-last:] for other in chosen)
                    candidates.append((logprob + steps[token] - penalty * delta, logprob + steps[token], new))
            candidates.sort(key=lambda candidate: candidate[0], reverse=True)
            kept = []
            for rank, (_, logprob, tokens) in enumerate(candidates[:2 * per_group]):
                if tokens[-1] == EOS:
                    if rank < per_group:
                        finished[group].append((logprob / len(tokens) ** alpha, logprob, tokens))
                    continue
                kept.append((tokens, logprob))
                if len(kept) == per_group:
                    break
            scores = sorted(score for score, _, _ in finished[group])
            reachable = max((logprob / (max_tokens if alpha > 0 else step) ** alpha for _, logprob in kept),
                            default=None)
            if reachable is not None and len(scores) >= per_group and reachable < scores[-per_group]:
                finished[group] += [(logprob / step ** alpha, logprob, tokens) for tokens, logprob in kept]
                kept = []
            chosen += [tokens for tokens, _ in kept]
            live[group] = kept
    ended = [(logprob / max_tokens ** alpha, logprob, tokens) for beams in live for tokens, logprob in beams]
    return sorted([h for hypotheses in finished for h in hypotheses] + ended, key=lambda h: h[0], reverse=True)


@pytest.mark.parametrize(("width", "groups"), [(2, 2), (4, 2), (3, 3), (6, 3)])
@pytest.mark.parametrize("penalty", [0.3, 1.0, 4.0])
@pytest.mark.parametrize(("alpha", "diversity"), [(0.0, "hamming"), (1.0, "hamming"), (1.0, "ngram"), (-0.5, "ngram")])
@pytest.mark.parametrize("prompt", [[BOS], [BOS, A], [BOS, A, C]])
def test_diverse_beam_search_is_the_algorithm_written_out(width, groups, penalty, alpha, diversity, prompt):
    config = BeamSearchConfig(width=width, n_best=width, groups=groups, diversity_penalty=penalty,
                              diversity=diversity, length_penalty=alpha, max_tokens=4)
    hypotheses = beam_search(ToyModel(), prompt, config).completions
    expected = reference_diverse_beam_search(prompt, width, groups, penalty, alpha, 4, diversity)[:width]
    assert [h.score for h in hypotheses] == pytest.approx([score for score, _, _ in expected], abs=1e-5)
    assert [tuple(h.token_ids) for h in hypotheses] == [tokens for _, _, tokens in expected]
    for h in hypotheses:  # ranked by the model's own log-probability, not the augmented score
        assert h.cumulative_logprob == pytest.approx(sum(step_logprobs(prompt, h.token_ids)), abs=1e-5)


@pytest.mark.parametrize("alpha", [0.0, 1.0, 1.5])
@pytest.mark.parametrize("prompt", [[BOS], [BOS, A], [BOS, A, C]])
def test_one_group_is_plain_beam_search(alpha, prompt):
    config = BeamSearchConfig(width=3, n_best=3, groups=1, length_penalty=alpha, max_tokens=5)
    hypotheses = beam_search(ToyModel(), prompt, config).completions
    expected = reference_beam_search(prompt, 3, alpha, 5)[:3]
    assert [tuple(h.token_ids) for h in hypotheses] == [tokens for _, _, tokens in expected]
    assert [h.score for h in hypotheses] == pytest.approx([score for score, _, _ in expected], abs=1e-5)


@pytest.mark.parametrize(("width", "groups"), [(4, 2), (6, 3), (6, 2)])
def test_without_the_penalty_every_group_is_the_same_narrower_beam_search(width, groups):
    """λ = 0: G identical beam searches of width B/G (the duplication the penalty is there to
    break), sharing one forward per step and a stateful mask's forks (BanRepeats)."""
    from .ban_repeats import BanRepeats

    per_group = width // groups
    narrow = BeamSearchConfig(width=per_group, n_best=per_group, length_penalty=1.0, max_tokens=4)
    grouped = BeamSearchConfig(width=width, n_best=width, groups=groups, length_penalty=1.0, max_tokens=4)
    for processors in ([], [BanRepeats()]):
        one = beam_search(ToyModel(), PROMPT, narrow, processors=processors).completions
        model = ToyModel()
        several = beam_search(model, PROMPT, grouped, processors=processors).completions
        assert [tuple(h.token_ids) for h in several] == [tuple(h.token_ids) for h in one for _ in range(groups)]
        assert [h.score for h in several] == pytest.approx([h.score for h in one for _ in range(groups)], abs=1e-6)
        assert all(len(call) <= width for call in model.calls)
        assert any(len(call) > per_group for call in model.calls[1:])  # the groups' beams in one forward


def test_a_stateful_mask_follows_the_beams_of_every_group():
    from .ban_repeats import BanRepeats, no_repeats

    processor = BanRepeats()
    config = BeamSearchConfig(width=4, n_best=4, groups=2, diversity_penalty=1.0, length_penalty=0.0, max_tokens=4)
    hypotheses = beam_search(ToyModel(), PROMPT, config, processors=[processor]).completions
    assert len(hypotheses) == 4
    for h in hypotheses:
        assert no_repeats(h.token_ids)
        assert h.cumulative_logprob == pytest.approx(sum(step_logprobs(PROMPT, h.token_ids)), abs=1e-5)
    assert "concat" in processor.events  # the groups' candidates joined into one batch
    assert processor.histories == [[]]


def test_diverse_beam_search_returns_the_cost_it_spent():
    model = ToyModel()
    config = BeamSearchConfig(width=4, groups=2, diversity_penalty=0.5, max_tokens=4, length_penalty=0.0)
    cost = beam_search(model, PROMPT, config).cost
    assert cost.model_calls == len(model.calls)
    by_hand = model.flops_per_token(1)
    by_hand += sum(len(call) * model.flops_per_token(1 + step) for step, call in enumerate(model.calls[1:], 1))
    assert cost.flops == pytest.approx(by_hand, rel=1e-12)
    assert cost.generated_tokens >= sum(len(call) for call in model.calls[1:])


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"width": 4, "groups": 3}, "groups=3 is out of range: must divide width=4"),
    ({"width": 2, "groups": 4}, "groups=4 is out of range"),
    ({"width": 4, "groups": 0}, "groups=0 is out of range"),
    ({"width": 4, "groups": 2, "diversity_penalty": -1.0}, "diversity_penalty=-1.0 is out of range"),
    ({"width": 4, "groups": 2, "diversity_penalty": math.inf}, "diversity_penalty=inf is out of range"),
    ({"width": 4, "diversity_penalty": 0.5}, "diversity_penalty=0.5 needs groups > 1"),
    ({"width": 4, "groups": 2, "diversity": "jaccard"}, "diversity='jaccard' is out of range"),
    ({"width": 4, "groups": 2, "diversity": "ngram", "diversity_ngram": 0}, "diversity_ngram=0 is out of range"),
    ({"width": 4, "groups": 2, "diversity_ngram": 3}, "diversity_ngram=3 applies to diversity='ngram' only"),
    ({"width": 4, "groups": 2, "stochastic": True}, "groups=2 is out of range for stochastic=True"),
])
def test_config_names_the_field_value_and_range(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        BeamSearchConfig(**kwargs)
