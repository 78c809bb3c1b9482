"""`metagen generate --adadec`: AdaDec's options and the config they make.

AdaDec (He et al. 2025, `metagen.decoding.adadec`): decoding pauses where the --model's
next-token entropy is above `--adadec-threshold` bits, and the row takes the best of its
`--adadec-candidates` most likely tokens by the mean log-probability of each with its greedy
lookahead of `--adadec-lookahead` tokens. The threshold is model-specific (the paper learns it:
`metagen.decoding.adadec.fit_entropy_threshold`), so it has no default. The plain path only: one
model, no --backend, --speculative, --strategy, --beam-width, nor a second model
(--contrastive, --dexperts, --entropy-adaptive). `metagen eval` takes the same options for every
local model of its sweep, under every strategy that does not decode on the cache itself
(`cli/decoders.py`).
"""

from __future__ import annotations

import argparse

from metagen.cli.args import refuse_alone
from metagen.cli.contrastive import GENERATE_EXCLUDES, refuse_with

_OPTIONS = ("adadec_threshold", "adadec_candidates", "adadec_lookahead")


def add_adadec_options(parser: argparse.ArgumentParser) -> None:
    """The argument group of --adadec and the options that only apply with it."""
    group = parser.add_argument_group("AdaDec (He et al. 2025: where the entropy is high, rerank the top tokens "
                                      "by a short greedy lookahead)")
    group.add_argument("--adadec", action="store_true",
                       help="pause where the next-token entropy is above --adadec-threshold and take the best of "
                            "the top candidates by the mean log-probability of each with its greedy lookahead")
    group.add_argument("--adadec-threshold", type=float, default=None, metavar="BITS",
                       help="--adadec (required): τ >= 0 in bits (inf: never pause); model-specific, see "
                            "metagen.decoding.adadec.fit_entropy_threshold")
    group.add_argument("--adadec-candidates", type=int, default=None, metavar="B",
                       help="--adadec: the most likely tokens reranked, an int >= 2 (default 3)")
    group.add_argument("--adadec-lookahead", type=int, default=None, metavar="L",
                       help="--adadec: the greedy tokens scored after each candidate, an int >= 1 (default 5)")


def adadec_config(args: argparse.Namespace, excludes=GENERATE_EXCLUDES):
    """The `AdaDecConfig` of --adadec (checked: τ, B, L), or None; ValueError naming the flag for
    options without --adadec and for what it cannot combine with (--backend, --beam-width, a
    second model, and the options named in `excludes`). Nothing is loaded here."""
    if not args.adadec:
        refuse_alone(args, _OPTIONS, "--adadec")
        return None
    refuse_with("adadec", args, "its lookahead runs forwards of the local model on forks of its cache, which a "
                "remote server does not offer", excludes)
    for other in ("beam_width", "contrastive", "dexperts", "entropy_adaptive", "superposed"):
        if getattr(args, other, None) is not None:  # eval has no --beam-width or --superposed
            raise ValueError(f"--adadec cannot be combined with --{other.replace('_', '-')}: it reranks the "
                             "plain path's tokens with the --model alone")
    if args.adadec_threshold is None:
        raise ValueError("--adadec needs --adadec-threshold BITS (model-specific; inf: never pause)")
    from metagen.decoding.adadec import AdaDecConfig

    return AdaDecConfig(threshold=args.adadec_threshold,
                        candidates=3 if args.adadec_candidates is None else args.adadec_candidates,
                        lookahead=5 if args.adadec_lookahead is None else args.adadec_lookahead)
