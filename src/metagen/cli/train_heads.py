"""`metagen train-stop-head` and `metagen train-medusa`: heads that speculative decoding reads.

Both sample text from the model on the built-in prompts (as `train-exit-adapter` does) and fit
on it, then save a safetensors file tied to the model:

    metagen train-stop-head --speculative early-exit --out stop.safetensors    # SpecDec++ stop head
    metagen generate --speculative early-exit --draft-stop-head stop.safetensors --num-draft-tokens 12 ...
    metagen train-medusa --heads 3 --out medusa.safetensors                    # Medusa draft heads
    metagen generate --speculative medusa:medusa.safetensors ...
"""

from __future__ import annotations

import argparse

from metagen.cli import common


def add_parser(commands) -> None:
    stop = commands.add_parser("train-stop-head", help="train a SpecDec++ stop head for a model drafter")
    common.add_model_options(stop)
    stop.add_argument("--speculative", default="early-exit", metavar="DRAFTER",
                      help="the chain drafter it stops: early-exit (default), quantized or model:PATH")
    stop.add_argument("--exit-layer", type=int, default=None, help="early-exit: layers the draft runs")
    stop.add_argument("--exit-adapter", default=None, help="early-exit: trained adapter file")
    stop.add_argument("--draft-dtype", default=None, help="quantized / model:PATH drafter weights (default int4)")
    stop.add_argument("--temperature", type=float, default=0.0,
                      help="labels for this sampling temperature (default 0: greedy verification)")
    stop.add_argument("--hidden-units", type=int, default=None, help="an MLP head of this width (default: linear)")
    stop.add_argument("--reject-weight", type=float, default=1.0, help="weight of rejections in the BCE (default 1)")
    _add_data_options(stop, "stop head")
    stop.add_argument("--steps", type=int, default=300, help="AdamW steps (default 300)")
    stop.set_defaults(run=run_stop_head)

    medusa = commands.add_parser("train-medusa", help="train Medusa draft heads on the model's own text")
    common.add_model_options(medusa)
    medusa.add_argument("--heads", type=int, default=3, help="heads K: head k guesses the token k after the next")
    _add_data_options(medusa, "Medusa heads")
    medusa.set_defaults(run=run_medusa)


def _add_data_options(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--out", required=True, help=f"{what} file to write (safetensors)")
    parser.add_argument("--tokens-per-prompt", type=int, default=256, help="sampled tokens per built-in prompt")
    parser.add_argument("--seed", type=int, default=0, help="seed of the sampled data and the training (default 0)")


def _sample(args: argparse.Namespace):
    from metagen.speculative import sample_training_data

    if args.tokens_per_prompt < 2:
        raise ValueError(f"--tokens-per-prompt={args.tokens_per_prompt} must be >= 2")
    model = common.load_model(args)
    return model, sample_training_data(model, tokens_per_prompt=args.tokens_per_prompt, seed=args.seed)


def run_stop_head(args: argparse.Namespace) -> int:
    from metagen.speculative import make_drafter
    from metagen.speculative.registry import DrafterOptions, check_speculative
    from metagen.speculative.stop_training import train_stop_head

    options = {name: getattr(args, name) for name in ("exit_layer", "exit_adapter", "draft_dtype")
               if getattr(args, name) is not None}
    spec, _ = check_speculative(args.speculative, DrafterOptions(**options))
    if "stop_head" not in spec.reads:
        raise ValueError(f"--speculative {args.speculative} does not draft chains from a model: a stop head serves "
                         "early-exit, quantized or model:PATH")
    model, data = _sample(args)
    drafter = make_drafter(args.speculative, model, **options)
    head, report = train_stop_head(model, drafter.model, data, temperature=args.temperature, seed=args.seed,
                                   hidden_units=args.hidden_units, reject_weight=args.reject_weight, steps=args.steps)
    head.save(args.out)
    print(f"stop head for {drafter.model.name}: held-out accuracy {report.accuracy:.3f} (always-"
          f"{'reject' if report.rejection_rate > 0.5 else 'accept'} guess {report.baseline_accuracy:.3f}), BCE "
          f"{report.bce_before:.3f} -> {report.bce_after:.3f}, rejection rate {report.rejection_rate:.3f} "
          f"({report.train_positions} training positions); saved {args.out}")
    return 0


def run_medusa(args: argparse.Namespace) -> int:
    from metagen.speculative.medusa_training import train_medusa_heads

    if args.heads < 1:
        raise ValueError(f"--heads={args.heads} must be >= 1")
    model, data = _sample(args)
    heads, report = train_medusa_heads(model, data, num_heads=args.heads, seed=args.seed)
    heads.save(args.out)
    agreement = ", ".join(f"head {k + 1}: {a:.3f} -> {b:.3f}"
                          for k, (a, b) in enumerate(zip(report.agreement_before, report.agreement_after)))
    print(f"Medusa heads, held-out top-1 agreement with the model's greedy token ({agreement}); "
          f"{report.train_positions} training positions, {report.parameters:,} parameters; saved {args.out}")
    return 0
