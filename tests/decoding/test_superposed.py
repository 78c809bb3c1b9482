"""Superposed decoding (`metagen.decoding.superposed`): the n-gram interpolation and one step's
candidate ranking against hand-computed scores on the toy model's distribution, the decoder
against a step-by-step reconstruction on a tiny random model (the superposed input is what is
fed), its Cost (one forward per step whatever k), and the refusals."""

import math
from pathlib import Path

import pytest
import torch

from metagen.decoding import SuperposedConfig, superposed_decode
from metagen.decoding.ngram_counts import NgramCounts
from metagen.decoding.superposed import rank_candidates, superposition
from metagen.models import load
from metagen.models.kgram import KGramModel
from tests.decoding.toy_model import A, B, BOS, C, next_logits

PROMPT = [1, 17, 230, 4055, 9, 88]


@pytest.fixture(scope="module")
def tiny(tiny_checkpoint):
    return load(tiny_checkpoint, dtype="fp32", use_cache=False)


def test_ngram_probability_interpolates_maximum_likelihood_orders():
    counts = NgramCounts((2, 3))
    for ids in ([A, A, B], [C, A], [A, B]):
        counts.add(ids)
    # order 2 after "a": a 1, b 2 (of 3); order 3 after "a a": b 1 (of 1)
    assert counts.probability([A], B, (0.5, 0.5)) == pytest.approx(0.5 * 2 / 3)  # order 3's context too short
    assert counts.probability([A, A], B, (0.5, 0.5)) == pytest.approx(0.5 * 2 / 3 + 0.5 * 1.0)
    assert counts.probability([A, A], A, (0.5, 0.5)) == pytest.approx(0.5 * 1 / 3)
    assert counts.probability([B, B], A, (0.5, 0.5)) == 0.0  # no order has seen the context
    assert counts.probability([C], B, (1.0, 1.0)) == 0.0  # seen context, unseen continuation
    assert counts.tokens == 7


def test_one_steps_candidates_are_ranked_by_the_interpolated_scores_supported_first():
    """Two live drafts extended by the toy model's top-2 tokens after BOS ("a" 0.45, "b" 0.33);
    λ = 0.4, orders 2 and 3 weighted 0.5 each, counts of "aab", "ca", "ab"."""
    counts = NgramCounts((2, 3))
    for ids in ([A, A, B], [C, A], [A, B]):
        counts.add(ids)
    logprobs = torch.log_softmax(next_logits([BOS]), dim=-1)
    top = torch.topk(logprobs, 2)
    assert top.indices.tolist() == [A, B]
    ranked = rank_candidates([-1.0, -2.0], [[BOS, A], [BOS, C]], top.indices.tolist(), top.values.tolist(),
                             counts, (0.5, 0.5), 0.4)
    lm_a, lm_b = math.log(0.45), math.log(0.33)
    # draft 0 ends in "a": p2(a) = 1/3, p2(b) = 2/3, (BOS, a) unseen by order 3
    # draft 1 ends in "c": p2(a) = 1, p2(b) = 0 -> (1, b) has no n-gram support
    expected = [
        (0, B, -1.0 + 0.4 * lm_b + 0.6 * math.log(0.5 * 2 / 3), True),   # -2.1027
        (0, A, -1.0 + 0.4 * lm_a + 0.6 * math.log(0.5 * 1 / 3), True),   # -2.3945
        (1, A, -2.0 + 0.4 * lm_a + 0.6 * math.log(0.5 * 1.0), True),     # -2.7353
        (1, B, -2.0 + 0.4 * lm_b, False),                                 # -2.4435, but unsupported: last
    ]
    assert [(c.parent, c.token, c.supported) for c in ranked] == [(p, t, s) for p, t, _, s in expected]
    for candidate, (_, token, score, _) in zip(ranked, expected):
        assert candidate.score == pytest.approx(score, abs=1e-6)
        assert candidate.lm_logprob == pytest.approx(lm_a if token == A else lm_b, abs=1e-6)
    # λ = 1 (no counts): the LM alone, every candidate supported
    plain = rank_candidates([-1.0, -2.0], [[A], [C]], [A, B], [lm_a, lm_b], None, (0.5, 0.5), 1.0)
    assert [(c.parent, c.token) for c in plain] == [(0, A), (0, B), (1, A), (1, B)]
    assert plain[1].score == pytest.approx(-1.0 + lm_b) and all(c.supported for c in plain)


