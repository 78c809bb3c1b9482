"""Cache operations on the real model give the logits of recomputing from scratch."""

import pytest
import torch

pytestmark = pytest.mark.slow

PROMPT = [1, 504, 3458, 282, 4649, 314, 7306, 30, 378, 5248, 282, 2997, 314, 10456, 28, 2045]
ATOL = 2e-4


def fresh_logits(model, ids, mode="last"):
    cache = model.new_cache(1)
    return model.forward(cache, [ids], logits=mode).logits[0]


def test_fork_then_append_matches_recompute(model_fp32):
    cache, _ = model_fp32.prefill(PROMPT, batch_size=3)
    continuations = [[11], [812], [45]]
    out = model_fp32.forward(cache, continuations)
    for row, extra in enumerate(continuations):
        torch.testing.assert_close(out.logits[row], fresh_logits(model_fp32, PROMPT + extra), atol=ATOL, rtol=0)


def test_truncate_then_append_matches_recompute(model_fp32):
    cache = model_fp32.new_cache(1)
    model_fp32.forward(cache, [PROMPT + [99, 100, 101]])
    cache.truncate(0, len(PROMPT))
    out = model_fp32.forward(cache, [[7]])
    torch.testing.assert_close(out.logits[0], fresh_logits(model_fp32, PROMPT + [7]), atol=ATOL, rtol=0)


def test_multi_token_append_matches_one_by_one(model_fp32):
    draft = [260, 1345, 42, 5]
    cache, _ = model_fp32.prefill(PROMPT)
    block = model_fp32.forward(cache, [draft], logits="all").logits[0]  # (4, V)
    reference = fresh_logits(model_fp32, PROMPT + draft, mode="all")[len(PROMPT):]
    torch.testing.assert_close(block, reference, atol=ATOL, rtol=0)
    step_cache, _ = model_fp32.prefill(PROMPT)
    for i, token in enumerate(draft):
        step = model_fp32.forward(step_cache, [[token]]).logits[0]
        torch.testing.assert_close(step, block[i], atol=ATOL, rtol=0)


def test_rows_of_different_lengths_in_one_batch(model_fp32):
    prompts = [PROMPT[:5], PROMPT, PROMPT[:9]]
    cache = model_fp32.new_cache(3)
    first = model_fp32.forward(cache, prompts)
    nexts = [[17], [3, 4], [250]]  # ragged again, rows still of different lengths
    second = model_fp32.forward(cache, nexts)
    for row, prompt in enumerate(prompts):
        torch.testing.assert_close(first.logits[row], fresh_logits(model_fp32, prompt), atol=ATOL, rtol=0)
        torch.testing.assert_close(
            second.logits[row], fresh_logits(model_fp32, prompt + nexts[row]), atol=ATOL, rtol=0
        )


def test_hidden_states_come_with_the_logits(model_fp32):
    cache = model_fp32.new_cache(1)
    out = model_fp32.forward(cache, [PROMPT], logits="all", hidden=True)
    assert out.hidden.shape == (1, len(PROMPT), model_fp32.config.hidden_size)
    assert out.hidden.dtype == torch.float32


def test_bad_inputs_raise_clear_errors(model_fp32):
    cache = model_fp32.new_cache(2)
    with pytest.raises(ValueError, match="row 1 has no new tokens"):
        model_fp32.forward(cache, [[1], []])
    with pytest.raises(ValueError, match="token id 49152"):
        model_fp32.forward(cache, [[1], [49152]])
    with pytest.raises(ValueError, match="cache has 2 rows"):
        model_fp32.forward(cache, [[1]])
    with pytest.raises(ValueError, match="context of 8192"):
        model_fp32.forward(cache, [[1] * 8193, [1]])
    assert cache.lengths == [0, 0]


def test_snapshots_restore_only_into_their_own_cache_on_the_model(model_fp32):
    """Regression: another cache's snapshot was restored, and the next forward read slot ids
    of the wrong pools: logits of neither prompt."""
    first, _ = model_fp32.prefill(PROMPT)
    second, _ = model_fp32.prefill(PROMPT[:4])
    snapshot = first.snapshot(0)
    with pytest.raises(ValueError, match="made by another cache"):
        second.restore([snapshot])
    assert second.lengths == [4]
    second.release(second.snapshot(0))
    first.truncate(0, 0)
    first.restore([snapshot])
    out = model_fp32.forward(first, [[7]])
    torch.testing.assert_close(out.logits[0], fresh_logits(model_fp32, PROMPT + [7]), atol=ATOL, rtol=0)


def test_batch_sizes_and_token_ids_are_checked_before_any_work(model_fp32):
    """Regression: prefill(ids, batch_size=0) returned a 1-row cache; float ids were truncated."""
    with pytest.raises(ValueError, match=r"batch_size=0 is out of range: must be >= 1"):
        model_fp32.prefill(PROMPT, batch_size=0)
    with pytest.raises(TypeError, match="batch_size must be an int, got 1.5"):
        model_fp32.new_cache(1.5)
    cache = model_fp32.new_cache(1)
    with pytest.raises(TypeError, match=r"tokens\[0\] must hold integer token ids, got torch.float32"):
        model_fp32.forward(cache, [[1.7]])
    with pytest.raises(TypeError, match="tokens must hold integer token ids, got torch.float32"):
        model_fp32.forward(cache, torch.tensor([[1.0]]))
    assert cache.lengths == [0]
