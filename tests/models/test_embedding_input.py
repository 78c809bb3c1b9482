"""`DecoderModel.forward_embeddings`: input vectors fed where token embeddings go. Feeding the
table's own rows E[x] must equal feeding x exactly (logits, hidden states and the cache the next
forward reads), on the fused decode path and the general path."""

import pytest
import torch

from metagen.models import load
from metagen.models.base import EmbeddingInput
from metagen.models.decoder import DecoderModel
from metagen.models.kgram import KGramModel
from tests.contracts import violations

PROMPT = [1, 17, 230, 4055, 9, 88]


@pytest.fixture(scope="module")
def tiny(tiny_checkpoint):
    return load(tiny_checkpoint, dtype="fp32", use_cache=False)


def test_the_native_decoder_claims_embedding_input_and_the_kgram_model_does_not(tiny):
    assert isinstance(tiny, EmbeddingInput) and violations(DecoderModel, EmbeddingInput) == []
    assert not isinstance(KGramModel.train(["ab"], k=2), EmbeddingInput)


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("new", [[[5]], [[5, 61, 700]]])
def test_feeding_the_embedding_rows_equals_feeding_the_tokens(tiny, fused, new):
    tiny.use_fused = fused and tiny.kernels is not None
    try:
        by_ids, by_rows = tiny.prefill(PROMPT)[0], tiny.prefill(PROMPT)[0]
        ids = torch.tensor(new)
        rows = tiny.input_embeddings(ids)  # (1, T, H)
        kept = rows.clone()
        expected = tiny.forward(by_ids, ids, logits="all", hidden=True)
        got = tiny.forward_embeddings(by_rows, rows, logits="all", hidden=True)
        assert torch.equal(got.logits, expected.logits) and torch.equal(got.hidden, expected.hidden)
        assert got.num_new == expected.num_new and torch.equal(rows, kept)  # the input is not written to
        # the cache holds the same keys and values: the next token's logits agree exactly
        after_ids, after_rows = tiny.forward(by_ids, [[42]]), tiny.forward(by_rows, [[42]])
        assert torch.equal(after_ids.logits, after_rows.logits)
    finally:
        tiny.use_fused = tiny.kernels is not None


def test_a_mixture_of_rows_is_a_different_input(tiny):
    """The path does not ignore its input: a superposition of two rows gives other logits than
    either row alone."""
    rows = tiny.input_embeddings(torch.tensor([5, 61]))  # (2, H)
    mixed = (0.5 * rows[0] + 0.5 * rows[1])[None, None]
    one = tiny.forward_embeddings(tiny.prefill(PROMPT)[0], rows[0][None, None]).logits
    both = tiny.forward_embeddings(tiny.prefill(PROMPT)[0], mixed).logits
    assert not torch.allclose(one, both)


@pytest.mark.parametrize(("embeddings", "match"), [
    (torch.zeros(1, 1, 7), r"shape \(1, 1, 7\).*hidden size 32"),
    (torch.zeros(2, 1, 32), r"shape \(2, 1, 32\).*1 cache rows"),
    (torch.zeros(1, 0, 32), r">= 1 positions"),
    (torch.zeros(1, 32), r"float tensor \(batch, length, hidden\), got \(1, 32\)"),
    (torch.zeros(1, 1, 32, dtype=torch.long), r"float tensor"),
    (torch.full((1, 1, 32), float("nan")), r"NaN or infinite"),
])
def test_bad_embeddings_are_refused_before_the_cache_changes(tiny, embeddings, match):
    cache = tiny.prefill(PROMPT)[0]
    with pytest.raises(ValueError, match=match):
        tiny.forward_embeddings(cache, embeddings)
    assert cache.lengths == [len(PROMPT)]
