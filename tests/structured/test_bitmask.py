"""Token bitmasks: the fused kernel equals the torch ops exactly; the bit layout is llguidance's."""

import pytest
import torch

from metagen.models.kernels import fused_kernels
from metagen.structured.bitmask import (
    apply_token_bitmask,
    apply_token_bitmask_torch,
    bitmask_to_bool,
    bool_to_bitmask,
    words_for,
)

NEG_INF = float("-inf")


def _random_case(batch, vocab, words, seed):
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, vocab, generator=generator)
    logits[0, :3] = torch.tensor([float("nan"), float("inf"), NEG_INF])
    mask = torch.randint(-(2**31), 2**31, (batch, words), generator=generator, dtype=torch.int64).to(torch.int32)
    mask[:, 0] = -1  # a word of ones (copied whole)
    if words > 2:
        mask[:, 1] = 0  # a word of zeros (filled whole)
    return logits, mask


def test_bit_layout_is_little_endian_within_words():
    # Token v is bit v % 32 of word v // 32: tokens 0, 33 and 63 allowed.
    mask = torch.tensor([[1, (1 << 1) | (-(2**31))]], dtype=torch.int32)
    allowed = bitmask_to_bool(mask, 64)
    assert allowed.nonzero()[:, 1].tolist() == [0, 33, 63]
    assert torch.equal(bool_to_bitmask(allowed), mask)
    out = apply_token_bitmask_torch(torch.zeros(1, 64), mask)
    assert (out == 0).nonzero()[:, 1].tolist() == [0, 33, 63] and (out[0] == NEG_INF).sum() == 61


@pytest.mark.parametrize("vocab, words", [(49152, 1536), (100, 4), (70, 3), (100, 2), (31, 1)])
def test_torch_version_masks_and_leaves_input_untouched(vocab, words):
    logits, mask = _random_case(3, vocab, words, seed=vocab)
    before = logits.clone()
    out = apply_token_bitmask_torch(logits, mask)
    allowed = bitmask_to_bool(mask, vocab)
    assert torch.equal(logits.isnan(), before.isnan()) and torch.equal(logits.nan_to_num(), before.nan_to_num())
    assert torch.equal(out[allowed].nan_to_num(), logits[allowed].nan_to_num())
    assert (out[~allowed] == NEG_INF).all()  # disallowed NaN / +inf become -inf too: a hard ban
    if vocab > 32 * words:
        assert (out[:, 32 * words:] == NEG_INF).all()


@pytest.mark.skipif(fused_kernels() is None, reason="fused kernels could not be built here")
@pytest.mark.parametrize("batch, vocab, words", [(1, 49152, 1536), (16, 49152, 1536), (2, 49153, 1537),
                                                 (3, 100, 4), (2, 70, 3), (2, 100, 2), (1, 5, 1)])
def test_kernel_equals_torch_version_exactly(batch, vocab, words):
    logits, mask = _random_case(batch, vocab, words, seed=batch * vocab)
    before = logits.clone()
    kernel = fused_kernels().apply_token_bitmask(logits, mask)
    reference = apply_token_bitmask_torch(logits, mask)
    assert torch.equal(kernel.isnan(), reference.isnan())
    assert torch.equal(kernel.nan_to_num(), reference.nan_to_num())  # same values, same infinities
    assert torch.equal(logits.nan_to_num(), before.nan_to_num())  # input untouched
    assert torch.equal(apply_token_bitmask(logits, mask).nan_to_num(), reference.nan_to_num())


def test_words_and_errors():
    assert words_for(49152) == 1536 and words_for(49153) == 1537 and words_for(1) == 1
    with pytest.raises(ValueError, match="int32"):
        apply_token_bitmask(torch.zeros(1, 32), torch.zeros(1, 1, dtype=torch.int64))
    with pytest.raises(ValueError, match="same B"):
        apply_token_bitmask(torch.zeros(2, 32), torch.zeros(1, 1, dtype=torch.int32))
