import pytest
import torch

from metagen.compress.magnitude import magnitude_mask, n_m_mask, prune_magnitude


def test_unstructured_prunes_the_smallest():
    weight = torch.tensor([[0.1, -3.0, 0.5, 2.0], [-0.2, 0.05, 4.0, -1.0]])
    mask = magnitude_mask(weight, 0.5)
    assert mask.tolist() == [[True, False, True, False], [True, True, False, False]]


@pytest.mark.parametrize("n,m", [(2, 4), (1, 4), (4, 8)])
def test_n_m_masks_are_exact(n, m):
    weight = torch.randn(32, 64, generator=torch.Generator().manual_seed(0))
    pruned = prune_magnitude(weight, n_m=(n, m))
    nonzero = (pruned != 0).view(32, 64 // m, m).sum(-1)
    assert (nonzero == n).all()
    # the kept ones are the largest of their run
    runs = weight.abs().view(32, 64 // m, m)
    kept = pruned.abs().view(32, 64 // m, m)
    assert torch.equal(kept.sort(-1, descending=True).values[..., :n], runs.sort(-1, descending=True).values[..., :n])


def test_refusals_name_the_parameter():
    with pytest.raises(ValueError, match="sparsity=1.0"):
        magnitude_mask(torch.zeros(2, 4), 1.0)
    with pytest.raises(ValueError, match="N:M = 4:2"):
        n_m_mask(torch.zeros(2, 4), 4, 2)
    with pytest.raises(ValueError, match="multiple of M=4"):
        n_m_mask(torch.zeros(2, 6), 2, 4)
