"""`metagen generate --dexperts EXPERT,ANTI` and `--entropy-adaptive LARGE`: decoding with
several models on the plain path, and the combiners they make.

- DExperts / proxy tuning (Liu et al. 2021, 2024): scores = log p_base + α (log p_expert −
  log p_anti), the --model as the base; `--dexperts-alpha` is α (default 1, proxy tuning's).
  The three models run on every row. Beam search takes it too.
- Entropy-adaptive decoding (Simonds 2025): the --model (small) decodes while its rolling
  next-token entropy over the last `--entropy-window` steps (default 5) is at most
  `--entropy-threshold` bits; above it the LARGE model gives the row's token, catching up on the
  tokens it missed first. The plain path only (not --beam-width).

EXPERT, ANTI and LARGE are spelled as --contrastive's AMATEUR (`early-exit:L`, a model as --model
takes it, `embedded`) and must share the --model's tokenizer. Like --contrastive, both refuse
--backend, --speculative and --strategy (`metagen eval`: --backend only, `cli/decoders.py`), and
each other and --contrastive.
"""

from __future__ import annotations

import argparse

from metagen.cli.args import refuse_alone
from metagen.cli.contrastive import GENERATE_EXCLUDES, early_exit_layers, load_companion, refuse_main, refuse_with

_DEXPERTS_OPTIONS = ("dexperts_alpha",)
_ENTROPY_OPTIONS = ("entropy_threshold", "entropy_window")


def add_mixing_options(parser: argparse.ArgumentParser) -> None:
    """The argument groups of --dexperts and --entropy-adaptive."""
    add_dexperts_options(parser)
    group = parser.add_argument_group("entropy-adaptive decoding (Simonds 2025: the --model decodes, a larger "
                                      "model where its rolling entropy is above a threshold)")
    group.add_argument("--entropy-adaptive", default=None, metavar="LARGE",
                       help="the large model, spelled as --contrastive's AMATEUR; same tokenizer as --model")
    group.add_argument("--entropy-threshold", type=float, default=None, metavar="H",
                       help="--entropy-adaptive (required): τ in bits; the large model gives a row's token while "
                            "the --model's rolling entropy is above it")
    group.add_argument("--entropy-window", type=int, default=None, metavar="W",
                       help="--entropy-adaptive: the steps the rolling entropy averages over (default 5)")


def add_dexperts_options(parser: argparse.ArgumentParser) -> None:
    """The argument group of --dexperts."""
    group = parser.add_argument_group("DExperts / proxy tuning (Liu et al. 2021, 2024: log p_model + "
                                      "α (log p_expert − log p_anti))")
    group.add_argument("--dexperts", default=None, metavar="EXPERT,ANTI",
                       help="the expert and the anti-expert, comma-separated, each spelled as --contrastive's "
                            "AMATEUR (early-exit:L, a model as --model takes it, 'embedded') or 'main', the --model "
                            "itself (its logits reused, no second forward); same tokenizer")
    group.add_argument("--dexperts-alpha", type=float, default=None, metavar="A",
                       help="--dexperts: the steering strength α >= 0 (default 1)")


def mixing_options(args: argparse.Namespace, excludes=GENERATE_EXCLUDES) -> dict | None:
    """The settings of --dexperts or --entropy-adaptive (checked: α, τ, w, the model spellings), or
    None; ValueError naming the flag for options without their flag and for what it cannot
    combine with (--backend, --contrastive, each other, and the options named in `excludes`).
    Nothing is loaded here."""
    from metagen.decoding.entropy_adaptive import EntropyAdaptiveConfig

    if args.dexperts is None:
        refuse_alone(args, _DEXPERTS_OPTIONS, "--dexperts EXPERT,ANTI")
    if args.entropy_adaptive is None:
        refuse_alone(args, _ENTROPY_OPTIONS, "--entropy-adaptive LARGE")
    if args.dexperts is None and args.entropy_adaptive is None:
        return None
    flag = "dexperts" if args.dexperts is not None else "entropy-adaptive"
    for other, value in (("contrastive", args.contrastive),
                         ("entropy-adaptive", args.entropy_adaptive if flag == "dexperts" else None)):
        if value is not None:
            raise ValueError(f"--{flag} cannot be combined with --{other}: one way of mixing models at a time")
    refuse_with(flag, args, "it runs other models next to the local one, which a remote server does not have here",
                excludes)
    if flag == "dexperts":
        return dexperts_settings(args)
    if getattr(args, "beam_width", None) is not None:  # generate's option (eval has no beam search)
        raise ValueError("--entropy-adaptive cannot be combined with --beam-width: it switches models row by row "
                         "in the sampling loop")
    if args.entropy_threshold is None:
        raise ValueError("--entropy-adaptive needs --entropy-threshold H (bits)")
    window = 5 if args.entropy_window is None else args.entropy_window
    EntropyAdaptiveConfig(large=None, threshold=args.entropy_threshold, window=window)  # the range checks
    early_exit_layers(flag, args.entropy_adaptive)
    refuse_main(flag, args.entropy_adaptive, "the model would hand over to itself")
    return {"kind": flag, "models": [args.entropy_adaptive], "threshold": args.entropy_threshold, "window": window}


def dexperts_settings(args: argparse.Namespace) -> dict | None:
    """The --dexperts settings (checked: α, the two model spellings), or None without --dexperts;
    ValueError naming the flag for --dexperts-alpha given without it. What the command cannot
    combine it with is its own to refuse. Nothing is loaded here."""
    from metagen.decoding.combine import DExpertsConfig

    if args.dexperts is None:
        refuse_alone(args, _DEXPERTS_OPTIONS, "--dexperts EXPERT,ANTI")
        return None
    specs = args.dexperts.split(",")
    if len(specs) != 2 or not all(spec.strip() for spec in specs):
        raise ValueError(f"--dexperts {args.dexperts!r}: needs two models, EXPERT,ANTI (comma-separated)")
    specs = [spec.strip() for spec in specs]
    for spec in specs:
        early_exit_layers("dexperts", spec)
    alpha = 1.0 if args.dexperts_alpha is None else args.dexperts_alpha
    DExpertsConfig(expert=None, anti_expert=None, alpha=alpha)  # the range check
    return {"kind": "dexperts", "models": specs, "alpha": alpha}


def make_mixing_combiner(options: dict, model, args: argparse.Namespace, load=None):
    """The `DExpertsConfig` or `EntropyAdaptiveConfig` of `mixing_options`, `model` the base (the
    small model); the other models are loaded by `load(flag, spec, model, args)`
    (`contrastive.load_companion` by default)."""
    from metagen.decoding.combine import DExpertsConfig
    from metagen.decoding.entropy_adaptive import EntropyAdaptiveConfig

    flag = options["kind"]
    models = [(load or load_companion)(flag, spec, model, args) for spec in options["models"]]
    if flag == "dexperts":
        return DExpertsConfig(expert=models[0], anti_expert=models[1], alpha=options["alpha"])
    return EntropyAdaptiveConfig(large=models[0], threshold=options["threshold"], window=options["window"])
