"""The numbers behind the theory figures, and the figures (matplotlib, imported only when drawing).

Four figures, each from a `*_data` function
returning plain lists (the CLI prints them with --json) and a `plot_*` function drawing them:

- win rate vs KL for best-of-n: n/(n + 1) against log n − (n − 1)/n (no ties, the continuous
  limit), the exact curves (bon_kl, bon_win_rate) of discrete (p, r), and the best win rate any
  policy reaches at each KL;
- best-of-n against the KL-regularized optimum π* ∝ p·exp(r/β) on the reward–KL plane;
- the tilt path T(q, p, α) on the probability simplex for p = (0.50, 0.30, 0.20),
  q = (0.22, 0.11, 0.67), with KL(π ‖ p) and cross-entropy H(π ‖ q) contours;
- best-of-N over m-token sequences at N = e^{mΔ} against the KL-Δ tilt as m grows
  (`bon_asymptotics`: the per-token KL between them goes to 0).

Win rate is linear in the policy: win-rate(π ‖ p) = E_{y∼π}[w(y)], w(y) = (F(y) + F⁻(y))/2 (the
mid-rank calibrated reward), so the largest win rate at a given KL is the KL-regularized optimum
for w (the tilt p·exp(w/β)/Z). Without ties w ∼ U[0, 1] under p and, with t = 1/β, that tilt has
density t·e^{tu}/(e^t − 1) on [0, 1]: win rate 1/(1 − e^{−t}) − 1/t, KL = t·win − log((e^t − 1)/t).
Every curve is O(n_max·K) (K outcomes).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from metagen.plotting import pyplot
from metagen.theory.bon_asymptotics import asymptotics_curve
from metagen.theory.best_of_n import bon_kl, bon_kl_bound, bon_pmf, bon_win_rate, kl_divergence, reward_cdf
from metagen.theory.tilt import kl_regularized_optimum, max_tilt_kl, tilt

EXAMPLE_P = (0.50, 0.30, 0.20)  # a three-outcome base policy and alignment distribution
EXAMPLE_Q = (0.22, 0.11, 0.67)
BETAS = np.geomspace(1e-3, 1e2, 120)  # KL-regularization strengths swept for the optimum's frontier
FILES = {"win_rate": "theory_bon_win_rate.png", "reward_kl": "theory_reward_kl.png",
         "tilt_simplex": "theory_tilt_simplex.png", "asymptotics": "theory_bon_asymptotics.png"}
ASYMPTOTIC_DELTAS = (0.05, 0.1, 0.2)  # per-token KL budgets Δ of the asymptotics figure
ASYMPTOTIC_LENGTHS = (1, 2, 5, 10, 20, 50, 100, 200, 400)  # sequence lengths m (N = e^{mΔ} <= e^80)


def policy_win_rate(policy, p, r) -> float:
    """win-rate(π ‖ p) = E_{y∼π} E_{z∼p}[1(r(y) > r(z)) + ½·1(r(y) = r(z))] = Σ_y π(y)(F(y) + F⁻(y))/2.
    policy, p, r: (K,). O(K log K)."""
    at_most, below = reward_cdf(p, r)
    return float(np.asarray(policy, dtype=np.float64) @ (0.5 * (at_most + below)))


def continuous_optimum(ts=np.geomspace(1e-2, 1e3, 120)) -> tuple[np.ndarray, np.ndarray]:
    """(KL, win rate) of the win-rate-optimal tilt without ties, t = 1/β (formulas above): (T,) each."""
    ts = np.asarray(ts, dtype=np.float64)
    win = 1.0 / -np.expm1(-ts) - 1.0 / ts
    log_normaliser = ts + np.log(-np.expm1(-ts)) - np.log(ts)  # log((e^t − 1)/t) without overflow
    return ts * win - log_normaliser, win


def win_rate_instances() -> list[tuple[str, np.ndarray, np.ndarray]]:
    """Discrete (name, p, r) instances of the win-rate figure: p = (1/2, 1/2), a flat p
    over K = 10 (on the no-ties curve while n ≪ K) and a Zipf p whose likeliest outcome has the
    top reward."""
    ranks = np.arange(1, 101)
    zipf = 1.0 / ranks
    return [
        ("p = (½, ½), r = (0, 1) (seed Example 1)", np.array([0.5, 0.5]), np.array([0.0, 1.0])),
        ("uniform p, K = 10, distinct r", np.full(10, 0.1), np.arange(10, dtype=np.float64)),
        ("Zipf p ∝ 1/k, K = 100, top reward on k = 1", zipf / zipf.sum(), -ranks.astype(np.float64)),
    ]


def win_rate_data(n_max: int) -> dict:
    """Best-of-n win rate vs KL for n = 1..n_max: the no-ties curve, the exact discrete curves and
    each curve's optimal frontier (the KL-regularized optimum for w = (F + F⁻)/2)."""
    ns = list(range(1, n_max + 1))
    instances = []
    for name, p, r in win_rate_instances():
        at_most, below = reward_cdf(p, r)
        mid_rank = 0.5 * (at_most + below)  # (K,) w(y): the win rate of y against p
        optima = [kl_regularized_optimum(p, mid_rank, beta) for beta in BETAS]
        instances.append({
            "name": name, "p": p.tolist(), "r": r.tolist(),
            "kl": [bon_kl(p, r, n) for n in ns], "win_rate": [bon_win_rate(p, r, n) for n in ns],
            "optimum": {"beta": BETAS.tolist(), "kl": [o.kl for o in optima],
                        "win_rate": [o.expected_reward for o in optima]},
        })
    kl, win = continuous_optimum()
    return {
        "n": ns, "bound_kl": [bon_kl_bound(n) for n in ns], "bound_win_rate": [n / (n + 1) for n in ns],
        "instances": instances, "continuous_optimum": {"kl": kl.tolist(), "win_rate": win.tolist()},
    }


