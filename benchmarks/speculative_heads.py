"""Learned drafting heads against the heuristics they replace, on the same prompts and target.

Draft length (chains from the early-exit draft): a fixed γ, adaptive γ (+2 after a fully
accepted draft, −1 after a rejection: `SpeculativeConfig.adaptive`), the confidence stop
(`--draft-confidence`), and SpecDec++'s stop head (`--stop-head FILE`, at each of
`--thresholds`, γ up to `--max-gamma`). Trees: the Medusa heads (`--medusa-heads FILE`, the
multi-draft rule) next to the `tree` drafter (the early-exit draft's static tree). Files come
from `metagen train-stop-head` / `metagen train-medusa` on the same target dtype.

Per configuration, summed over the prompts (chat template, EOS ends a row, `--tokens` at most):
tokens / target forward (the prefill counted as a forward: plain decoding gives 1.00), accepted
draft tokens per verification forward, target forwards per token, acceptance (accepted /
proposed), draft tokens proposed per verification, tokens/s of the whole call, and whether
greedy output equals plain greedy output (temperature 0 only).

Run:  PYTHONPATH=src .venv/bin/python benchmarks/speculative_heads.py --stop-head stop.safetensors \\
          --medusa-heads medusa.safetensors --prompts 3 --tokens 64
"""

from __future__ import annotations

import argparse
import time

import torch

from metagen.decoding import generate
from metagen.models import load
from metagen.sampling import SamplingParams
from metagen.speculative import SpeculativeConfig, make_drafter, speculative_generate

PROMPTS = [
    "Give me three tips for learning to play the guitar.",
    "Why do cats purr? Explain briefly.",
    "Summarize in two sentences: The Harwick Bridge was opened on 14 March 1889 after six years of work. "
    "It is 412 metres long and carried horse-drawn carts until 1923, when the council replaced the wooden "
    "deck with steel.",
    "Write a short poem about the sea at night.",
    "What is the difference between a virus and a bacterium?",
]


def configurations(args) -> list[tuple[str, str, dict, SpeculativeConfig]]:
    """(label, drafter, options, config) in the order the table lists them."""
    chain = {} if args.exit_layer is None else {"exit_layer": args.exit_layer}
    runs = [(f"early-exit, γ={args.gamma}", "early-exit", chain, SpeculativeConfig(num_draft_tokens=args.gamma)),
            (f"early-exit, adaptive γ (start {args.gamma})", "early-exit", chain,
             SpeculativeConfig(num_draft_tokens=args.gamma, adaptive=True)),
            (f"early-exit, confidence {args.confidence}, γ≤{args.max_gamma}", "early-exit",
             chain | {"confidence": args.confidence}, SpeculativeConfig(num_draft_tokens=args.max_gamma))]
    if args.stop_head:
        for threshold in args.thresholds:
            runs.append((f"early-exit, stop head h={threshold}, γ≤{args.max_gamma}", "early-exit",
                         chain | {"stop_head": args.stop_head, "stop_threshold": threshold},
                         SpeculativeConfig(num_draft_tokens=args.max_gamma)))
    runs.append(("tree (early-exit, widths 2,2,1)", "tree", chain, SpeculativeConfig(verify="multi-draft")))
    if args.medusa_heads:
        runs.append(("medusa (widths 4,3,2, 16 nodes)", f"medusa:{args.medusa_heads}", {},
                     SpeculativeConfig(verify="multi-draft")))
    return runs


def measure(target, prompts, params, make, config):
    """Sums over `prompts`: tokens, target steps, verification forwards, draft and accepted
    tokens, seconds; and the token ids per prompt."""
    totals = dict(tokens=0, steps=0, verifications=0, drafted=0, accepted=0, seconds=0.0)
    outputs = []
    for prompt in prompts:
        chat = [{"role": "user", "content": prompt}]
        drafter = None if make is None else make()
        start = time.perf_counter()
        result = (generate(target, chat, params) if drafter is None
                  else speculative_generate(target, drafter, chat, params, config))
        totals["seconds"] += time.perf_counter() - start
        cost = result.cost
        totals["tokens"] += result.generated_tokens
        totals["steps"] += cost.target_steps
        totals["verifications"] += cost.target_steps - params.n  # the prefill is one step per row
        totals["drafted"] += cost.draft_tokens
        totals["accepted"] += cost.accepted_tokens
        outputs.append([list(c.token_ids) for c in result.completions])
    return totals, outputs


def row(label: str, totals: dict, same: str) -> list[str]:
    verifications = max(totals["verifications"], 1)
    return [label, f"{totals['tokens'] / totals['steps']:.2f}", f"{totals['accepted'] / verifications:.2f}",
            f"{totals['steps'] / totals['tokens']:.3f}",
            f"{totals['accepted'] / totals['drafted']:.2f}" if totals["drafted"] else "—",
            f"{totals['drafted'] / verifications:.2f}", f"{totals['tokens'] / totals['seconds']:.1f}", same]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--stop-head", default=None, help="SpecDec++ stop head for the early-exit draft")
    parser.add_argument("--medusa-heads", default=None, help="Medusa heads file")
    parser.add_argument("--thresholds", default="0.3,0.5,0.7", help="stop-head thresholds (default 0.3,0.5,0.7)")
    parser.add_argument("--gamma", type=int, default=4, help="fixed / starting γ (default 4)")
    parser.add_argument("--max-gamma", type=int, default=12, help="γ bound of the stopping rules (default 12)")
    parser.add_argument("--confidence", type=float, default=0.5, help="confidence stop (default 0.5)")
    parser.add_argument("--exit-layer", type=int, default=None, help="early-exit depth (default 20 of 30)")
    parser.add_argument("--dtype", default=None, help="target weights (default: the embedded model's own)")
    parser.add_argument("--prompts", type=int, default=3, help=f"prompts (at most {len(PROMPTS)}; default 3)")
    parser.add_argument("--tokens", type=int, default=64, help="new tokens at most per prompt (default 64)")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    try:
        args.thresholds = [float(t) for t in args.thresholds.split(",")]
    except ValueError:
        parser.error(f"--thresholds {args.thresholds!r}: give comma-separated numbers in (0, 1)")
    if not 1 <= args.prompts <= len(PROMPTS):
        parser.error(f"--prompts {args.prompts} is out of range: must be in [1, {len(PROMPTS)}]")
    torch.set_num_threads(args.threads)
    target = load(dtype=args.dtype)
    prompts = PROMPTS[: args.prompts]
    params = SamplingParams(temperature=args.temperature, max_tokens=args.tokens, seed=args.seed)
    measure(target, prompts[:1], SamplingParams(max_tokens=4), None, None)  # warm-up
    plain, expected = measure(target, prompts, params, None, None)
    table = [["configuration", "tokens/fwd", "accepted/verify", "fwd/token", "acceptance", "drafted/verify",
              "tok/s", "= greedy"], row("plain decoding", plain, "—")]
    print("  ".join(table[0]), flush=True)
    print("  ".join(table[1]), flush=True)
    for label, name, options, config in configurations(args):
        totals, outputs = measure(target, prompts, params, lambda: make_drafter(name, target, **options), config)
        same = ("yes" if outputs == expected else "NO") if args.temperature == 0 else "—"
        table.append(row(label, totals, same))
        print("  ".join(table[-1]), flush=True)
    print()
    print("| " + " | ".join(table[0]) + " |")
    print("|" + "---|" * len(table[0]))
    for line in table[1:]:
        print("| " + " | ".join(line) + " |")


if __name__ == "__main__":
    main()
