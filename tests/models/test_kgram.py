"""The add-constant k-gram model: worked numbers, the LanguageModel contract, and sampling
through `metagen.decoding.generate` against the closed-form distributions."""

import itertools
import math

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from metagen.decoding import generate
from metagen.sampling import SamplingParams
from metagen.models.kgram import KGramModel, SymbolTokenizer


@pytest.fixture
def bigram():
    # char bigram on "ab", "b" with c = 1; vocabulary </s>=0, a=1, b=2
    return KGramModel.train(["ab", "b"], k=2, c=1.0, level="char", max_context=16)


def test_seed_add_constant_example():
    # dataset {I drink coffee $}, X = {I, food, coffee, eat, drink, tea, $}, c = 1: p = (count + 1)/11
    model = KGramModel.train(["I drink coffee"], k=1, c=1.0, level="word", extra_symbols=["food", "eat", "tea"])
    probabilities = dict(zip(model.tokenizer.pieces, model.conditional([])))
    expected = {"I": 2, "food": 1, "coffee": 2, "eat": 1, "drink": 2, "tea": 1, "</s>": 2}
    assert probabilities == pytest.approx({piece: count / 11 for piece, count in expected.items()}, abs=1e-15)


def test_bigram_conditionals_by_hand(bigram):
    assert bigram.tokenizer.pieces == ("</s>", "a", "b")
    # start context: a 1, b 1 of 2 -> (0 + 1, 1 + 1, 1 + 1) / (2 + 3)
    assert bigram.conditional([]) == pytest.approx([0.2, 0.4, 0.4])
    assert bigram.conditional([1]) == pytest.approx([0.25, 0.25, 0.5])  # after a: b once
    assert bigram.conditional([1, 2]) == pytest.approx([0.6, 0.2, 0.2])  # after b: EOS twice
    assert bigram.conditional([0]) == pytest.approx([1 / 3] * 3)  # unseen context: uniform
    assert bigram.sequence_logprob([], [1, 2, 0]) == pytest.approx(math.log(0.4 * 0.5 * 0.6))


def test_sequence_probabilities_sum_to_one(bigram):
    total = 0.0
    for length in range(1, 5):  # sequences ending at their first EOS, up to 4 tokens
        for body in itertools.product([1, 2], repeat=length - 1):
            total += math.exp(bigram.sequence_logprob([], [*body, 0]))
    tails = sum(math.exp(bigram.sequence_logprob([], body)) for body in itertools.product([1, 2], repeat=4))
    assert total + tails == pytest.approx(1.0, abs=1e-12)


def test_forward_logits_are_the_log_conditionals(bigram):
    cache = bigram.new_cache(2)
    out = bigram.forward(cache, [[1, 2], [2]], logits="all")  # ragged rows
    assert out.logits.shape == (2, 2, 3) and out.num_new == [2, 1] and out.logits.dtype == torch.float32
    assert torch.softmax(out.logits[0, 0].double(), -1).numpy() == pytest.approx(bigram.conditional([1]), abs=1e-6)
    assert torch.softmax(out.logits[0, 1].double(), -1).numpy() == pytest.approx(bigram.conditional([1, 2]), abs=1e-6)
    assert torch.softmax(out.logits[1, 0].double(), -1).numpy() == pytest.approx(bigram.conditional([2]), abs=1e-6)
    last = bigram.forward(cache, torch.tensor([[0], [1]]))
    assert last.logits.shape == (2, 3) and cache.lengths == [3, 2]
    assert bigram.forward(cache, [[2], [2]], logits="none").logits is None


def test_cache_operations_and_errors(bigram):
    cache = bigram.new_cache(1)
    bigram.forward(cache, [[1, 2]])
    rows = cache.fork(0, 2)
    assert rows == [1, 2] and cache.lengths == [2, 2, 2]
    cache.truncate(1, 1)
    cache.select([1, 0])
    assert cache.rows == [[1], [1, 2]]
    with pytest.raises(ValueError):
        bigram.forward(cache, [[3], [1]])  # id outside the vocabulary
    with pytest.raises(ValueError):
        bigram.forward(cache, [[], [1]])  # empty row
    with pytest.raises(ValueError):
        bigram.forward(cache, [[1] * 16, [1]])  # past the context
    assert cache.rows == [[1], [1, 2]]  # no error changed the cache
    with pytest.raises(ValueError, match=r"indices\[0\]=2 is out of range"):
        cache.select([2])
    with pytest.raises(TypeError, match=r"tokens\[0\]\[0\] must be an int, got 1.7"):
        bigram.forward(cache, [[1.7], [1]])  # was truncated to token 1
    with pytest.raises(TypeError, match=r"tokens\[0\]\[0\] must be an int, got 1.0"):
        bigram.forward(cache, torch.tensor([[1.0], [2.5]]))
    assert cache.rows == [[1], [1, 2]]


def test_tokenizers():
    chars = SymbolTokenizer(["a", "b"], level="char")
    assert chars.encode("abba") == [1, 2, 2, 1] and chars.decode([1, 2, 0]) == "ab</s>"
    assert chars.decode([1, 2, 0], skip_special_tokens=True) == "ab"
    words = KGramModel.train(["the cat sat", "the dog sat"], k=3, level="word").tokenizer
    assert words.decode(words.encode("the dog sat")) == "the dog sat"
    with pytest.raises(ValueError, match="not in the vocabulary"):
        words.encode("the bird")


def test_generated_first_tokens_follow_the_conditional(bigram, one_thread):
    result = generate(bigram, "a", SamplingParams(n=3000, max_tokens=1, seed=0))
    first = np.bincount([c.token_ids[0] for c in result.completions], minlength=3)
    assert chisquare(first, bigram.conditional([1]) * 3000).pvalue > 1e-3


def test_generated_sequences_follow_the_model(one_thread):
    # word trigram: every completion of at most 3 tokens against its exact probability
    model = KGramModel.train(["x y", "y y x", "x x", "y"], k=3, c=0.5, level="word")
    prompt = model.tokenizer.encode("x")
    result = generate(model, "x", SamplingParams(n=4000, max_tokens=3, seed=1))
    counts: dict[tuple[int, ...], int] = {}
    for completion in result.completions:
        key = tuple(completion.token_ids)
        counts[key] = counts.get(key, 0) + 1
    sequences = [(*body, 0) for length in range(3) for body in itertools.product([1, 2], repeat=length)]
    sequences += list(itertools.product([1, 2], repeat=3))
    probabilities = np.array([math.exp(model.sequence_logprob(prompt, s)) for s in sequences])
    assert probabilities.sum() == pytest.approx(1.0, abs=1e-12)
    assert set(counts) <= set(sequences)
    observed = np.array([counts.get(s, 0) for s in sequences])
    assert chisquare(observed, probabilities * 4000).pvalue > 1e-3
    for completion in result.completions[:20]:  # the text the generated words add after the prompt
        full = model.tokenizer.decode(prompt + completion.token_ids, skip_special_tokens=True)
        assert completion.text == full[len(model.tokenizer.decode(prompt)) :]