def reward_kl_instance(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(p, r) of the reward–KL figure: p ∝ 1/k over K = 10, r ∼ N(0, 1) drawn with `seed` (few
    outcomes, so n·p(best) ≫ 1 within n ≤ 64 and the bound visibly overstates the KL)."""
    ranks = np.arange(1, 11)
    rewards = np.random.default_rng(seed).standard_normal(ranks.size)
    return (1.0 / ranks) / np.sum(1.0 / ranks), rewards


def reward_kl_data(n_max: int, seed: int = 0) -> dict:
    """Best-of-n's (KL, E[r]) for n = 1..n_max (exact and at the bound's KL) and the
    KL-regularized optimum's frontier over β."""
    p, r = reward_kl_instance(seed)
    ns = list(range(1, n_max + 1))
    optima = [kl_regularized_optimum(p, r, beta) for beta in BETAS]
    return {
        "p": p.tolist(), "r": r.tolist(), "seed": seed, "n": ns,
        "kl": [bon_kl(p, r, n) for n in ns], "bound_kl": [bon_kl_bound(n) for n in ns],
        "expected_reward": [float(bon_pmf(p, r, n) @ r) for n in ns],
        "optimum": {"beta": BETAS.tolist(), "kl": [o.kl for o in optima],
                    "expected_reward": [o.expected_reward for o in optima]},
    }


def tilt_data(n_max: int, p=EXAMPLE_P, q=EXAMPLE_Q) -> dict:
    """The tilt path T(q, p, α) for α in [0, 30] and best-of-n under r = log q at n = 1, 2, 4, ... ≤ n_max."""
    p, q = np.asarray(p, dtype=np.float64), np.asarray(q, dtype=np.float64)
    alphas = np.concatenate([[0.0], np.geomspace(1e-2, 30.0, 80)])
    path = [tilt(p, q, alpha) for alpha in alphas]
    ns = [2**k for k in range(int(math.log2(n_max)) + 1)]
    return {
        "p": p.tolist(), "q": q.tolist(), "alpha": alphas.tolist(), "path": [point.tolist() for point in path],
        "kl": [kl_divergence(point, p) for point in path], "kl_limit": max_tilt_kl(p, q),
        "best_of_n": {"n": ns, "policy": [bon_pmf(p, np.log(q), n).tolist() for n in ns]},
    }


def asymptotics_data(p=EXAMPLE_P, r=(0.0, 0.5, 1.0), deltas=ASYMPTOTIC_DELTAS,
                     lengths=ASYMPTOTIC_LENGTHS) -> dict:
    """Per Δ, `bon_asymptotics.asymptotics_curve` over `lengths`: N, KL(π_N^m ‖ φ_Δ^m)/m, the two
    rewards per token and best-of-N's KL(π_N^m ‖ p^m)/m. O(Σ m²) for three symbols."""
    curves = []
    for delta in deltas:
        points = asymptotics_curve(p, r, delta, lengths)
        curves.append({"delta": delta, "m": [pt.m for pt in points], "n": [pt.n for pt in points],
                       "kl_per_token": [pt.kl_per_token for pt in points],
                       "bon_reward": [pt.bon_reward for pt in points], "tilt_reward": points[0].tilt_reward,
                       "bon_kl_per_token": [pt.bon_kl_per_token for pt in points]})
    return {"p": list(p), "r": list(r), "curves": curves}


