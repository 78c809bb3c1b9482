"""pass@k: the chance that at least one of k samples is correct, estimated from n >= k samples.
The one implementation (`metagen.theory.pass_at_k`, reported by `metagen.eval`);
standard library only."""

from __future__ import annotations


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased estimate of pass@k from n samples of which c are correct (Chen et al. 2021):

        pass@k = 1 − C(n − c, k) / C(n, k) = 1 − Π_{i = n − c + 1}^{n} (1 − k / i)

    computed as the product, which never forms the huge binomials. O(c).
    """
    if not 0 <= c <= n:
        raise ValueError(f"c={c} is out of range: must be in [0, n={n}]")
    if not 1 <= k <= n:
        raise ValueError(f"k={k} is out of range: must be in [1, n={n}]")
    if n - c < k:
        return 1.0
    product = 1.0
    for i in range(n - c + 1, n + 1):
        product *= 1.0 - k / i
    return 1.0 - product
