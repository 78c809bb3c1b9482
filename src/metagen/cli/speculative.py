"""`metagen generate --speculative DRAFTER`: its options, the drafter they make, and the summary in --json.

Speculative decoding keeps the target's output distribution and needs fewer target steps; the
options here only choose the drafter (ngram | early-exit | quantized | model:PATH) and the
verification (γ draft tokens per step, token, block or draw rule, adaptive γ).
"""

from __future__ import annotations

import argparse

from metagen.cli.args import refuse_alone

_OPTIONS = ("num_draft_tokens", "verify", "adaptive_draft", "exit_layer", "exit_adapter", "draft_dtype",
            "draft_confidence")


def add_speculative_options(parser: argparse.ArgumentParser) -> None:
    """The argument group of --speculative and the options that only apply with it."""
    spec = parser.add_argument_group("speculative decoding (same output distribution, fewer target steps)")
    spec.add_argument("--speculative", default=None, metavar="DRAFTER",
                      help="ngram | early-exit | quantized | model:PATH")
    spec.add_argument("--num-draft-tokens", type=int, default=None, help="draft tokens per step, γ (default 4)")
    spec.add_argument("--verify", choices=["token", "block", "draw"], default=None,
                      help="verification rule (default token; draw: each token drawn as plain decoding draws it)")
    spec.add_argument("--adaptive-draft", action="store_true", default=None,
                      help="grow γ after fully accepted drafts, shrink it after rejections")
    spec.add_argument("--exit-layer", type=int, default=None, help="early-exit: layers the draft runs")
    spec.add_argument("--exit-adapter", default=None, help="early-exit: trained adapter file")
    spec.add_argument("--draft-dtype", default=None, choices=["fp32", "bf16", "int8", "int4"],
                      help="quantized / model:PATH drafter weights (default int4)")
    spec.add_argument("--draft-confidence", type=float, default=None,
                      help="model drafters: stop a draft after a token below this probability")


def speculative_options(args: argparse.Namespace) -> dict | None:
    """The speculative settings of `generate`, or None; options without --speculative raise."""
    if args.speculative is None:
        refuse_alone(args, _OPTIONS, "--speculative DRAFTER")
        return None
    from metagen.speculative import SpeculativeConfig

    config = SpeculativeConfig(
        num_draft_tokens=4 if args.num_draft_tokens is None else args.num_draft_tokens,
        verify=args.verify or "token",
        adaptive=bool(args.adaptive_draft),
    )
    drafter_args = {"exit_layer": args.exit_layer, "exit_adapter": args.exit_adapter,
                    "confidence": args.draft_confidence}
    if args.draft_dtype is not None:
        drafter_args["draft_dtype"] = args.draft_dtype
    return {"kind": args.speculative, "config": config, "drafter_args": drafter_args}


def make_drafter(speculative: dict, model):
    """The drafter `speculative_options` describes, drafting for `model`."""
    from metagen.speculative import make_drafter as make

    return make(speculative["kind"], model, **speculative["drafter_args"])


def speculative_summary(speculative: dict, cost) -> dict:
    """The "speculative" object of `generate --json`: the settings and what drafting achieved."""
    config = speculative["config"]
    return {
        "drafter": speculative["kind"],
        "num_draft_tokens": config.num_draft_tokens,
        "verify": config.verify,
        "adaptive": config.adaptive,
        "draft_tokens": cost.draft_tokens,
        "accepted_tokens": cost.accepted_tokens,
        "acceptance_rate": None if cost.acceptance_rate is None else round(cost.acceptance_rate, 4),
        "target_steps": cost.target_steps,
        "block_efficiency": None if cost.block_efficiency is None else round(cost.block_efficiency, 4),
    }
