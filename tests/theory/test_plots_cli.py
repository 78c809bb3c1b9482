"""`metagen theory bon`: the figures are written, their numbers agree with metagen.theory, bad input
exits 2, matplotlib stays unimported; and best-of-n's KL on the real model's samples."""

from __future__ import annotations

import collections
import contextlib
import io
import json
import math
import subprocess
import sys
import zlib

import numpy as np
import pytest

from metagen.cli import main
from metagen.theory import alpha_for_kl, bon_kl, bon_kl_bound, bon_kl_estimate, bon_pmf, bon_win_rate, kl_regularized_optimum, tilt
from metagen.theory.plots import FILES, continuous_optimum, policy_win_rate


@pytest.fixture(scope="module")
def figures(tmp_path_factory):
    """One run of `metagen theory bon --n-max 16 --out DIR --json`: (DIR, parsed JSON)."""
    pytest.importorskip("matplotlib")
    out = tmp_path_factory.mktemp("theory") / "figures"  # not yet there: the CLI creates it
    stdout = io.StringIO()  # capsys is function-scoped; the figures are drawn once per module
    with contextlib.redirect_stdout(stdout):
        assert main(["theory", "bon", "--n-max", "16", "--out", str(out), "--json"]) == 0
    return out, json.loads(stdout.getvalue())


def test_writes_four_non_empty_pngs(figures):
    out, data = figures
    assert sorted(path.name for path in out.iterdir()) == sorted(FILES.values())
    for name in FILES.values():
        content = (out / name).read_bytes()
        assert content.startswith(b"\x89PNG") and len(content) > 10_000
    assert data["files"] == [str(out / FILES[key]) for key in
                             ("win_rate", "reward_kl", "tilt_simplex", "asymptotics")]


def test_win_rate_numbers_match_the_theory(figures):
    data = figures[1]["win_rate"]
    assert data["n"] == list(range(1, 17))
    assert data["bound_kl"][7] == pytest.approx(math.log(8) - 7 / 8, abs=1e-12)
    assert data["bound_win_rate"][7] == pytest.approx(8 / 9, abs=1e-12)
    binary = data["instances"][0]  # seed Example 1: π⁽ⁿ⁾(0) = 2⁻ⁿ, KL = log 2 − h(2⁻ⁿ)
    for n, kl, win in zip(data["n"], binary["kl"], binary["win_rate"]):
        x = 0.5**n
        assert kl == pytest.approx(math.log(2) + x * math.log(x) + (1 - x) * math.log(1 - x), abs=1e-12)
        # y ∼ π⁽ⁿ⁾ beats z ∼ p: y = 1 (prob 1 − x) wins ½·1 + ½·½, y = 0 (prob x) wins ½·½
        assert win == pytest.approx((1 - x) * 0.75 + x * 0.25, abs=1e-12)
    for instance in data["instances"]:
        p, r = np.array(instance["p"]), np.array(instance["r"])
        assert instance["kl"] == pytest.approx([bon_kl(p, r, n) for n in data["n"]], abs=1e-12)
        assert instance["win_rate"] == pytest.approx([bon_win_rate(p, r, n) for n in data["n"]], abs=1e-12)
        for n, kl, win in zip(data["n"], instance["kl"], instance["win_rate"]):
            assert kl <= bon_kl_bound(n) + 1e-12 and win <= n / (n + 1) + 1e-12
        # best-of-n never beats the frontier: the win-rate-optimal policy at KL Δ is the tilt of
        # q = softmax(w), w = (F + F⁻)/2, with α(Δ) = 1/β, and its win rate is E[w]
        w = np.array([policy_win_rate(np.eye(len(p))[k], p, r) for k in range(len(p))])
        q = np.exp(w) / np.exp(w).sum()
        for kl, win in zip(instance["kl"][1:], instance["win_rate"][1:]):
            assert win <= policy_win_rate(tilt(p, q, alpha_for_kl(p, q, kl)), p, r) + 1e-9
        optimum = kl_regularized_optimum(p, w, instance["optimum"]["beta"][60])
        assert instance["optimum"]["win_rate"][60] == pytest.approx(optimum.expected_reward, abs=1e-12)