def plot_asymptotics(data: dict, out_dir) -> Path:
    """KL(π_N^m ‖ φ_Δ^m)/m and the reward per token against m (data from `asymptotics_data`)."""
    plt = pyplot()
    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 4.2))
    for curve, color in zip(data["curves"], ("tab:blue", "tab:orange", "tab:green")):
        label = f"Δ = {curve['delta']:g}"
        left.plot(curve["m"], curve["kl_per_token"], "o-", color=color, markersize=3, label=label)
        right.plot(curve["m"], curve["bon_reward"], "o-", color=color, markersize=3, label=f"best-of-e^(mΔ), {label}")
        right.axhline(curve["tilt_reward"], color=color, linestyle="--", linewidth=1)
    for axis in (left, right):
        axis.set_xscale("log")
        axis.set_xlabel("sequence length m (tokens)")
        axis.grid(True, alpha=0.3)
    left.set_ylabel("KL(best-of-N ‖ tilt) / m (nats per token)")
    left.set_title("Best-of-N at N = e^(mΔ) approaches the KL-Δ optimum", fontsize=10)
    left.legend(fontsize=8)
    right.set_ylabel("expected reward per token")
    right.set_title(f"Reward per token (dashed: the tilt), p = {tuple(data['p'])}", fontsize=10)
    right.legend(fontsize=7, loc="lower right")
    return _save(plt, figure, out_dir, "asymptotics")


def _save(plt, figure, out_dir, key: str) -> Path:
    path = Path(out_dir) / FILES[key]
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path


def _label_powers_of_two(axis, ns, xs, ys, color) -> None:
    for n, x, y in zip(ns, xs, ys):
        if n & (n - 1) == 0 and n > 1:
            axis.annotate(str(n), (x, y), textcoords="offset points", xytext=(3, -9), fontsize=7, color=color)


def _against_kl(axis, bound_kl, ylabel: str, title: str, legend_size: int) -> None:
    """Labels of a plot against KL(π ‖ p), x from 0 to just past best-of-n's largest bound."""
    axis.set_xlim(0, max(bound_kl) * 1.05 + 0.05)
    axis.set_xlabel("KL(π ‖ p) (nats)")
    axis.set_ylabel(ylabel)
    axis.set_title(title, fontsize=10)
    axis.grid(True, alpha=0.3)
    axis.legend(fontsize=legend_size, loc="lower right")


def plot_win_rate(data: dict, out_dir) -> Path:
    """Win rate vs KL (data from `win_rate_data`). Returns the PNG written."""
    plt = pyplot()
    figure, axis = plt.subplots(figsize=(7, 4.5))
    axis.plot(data["continuous_optimum"]["kl"], data["continuous_optimum"]["win_rate"], ":", color="gray",
              label="best win rate at that KL, no ties")
    axis.plot(data["bound_kl"], data["bound_win_rate"], "o-", color="black", markersize=3,
              label="best-of-n, no ties: n/(n+1) vs log n − (n−1)/n")
    _label_powers_of_two(axis, data["n"], data["bound_kl"], data["bound_win_rate"], "black")
    for instance, color in zip(data["instances"], ("tab:red", "tab:blue", "tab:green")):
        axis.plot(instance["kl"], instance["win_rate"], "o-", color=color, markersize=3,
                  label=f"best-of-n, {instance['name']}")
        axis.plot(instance["optimum"]["kl"], instance["optimum"]["win_rate"], "--", color=color, linewidth=1)
    axis.set_ylim(0.45, 1.0)
    _against_kl(axis, data["bound_kl"], "win rate against p",
                "Best-of-n: win rate vs KL (dashed: best win rate at that KL)", legend_size=7)
    return _save(plt, figure, out_dir, "win_rate")


