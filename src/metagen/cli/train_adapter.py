"""`metagen train-exit-adapter --exit-layer L --out FILE`: train an early-exit drafting adapter.

The draft of `--speculative early-exit` runs the first L layers and reads the logits through an
adapter; this samples text from the model on built-in prompts, fits the adapter so the truncated
model's next-token distribution matches the full model's (Adam, --steps steps), reports held-out
top-1 agreement and KL before and after, and saves it as safetensors.
"""

from __future__ import annotations

import argparse

from metagen.cli import common


def add_parser(commands) -> None:
    adapter = commands.add_parser("train-exit-adapter", help="train an early-exit drafting adapter")
    common.add_model_options(adapter)
    adapter.add_argument("--exit-layer", type=int, required=True, help="layers the draft runs")
    adapter.add_argument("--out", required=True, help="adapter file to write (safetensors)")
    adapter.add_argument("--tokens-per-prompt", type=int, default=256, help="sampled tokens per built-in prompt")
    adapter.add_argument("--steps", type=int, default=300, help="Adam steps (default 300)")
    adapter.add_argument("--rank", type=int, default=None, help="low-rank adapter (default: full rank)")
    adapter.add_argument("--seed", type=int, default=0, help="seed of the sampled data and the training (default 0)")
    adapter.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from metagen.speculative import sample_training_data, train_exit_adapter

    if args.tokens_per_prompt < 2:
        raise ValueError(f"--tokens-per-prompt={args.tokens_per_prompt} must be >= 2")
    model = common.load_model(args)
    data = sample_training_data(model, tokens_per_prompt=args.tokens_per_prompt, seed=args.seed)
    adapter, report = train_exit_adapter(model, args.exit_layer, data, rank=args.rank, steps=args.steps, seed=args.seed)
    adapter.save(args.out)
    print(f"exit layer {report.num_layers}: held-out top-1 agreement with the full model "
          f"{report.agreement_before:.3f} -> {report.agreement_after:.3f}, KL {report.kl_before:.2f} -> "
          f"{report.kl_after:.2f} nats ({report.train_tokens} training tokens, {report.parameters:,} parameters); "
          f"saved {args.out}")
    return 0