def test_policy_win_rate_is_bon_win_rate_on_the_bon_policy():
    p, r = np.array([0.1, 0.2, 0.3, 0.4]), np.array([2.0, 0.0, 2.0, 1.0])  # a tie at the top
    for n in (1, 3, 7):
        assert policy_win_rate(bon_pmf(p, r, n), p, r) == pytest.approx(bon_win_rate(p, r, n), abs=1e-12)
    assert policy_win_rate(p, p, r) == pytest.approx(0.5, abs=1e-12)  # p against itself: ½ by symmetry


def test_continuous_optimum_against_a_fine_grid():
    """The closed form of the no-ties frontier against the tilt of U[0, 1] on a 10⁵-point grid."""
    kl, win = continuous_optimum(np.array([0.5, 3.0, 40.0]))
    u = (np.arange(100_000) + 0.5) / 100_000
    uniform = np.full(u.size, 1 / u.size)
    for t, kl_t, win_t in zip((0.5, 3.0, 40.0), kl, win):
        optimum = kl_regularized_optimum(uniform, u, 1 / t)
        assert optimum.expected_reward == pytest.approx(win_t, abs=1e-6)
        assert optimum.kl == pytest.approx(kl_t, abs=1e-6)
    assert np.all(win <= 1) and np.all(np.diff(kl) > 0)


def test_reward_kl_and_tilt_numbers_match_the_theory(figures):
    data = figures[1]["reward_kl"]
    p, r = np.array(data["p"]), np.array(data["r"])
    for n, kl, reward in zip(data["n"], data["kl"], data["expected_reward"]):
        assert kl == pytest.approx(bon_kl(p, r, n), abs=1e-12)
        assert reward == pytest.approx(bon_pmf(p, r, n) @ r, abs=1e-12)
        assert kl <= data["bound_kl"][n - 1] + 1e-12
    optimum = kl_regularized_optimum(p, r, data["optimum"]["beta"][50])
    assert data["optimum"]["kl"][50] == pytest.approx(optimum.kl, abs=1e-12)
    # no policy beats the optimum at its own KL: best-of-n lies on or below the frontier, whose
    # point at KL Δ is the tilt of q = softmax(r) with α(Δ) = 1/β
    q = np.exp(r - r.max()) / np.exp(r - r.max()).sum()
    for kl, reward in zip(data["kl"][1:], data["expected_reward"][1:]):
        assert reward <= tilt(p, q, alpha_for_kl(p, q, kl)) @ r + 1e-9

    simplex = figures[1]["tilt_simplex"]
    assert simplex["p"] == [0.5, 0.3, 0.2] and simplex["q"] == [0.22, 0.11, 0.67]
    assert simplex["path"][0] == pytest.approx([0.5, 0.3, 0.2])
    assert simplex["path"][-1] == pytest.approx(tilt(simplex["p"], simplex["q"], simplex["alpha"][-1]).tolist())
    assert np.all(np.diff(simplex["kl"]) >= 0) and simplex["kl"][-1] < simplex["kl_limit"] == pytest.approx(-math.log(0.2))
    assert simplex["best_of_n"]["n"] == [1, 2, 4, 8, 16]


@pytest.mark.parametrize("value", ["0", "-3", "5000"])
def test_bad_n_max_exits_2_naming_the_field(capsys, tmp_path, value):
    assert main(["theory", "bon", "--n-max", value, "--out", str(tmp_path)]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"metagen: error: n_max={value} is out of range") and "--n-max" in error
    assert list(tmp_path.iterdir()) == []


def test_out_that_is_a_file_exits_2(capsys, tmp_path):
    target = tmp_path / "file.txt"
    target.write_text("x")
    assert main(["theory", "bon", "--out", str(target)]) == 2
    assert "--out" in capsys.readouterr().err