def plot_reward_kl(data: dict, out_dir) -> Path:
    """Best-of-n and the KL-regularized optimum on the reward–KL plane (data from `reward_kl_data`)."""
    plt = pyplot()
    figure, axis = plt.subplots(figsize=(7, 4.5))
    axis.plot(data["optimum"]["kl"], data["optimum"]["expected_reward"], "-", color="black",
              label="KL-regularized optimum p·exp(r/β)/Z, β swept")
    axis.plot(data["kl"], data["expected_reward"], "o", color="tab:blue", markersize=3,
              label="best-of-n, exact KL")
    axis.plot(data["bound_kl"], data["expected_reward"], "o", color="tab:orange", markersize=3, fillstyle="none",
              label="best-of-n placed at log n − (n−1)/n")
    _label_powers_of_two(axis, data["n"], data["kl"], data["expected_reward"], "tab:blue")
    title = f"Reward vs KL, p ∝ 1/k over K = {len(data['p'])}, r ∼ N(0, 1) (seed {data['seed']})"
    _against_kl(axis, data["bound_kl"], "expected reward E_π[r]", title, legend_size=8)
    return _save(plt, figure, out_dir, "reward_kl")


def _to_plane(points) -> tuple[np.ndarray, np.ndarray]:
    """Barycentric (M, 3) → (x, y) in the triangle with vertices (0, 0), (1, 0), (½, √3/2)."""
    points = np.atleast_2d(np.asarray(points, dtype=np.float64))
    return points[:, 1] + 0.5 * points[:, 2], (math.sqrt(3) / 2) * points[:, 2]


def plot_tilt_simplex(data: dict, out_dir) -> Path:
    """The tilt path on the simplex with KL(π ‖ p) and H(π ‖ q) contours (data from `tilt_data`)."""
    plt = pyplot()
    p, q = np.asarray(data["p"]), np.asarray(data["q"])
    steps = 120  # barycentric grid of the contours: (M, 3), M = (steps − 1)(steps − 2)/2 interior points
    grid = np.array([(i, j, steps - i - j) for i in range(1, steps) for j in range(1, steps - i)]) / steps
    x, y = _to_plane(grid)
    kl = np.sum(grid * np.log(grid / p), axis=1)  # (M,) KL(π ‖ p)
    cross_entropy = -grid @ np.log(q)  # (M,) H(π ‖ q) = −Σ π log q
    figure, axis = plt.subplots(figsize=(6, 5.4))
    corners_x, corners_y = _to_plane(np.eye(3))
    axis.fill(corners_x, corners_y, facecolor="none", edgecolor="black")
    kl_lines = axis.tricontour(x, y, kl, levels=[0.05, 0.2, 0.5, 1.0], colors="tab:blue", linewidths=0.8)
    axis.clabel(kl_lines, fontsize=7, fmt="KL=%.2g")
    ce_lines = axis.tricontour(x, y, cross_entropy, levels=[0.6, 0.9, 1.2, 1.6, 2.0], colors="tab:orange",
                               linewidths=0.8, linestyles="--")
    axis.clabel(ce_lines, fontsize=7, fmt="H=%.2g")
    path_x, path_y = _to_plane(data["path"])
    axis.plot(path_x, path_y, "-", color="black", linewidth=2, label="tilt T(q, p, α) ∝ p·q^α, α ≥ 0")
    bon_x, bon_y = _to_plane(data["best_of_n"]["policy"])
    axis.plot(bon_x, bon_y, "s", color="tab:green", markersize=4, label="best-of-n, r = log q")
    for n, bx, by in zip(data["best_of_n"]["n"], bon_x, bon_y):
        if n > 16:  # the rest crowd the vertex y₃
            break
        axis.annotate(str(n), (bx, by), textcoords="offset points", xytext=(4, 2), fontsize=7, color="tab:green")
    for point, name, color in ((p, "p", "black"), (q, "q", "tab:orange")):
        px, py = _to_plane(point)
        axis.plot(px, py, "o", color=color, markersize=6)
        axis.annotate(f"{name} = ({', '.join(f'{v:.2f}' for v in point)})", (px[0], py[0]),
                      textcoords="offset points", xytext=(6, -10), fontsize=8)
    for (cx, cy, name, dx) in zip(corners_x, corners_y, ("y₁", "y₂", "y₃"), (-14, 4, 6)):
        axis.annotate(name, (cx, cy), textcoords="offset points", xytext=(dx, -4), fontsize=9)
    axis.set_aspect("equal")
    axis.axis("off")
    axis.set_title("Tilt path on the simplex (solid blue: KL(π ‖ p), dashed orange: H(π ‖ q))", fontsize=9)
    axis.legend(fontsize=8, loc="upper left")
    return _save(plt, figure, out_dir, "tilt_simplex")
