"""`metagen theory bon`: the parser of the alignment-theory figures; `metagen.theory.cli.run` draws them.

metagen.theory (numpy, scipy, matplotlib) is imported only when the command runs, so building the
parser stays light.
"""

from __future__ import annotations

import argparse


def add_parser(commands) -> None:
    theory = commands.add_parser("theory", help="figures of the alignment theory (metagen.theory)")
    bon = theory.add_subparsers(dest="figure", required=True).add_parser(
        "bon", help="best-of-n win rate and reward vs KL, and the tilt path on the simplex (three PNGs)")
    bon.add_argument("--n-max", type=int, default=64, help="largest n (default 64)")
    bon.add_argument("--out", required=True, help="directory for the PNGs")
    bon.add_argument("--seed", type=int, default=0, help="seed of the reward–KL figure's rewards (default 0)")
    bon.add_argument("--json", action="store_true", help="print the numbers behind the figures")
    theory.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from metagen.theory.cli import run as run_theory

    return run_theory(args)
