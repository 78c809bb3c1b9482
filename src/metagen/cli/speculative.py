"""`metagen generate --speculative DRAFTER`: its options, the drafter they make, and the summary in --json.

Speculative decoding keeps the target's output distribution and needs fewer target steps; the
options here only choose the drafter and the verification (γ draft tokens per step, the rule,
adaptive γ). Drafters and rules are the entries of `metagen.speculative.registry` (the help
lists them from there); an unknown name, an option the chosen drafter does not read, or tree
options (--tree-widths / --tree-nodes: any drafter then drafts token trees) with a chain-only
--verify, is refused before any model loads.
"""

from __future__ import annotations

import argparse

from metagen.cli.args import refuse_alone
from metagen.speculative.registry import (
    DRAFT_DTYPES,
    DRAFTERS,
    VERIFICATIONS,
    DrafterOptions,
    check_speculative,
    drafter_names,
)

OPTIONS = ("num_draft_tokens", "verify", "adaptive_draft", "exit_layer", "exit_adapter", "draft_dtype",
           "draft_confidence", "tree_widths", "tree_nodes", "draft_corpus", "draft_stop_head", "stop_threshold")
# flag destination -> the `DrafterOptions` field it sets
_DRAFTER_OPTIONS = {"exit_layer": "exit_layer", "exit_adapter": "exit_adapter", "draft_dtype": "draft_dtype",
                    "draft_confidence": "confidence", "tree_widths": "tree_widths", "tree_nodes": "tree_nodes",
                    "draft_corpus": "draft_corpus", "draft_stop_head": "stop_head", "stop_threshold": "stop_threshold"}


def _readers(option: str) -> str:
    """The drafters reading `option`, as the help names them ("quantized / model:PATH")."""
    return " / ".join(spec.spelling for spec in DRAFTERS.values() if option in spec.reads)


def add_speculative_options(parser: argparse.ArgumentParser, *, served: bool = False) -> None:
    """The argument group of --speculative and the options that only apply with it; `served`:
    `metagen serve`'s, whose help says how the server drafts."""
    spec = parser.add_argument_group("speculative decoding (same output distribution, fewer target steps)")
    spec.add_argument("--speculative", default=None, metavar="DRAFTER", help=" | ".join(drafter_names()) + (
        " (every request drafts in the engine's batch, a draft model with its own cache of the request's rows)"
        if served else ""))
    spec.add_argument("--num-draft-tokens", type=int, default=None, help="draft tokens per step, γ (default 4)")
    tree_rules = [name for name, rule in VERIFICATIONS.items() if rule.trees]
    own_rules = ", ".join(f"{name}: {entry.verify}" for name, entry in DRAFTERS.items() if entry.verify != "token")
    spec.add_argument("--verify", choices=list(VERIFICATIONS), default=None,
                      help="verification rule (default token, multi-draft for tree drafts, or the drafter's own"
                           + (f" ({own_rules})" if own_rules else "")
                           + "; draw: each token drawn as plain decoding draws it"
                           + (f"; {', '.join(tree_rules)}: verify token trees" if tree_rules else "")
                           + ")")
    spec.add_argument("--adaptive-draft", action="store_true", default=None,
                      help="grow γ after fully accepted drafts, shrink it after rejections")
    spec.add_argument("--exit-layer", type=int, default=None, help=f"{_readers('exit_layer')}: layers the draft runs")
    spec.add_argument("--exit-adapter", default=None, help=f"{_readers('exit_adapter')}: trained adapter file")
    spec.add_argument("--draft-dtype", default=None, choices=list(DRAFT_DTYPES),
                      help=f"{_readers('draft_dtype')} drafter weights (default int4)")
    spec.add_argument("--draft-confidence", type=float, default=None,
                      help=f"{_readers('confidence')}: stop a draft after a token below this probability")
    spec.add_argument("--draft-stop-head", default=None, metavar="PATH",
                      help=f"{_readers('stop_head')}: a trained SpecDec++ stop head (metagen train-stop-head): "
                           "stop a draft once a rejection is likely (raise --num-draft-tokens to let it run)")
    spec.add_argument("--stop-threshold", type=float, default=None,
                      help=f"{_readers('stop_threshold')}: with --draft-stop-head, stop once the predicted "
                           "probability that a draft token so far is rejected exceeds this (in (0, 1), default 0.5)")
    spec.add_argument("--tree-widths", type=_widths, default=None, metavar="K1,K2,...",
                      help=f"{_readers('tree_widths')}: draft token trees, children per node at each depth "
                           "(default 2,2,1; recycling 4,2,1,1,1,1; stand 3,2,1,1; medusa 4,3,2)")
    spec.add_argument("--tree-nodes", type=int, default=None,
                      help=f"{_readers('tree_nodes')}: draft token trees, nodes per step (default 16; recycling 32, "
                           "rasd 24, stand 12)")
    spec.add_argument("--draft-corpus", default=None, metavar="PATH",
                      help=f"{_readers('draft_corpus')}: a text file to retrieve drafts from (tokenized once; "
                           "documents separated by blank lines)")


def _widths(text: str) -> tuple[int, ...]:
    """`--tree-widths 2,2,1` as (2, 2, 1); ArgumentTypeError naming the value otherwise."""
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of ints (e.g. 2,2,1)") from None


def speculative_options(args: argparse.Namespace) -> dict | None:
    """The speculative settings of `generate` or `serve`, or None; options without --speculative
    raise, as do an unknown drafter or rule and an option the drafter does not read (nothing
    loaded yet)."""
    if args.speculative is None:
        refuse_alone(args, OPTIONS, "--speculative DRAFTER")
        return None
    drafter_args = {field: getattr(args, flag) for flag, field in _DRAFTER_OPTIONS.items()
                    if getattr(args, flag) is not None}
    _, verify = check_speculative(args.speculative, DrafterOptions(**drafter_args), args.verify)
    from metagen.speculative import SpeculativeConfig

    config = SpeculativeConfig(
        num_draft_tokens=4 if args.num_draft_tokens is None else args.num_draft_tokens,
        verify=verify,
        adaptive=bool(args.adaptive_draft),
    )
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