def test_superposition_is_the_weighted_sum_of_embedding_rows(tiny):
    rows = tiny.input_embeddings(torch.tensor([5, 61]))
    assert torch.equal(superposition(tiny, [5], [-3.7])[0, 0], rows[0])  # one draft: E[x] exactly
    gamma = torch.softmax(torch.tensor([-1.0, -2.0]), dim=0)
    torch.testing.assert_close(superposition(tiny, [5, 61], [-1.0, -2.0])[0, 0], gamma[0] * rows[0] + gamma[1] * rows[1])


def test_the_decoder_feeds_the_superposition_and_keeps_the_best_k(tiny):
    """k = 2, λ = 1, 2 tokens, rebuilt step by step: the prefill's top-2 start the drafts, their
    softmax-weighted embeddings are fed, and the best 2 of the 4 extensions are returned."""
    config = SuperposedConfig(lm_weight=1.0, max_tokens=2, ignore_eos=True)
    result = superposed_decode(tiny, PROMPT, 2, config=config)
    cache, out = tiny.prefill(PROMPT)
    first = torch.topk(torch.log_softmax(out.logits[0], dim=-1), 2)
    mixed = superposition(tiny, first.indices.tolist(), first.values.tolist())
    second = torch.topk(torch.log_softmax(tiny.forward_embeddings(cache, mixed).logits[0], dim=-1), 2)
    candidates = sorted(((s1 + s2, [t1, t2]) for t1, s1 in zip(first.indices.tolist(), first.values.tolist())
                         for t2, s2 in zip(second.indices.tolist(), second.values.tolist())), reverse=True)[:2]
    assert [c.token_ids for c in result.completions] == [ids for _, ids in candidates]
    assert [c.score for c in result.completions] == pytest.approx([score for score, _ in candidates], abs=1e-5)
    assert result.completions[0].logprobs[1] == pytest.approx(candidates[0][0] - result.completions[0].logprobs[0])
    assert all(c.finish_reason == "length" for c in result.completions)


def test_an_ended_draft_keeps_its_place_and_the_live_one_decodes_alone(tiny):
    """The prefill's best token is made a stop token: that one-token draft ends at once, keeps its
    score (every extension of the other scores lower) and the other draft, now fed alone (γ = 1,
    its own embedding), continues as greedy decoding from the prompt + the second-best token."""
    _, out = tiny.prefill(PROMPT)
    first = torch.topk(torch.log_softmax(out.logits[0], dim=-1), 2)
    best, second = first.indices.tolist()
    config = SuperposedConfig(lm_weight=1.0, max_tokens=3, stop_token_ids=[best], ignore_eos=True)
    ended, live = superposed_decode(tiny, PROMPT, 2, config=config).completions
    assert (ended.token_ids, ended.finish_reason, ended.stop_reason) == ([best], "stop", best)
    assert ended.score == pytest.approx(first.values[0].item())
    cache, out = tiny.prefill(PROMPT + [second])
    greedy = [second]
    for _ in range(2):
        greedy.append(int(out.logits[0].argmax()))
        out = tiny.forward(cache, [[greedy[-1]]])
    assert live.token_ids == greedy and live.finish_reason == "length"


@pytest.mark.parametrize("k", [1, 4])
def test_one_forward_per_step_whatever_k(tiny, k):
    tokens = 5
    result = superposed_decode(tiny, PROMPT, k, config=SuperposedConfig(max_tokens=tokens, ignore_eos=True))
    cost = result.cost
    assert len(result.completions) == k and all(len(c.token_ids) == tokens for c in result.completions)
    assert cost.model_calls == tokens  # the prefill, then tokens − 1 forwards of the one row
    assert cost.prompt_tokens_computed == len(PROMPT) and cost.target_steps == tokens
    assert cost.generated_tokens == k * tokens
    flops = sum(tiny.flops_per_token(position + 1) for position in range(len(PROMPT) + tokens - 1))
    assert cost.flops == pytest.approx(flops)
    scores = [c.score for c in result.completions]
    assert scores == sorted(scores, reverse=True)
    assert len({tuple(c.token_ids) for c in result.completions}) == k  # distinct drafts


