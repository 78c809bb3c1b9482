"""`metagen theory bon --n-max 64 --out DIR [--json]`: draw the best-of-n / tilt figures.

Writes theory_bon_win_rate.png, theory_reward_kl.png, theory_tilt_simplex.png and
theory_bon_asymptotics.png into DIR (see
`metagen.theory.plots`); with --json prints the numbers behind them as one JSON object.
The parser lives in `metagen.cli.theory`; `run` is its dispatch target.
"""

from __future__ import annotations

import argparse
import json

from metagen.outputs import check_writable_directory
from metagen.theory.plots import (
    asymptotics_data,
    plot_asymptotics,
    plot_reward_kl,
    plot_tilt_simplex,
    plot_win_rate,
    reward_kl_data,
    tilt_data,
    win_rate_data,
)

N_MAX_LIMIT = 4096  # every curve takes all n in 1..n_max


def check_n_max(n_max: int) -> int:
    if isinstance(n_max, bool) or int(n_max) != n_max or not 1 <= n_max <= N_MAX_LIMIT:
        raise ValueError(f"n_max={n_max} is out of range: --n-max must be an integer in [1, {N_MAX_LIMIT}]")
    return int(n_max)


def bon_figures(n_max: int, out_dir, seed: int = 0) -> dict:
    """Compute and draw the four figures; returns {"files": [...], "win_rate": ..., "reward_kl": ...,
    "tilt_simplex": ..., "asymptotics": ...} (the dicts of the `*_data` functions)."""
    n_max = check_n_max(n_max)
    out = check_writable_directory(out_dir, "--out")  # before the figures' minutes of work
    out.mkdir(parents=True, exist_ok=True)
    data = {"win_rate": win_rate_data(n_max), "reward_kl": reward_kl_data(n_max, seed),
            "tilt_simplex": tilt_data(n_max), "asymptotics": asymptotics_data()}
    files = [plot_win_rate(data["win_rate"], out), plot_reward_kl(data["reward_kl"], out),
             plot_tilt_simplex(data["tilt_simplex"], out), plot_asymptotics(data["asymptotics"], out)]
    return {"files": [str(path) for path in files], **data}


def run(args: argparse.Namespace) -> int:
    """Dispatch of `metagen theory ...` (only `bon` so far)."""
    result = bon_figures(args.n_max, args.out, args.seed)
    if args.json:
        print(json.dumps(result))
    else:
        for path in result["files"]:
            print(path)
    return 0
