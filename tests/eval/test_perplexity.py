import math

import pytest
import torch

from metagen.eval.perplexity import perplexity, windows
from metagen.models import load


def test_windows_score_every_token_once():
    assert windows(10, 4, 4) == [(0, 4, 1), (4, 8, 4), (8, 10, 8)]
    assert windows(10, 4, 2) == [(0, 4, 1), (2, 6, 4), (4, 8, 6), (6, 10, 8)]
    for length, window, stride in [(100, 16, 5), (17, 16, 16), (2, 8, 3)]:
        spans = windows(length, window, stride)
        scored = [t for _, end, first in spans for t in range(first, end)]
        assert scored == list(range(1, length))  # each token after the first, once, in order
        assert all(end - begin <= window for begin, end, _ in spans)


def test_windows_refuse_bad_values():
    with pytest.raises(ValueError, match="stride=5"):
        windows(10, 4, 5)
    with pytest.raises(ValueError, match="window=1"):
        windows(10, 1, 1)
    with pytest.raises(ValueError, match="at least 2"):
        windows(1, 4, 4)


@pytest.fixture(scope="module")
def tiny(tiny_checkpoint):
    return load(tiny_checkpoint, "fp32", use_cache=False)


def _nll_by_hand(model, ids, begin, end, first):
    cache = model.new_cache(1)
    logprobs = torch.log_softmax(model.forward(cache, [ids[begin:end]], logits="all").logits[0].double(), -1)
    return -sum(float(logprobs[t - begin - 1, ids[t]]) for t in range(first, end))


@pytest.mark.parametrize("window,stride", [(40, 40), (16, 16), (16, 5)])
def test_perplexity_equals_the_hand_computation(tiny, window, stride):
    ids = torch.randint(0, 49152, (40,), generator=torch.Generator().manual_seed(0)).tolist()
    result = perplexity(tiny, ids, window=window, stride=stride, batch_size=2)
    nll = sum(_nll_by_hand(tiny, ids, *span) for span in windows(40, window, stride))
    assert result.tokens == 39
    assert math.isclose(result.nll, nll, rel_tol=1e-5)
    assert math.isclose(result.perplexity, math.exp(nll / 39), rel_tol=1e-5)