def test_ngrams_from_a_corpus_file_and_a_list_agree(tiny, tmp_path):
    texts = ["the cat sat on the mat", "a dog ran in the park"]
    path = tmp_path / "corpus.txt"
    path.write_text("\n".join(texts) + "\n\n", encoding="utf-8")
    config = SuperposedConfig(max_tokens=4, ignore_eos=True)
    from_file = superposed_decode(tiny, PROMPT, 3, corpus=path, config=config)
    from_list = superposed_decode(tiny, PROMPT, 3, corpus=texts, config=config)
    assert [c.token_ids for c in from_file.completions] == [c.token_ids for c in from_list.completions]
    assert [c.score for c in from_file.completions] == [c.score for c in from_list.completions]


@pytest.mark.parametrize(("fields", "match"), [
    ({"lm_weight": 1.5}, r"lm_weight=1.5 is out of range: must be a number in \[0, 1\]"),
    ({"lm_weight": -0.1}, r"lm_weight=-0.1 is out of range"),
    ({"order_weights": ()}, r"order_weights=\(\) is out of range"),
    ({"order_weights": (0.0, 0.0)}, r"at least one > 0"),
    ({"order_weights": (1.0, -1.0)}, r"order_weights=\(1.0, -1.0\) is out of range"),
    ({"order_weights": (1.0, math.inf)}, r"finite numbers >= 0"),
    ({"max_tokens": 0}, r"max_tokens"),
])
def test_bad_settings_are_refused_naming_the_field(fields, match):
    with pytest.raises(ValueError, match=match):
        SuperposedConfig(**fields)


def test_bad_calls_are_refused(tiny, tmp_path):
    for k in (0, True, 2.0, tiny.vocab_size + 1):
        with pytest.raises(ValueError, match=rf"k={k!r} is out of range: must be an int in \[1, 49152\]"):
            superposed_decode(tiny, PROMPT, k)
    kgram = KGramModel.train(["ab", "ba"], k=2)
    with pytest.raises(ValueError, match=r"model \(KGramModel\) does not take them \(EmbeddingInput"):
        superposed_decode(kgram, "ab", 2)
    with pytest.raises(ValueError, match=r"corpus is a str: pass pathlib.Path"):
        superposed_decode(tiny, PROMPT, 2, corpus="the cat")
    with pytest.raises(ValueError, match=r"corpus is given but lm_weight=1"):
        superposed_decode(tiny, PROMPT, 2, corpus=["the cat"], config=SuperposedConfig(lm_weight=1.0))
    with pytest.raises(ValueError, match=r"lm_weight=0.5 < 1 needs n-gram counts"):
        superposed_decode(tiny, PROMPT, 2, config=SuperposedConfig(lm_weight=0.5, prompt_ngrams=False))
    with pytest.raises(ValueError, match=r"corpus file .*missing.txt' does not exist"):
        superposed_decode(tiny, PROMPT, 2, corpus=tmp_path / "missing.txt")
    with pytest.raises(ValueError, match=r"corpus\[1\] is int"):
        superposed_decode(tiny, PROMPT, 2, corpus=["the cat", 3])
    with pytest.raises(ValueError, match=r"orders=\(1, 2\) is out of range"):
        NgramCounts((1, 2))


@pytest.mark.slow
def test_one_draft_without_ngrams_is_greedy_decoding_on_the_embedded_model(model):
    from metagen.decoding import generate
    from metagen.sampling import SamplingParams

    prompt = "The history of the printing press begins in"
    greedy = generate(model, prompt, SamplingParams(temperature=0, max_tokens=12), chat=False).completions[0]
    one = superposed_decode(model, prompt, 1, chat=False, config=SuperposedConfig(lm_weight=1.0, max_tokens=12))
    assert one.completions[0].token_ids == greedy.token_ids and one.completions[0].text == greedy.text
    assert one.completions[0].logprobs == pytest.approx(greedy.logprobs, abs=1e-5)
    assert one.cost.model_calls == len(greedy.token_ids)
