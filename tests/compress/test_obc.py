"""OBS / OBC against brute force: each greedy step is the best single coordinate given the ones
already fixed, and the weights are the exact constrained optimum of the quadratic."""

import pytest
import torch

from metagen.compress.magnitude import magnitude_mask
from metagen.compress.obc import obc_prune, obc_quantize
from metagen.compress.quantize import Grid, fit_grid


def _problem(seed: int, rows: int = 3, k: int = 8, n: int = 40):
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(rows, k, generator=generator, dtype=torch.float64)
    x = torch.randn(n, k, generator=generator, dtype=torch.float64) @ torch.randn(k, k, generator=generator,
                                                                                    dtype=torch.float64)
    return weight, 2.0 * x.t() @ x


def _optimum(w_star, hessian, fixed: dict[int, float]):
    """argmin (w − w*)ᵀ H (w − w*) s.t. w_i = fixed[i], by solving the reduced system; and its loss."""
    k = w_star.shape[0]
    held = sorted(fixed)
    free = [i for i in range(k) if i not in fixed]
    error = torch.zeros(k, dtype=torch.float64)
    error[held] = torch.tensor([fixed[i] for i in held], dtype=torch.float64) - w_star[held]
    if free:
        error[free] = -torch.linalg.solve(hessian[free][:, free], hessian[free][:, held] @ error[held])
    return w_star + error, float(error @ hessian @ error)


def _brute_force(w_star, hessian, steps, value_of):
    fixed: dict[int, float] = {}
    current = w_star.clone()
    for _ in range(steps):
        best = None
        for p in range(w_star.shape[0]):
            if p in fixed:
                continue
            candidate = fixed | {p: value_of(p, current[p])}
            weights, loss = _optimum(w_star, hessian, candidate)
            if best is None or loss < best[0]:
                best = (loss, candidate, weights)
        _, fixed, current = best
    return current


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("count", [1, 3, 6])
def test_obc_pruning_equals_brute_force(seed, count):
    weight, hessian = _problem(seed)
    got = obc_prune(weight, hessian, count)
    for row in range(weight.shape[0]):
        expected = _brute_force(weight[row], hessian, count, lambda p, value: 0.0)
        assert torch.allclose(got[row].double(), expected, atol=1e-4)
        assert int((got[row] == 0).sum()) == count


@pytest.mark.parametrize("seed", range(4))
def test_obc_quantization_equals_brute_force(seed):
    weight, hessian = _problem(seed)
    grid = fit_grid(weight.float(), 3, 8, clip=False)
    got = obc_quantize(weight, hessian, grid)
    assert torch.allclose(grid.quantize(got), got)  # every weight on its grid
    for row in range(weight.shape[0]):
        row_grid = Grid(grid.scale[row:row + 1], grid.zero[row:row + 1], grid.maxq, grid.center, grid.group_size)

        def value_of(p, value):
            return float(row_grid.quantize(torch.full((1, 8), float(value)))[0, p])

        expected = _brute_force(weight[row], hessian, weight.shape[1], value_of)
        assert torch.allclose(got[row].double(), expected, atol=1e-4)


def test_obs_with_identity_hessian_is_magnitude_pruning():
    weight = torch.randn(6, 16, generator=torch.Generator().manual_seed(5))
    got = obc_prune(weight, torch.eye(16), 7)
    expected = torch.stack([row.masked_fill(magnitude_mask(row[None], 7 / 16)[0], 0.0) for row in weight])
    assert torch.equal(got, expected)


def test_obc_refuses_a_bad_count():
    weight, hessian = _problem(0)
    with pytest.raises(ValueError, match="count=9"):
        obc_prune(weight, hessian, 9)