@pytest.mark.parametrize("where", ["read-only", "under a read-only directory", "under a file"])
def test_out_that_cannot_be_written_exits_2_before_drawing(capsys, tmp_path, monkeypatch, request, where):
    import metagen.theory.cli as theory_cli

    def not_now(*args):
        raise AssertionError("the figures were computed before --out was checked")

    monkeypatch.setattr(theory_cli, "win_rate_data", not_now)
    if where == "under a file":
        (tmp_path / "file.txt").write_text("x")
        out, named = tmp_path / "file.txt" / "figures", "is a file, not a directory"
    else:
        read_only = request.getfixturevalue("read_only_dir")
        out = read_only if where == "read-only" else read_only / "figures"
        named = "is not writable" if where == "read-only" else f"cannot be created in {str(read_only)!r}"
    assert main(["theory", "bon", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"metagen: error: --out {str(out)!r} ") and named in err and err.count("\n") == 1


def test_importing_the_theory_does_not_import_matplotlib():
    code = ("import sys, metagen, metagen.theory, metagen.theory.plots, metagen.theory.cli, metagen.cli; "
            "metagen.cli.build_parser(); print('matplotlib' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


@pytest.mark.slow
def test_best_of_n_kl_on_the_real_model(model, capsys):
    """Seed 002, §"Analytical formula is wrong!" on SmolLM2: 400 completions (8 tokens) of one prompt
    form the empirical base policy p̂; reward r(y) = 1 for every completion naming Paris (one tie
    class, the top outcome, mass ε ≈ 0.2) and a hash score in [0, 1) for the rest (all distinct).
    Then the exact KL(π⁽ⁿ⁾ ‖ p̂) must stay below log n − (n − 1)/n and saturate near −log ε once
    n·ε ≫ 1, where the bound keeps growing; KL̂(ε) (Approximation 1), which assumes exactly this
    shape (one top atom, the rest spread thin), must track it (measured error < 1e-4 nats; asserted
    ≤ 1e-2, and ≤ 0.05 for its average over y ∼ π⁽ⁿ⁾ with ε = p̂(y)). About 25 s on 2 cores."""
    from metagen.decoding import generate
    from metagen.sampling import SamplingParams

    samples = 400
    result = generate(model, "What is the capital of France?", SamplingParams(n=samples, max_tokens=8, seed=0))
    counts = collections.Counter("Paris" if "Paris" in c.text else c.text for c in result.completions)
    outcomes = list(counts)
    p = np.array([counts[y] for y in outcomes], dtype=np.float64) / samples  # (K,) empirical p̂
    r = np.array([1.0 if y == "Paris" else zlib.crc32(y.encode()) / 2**32 for y in outcomes])
    eps = counts["Paris"] / samples
    assert 0.05 <= eps <= 0.5, f"the model named Paris in {counts['Paris']} of {samples} samples"
    rows = []
    for n in (1, 2, 4, 8, 16, 32, 64):
        exact, bound, estimate = bon_kl(p, r, n), bon_kl_bound(n), bon_kl_estimate(eps, n)
        expected_estimate = float(bon_pmf(p, r, n) @ bon_kl_estimate(p, n))  # E_{y∼π⁽ⁿ⁾}[KL̂(p̂(y))]
        rows.append((n, exact, bound, estimate, expected_estimate))
        assert exact <= bound + 1e-12 and estimate <= bound + 1e-12  # Theorem 2 (KL̂ is itself a KL)
        assert abs(estimate - exact) <= 1e-2
        assert abs(expected_estimate - exact) <= 0.05
    assert rows[-1][2] - rows[-1][1] > 1.0  # n·ε ≈ 13: the bound overstates the KL by over a nat
    assert rows[-1][1] <= -math.log(eps)
    with capsys.disabled():
        print(f"\nK = {len(outcomes)} distinct outcomes, ε = p̂(Paris) = {eps:.4f}")
        print("   n   exact KL   bound   KL̂(ε)   E[KL̂(p̂(y))]")
        for n, exact, bound, estimate, expected_estimate in rows:
            print(f"{n:4d}   {exact:.4f}   {bound:.4f}   {estimate:.4f}   {expected_estimate:.4f}")
