"""PEARL (draft and target in two threads) against sequential speculative decoding and plain decoding.

Same prompts as `speculative.py` (grounded and open, `--prompts` of each), temperature 0, one
target and one draft (`--draft quantized`: the int4 copy of the target; `early-exit`: its first
`--exit-layer` layers). Rows, each summed over the prompts (the methods take turns on each prompt,
`--repeats` rounds, after an 8-token warm-up call each):

- plain: `decoding.generate` on `--threads` intra-op threads (default torch's);
- sd: the loop with the same draft as a `ModelDrafter` (γ = `--gamma`, token rule);
- pearl serial: the PEARL schedule with the draft run before the target each round
  (`parallel=False`), on `--threads` — its per-round draft and target seconds give
  the ideal parallel time Σ max(draft, target) + the rest of each round;
- pearl parallel: draft and target in two threads of `--threads-each` intra-op threads.

Hardware-independent columns first — target forwards and draft forwards per generated token —
then decode seconds, decode tokens/s and, for PEARL, the ideal parallel seconds (from the serial
run) against the measured ones (the parallel run).

Run:  PYTHONPATH=src .venv/bin/python benchmarks/pearl.py --target fp32 --draft quantized --gamma 4 --prompts 2
"""

from __future__ import annotations

import argparse
import time

import torch
from speculative import GROUNDED, OPEN, chat

from metagen.decoding import generate
from metagen.models import load
from metagen.sampling import SamplingParams
from metagen.speculative import ModelDrafter, SpeculativeConfig, speculative_generate
from metagen.speculative.pearl import PearlDrafter
from metagen.speculative.self_draft import early_exit_model, quantized_model


def draft_model(target, args):
    if args.draft == "quantized":
        return quantized_model(target, "int4")
    return early_exit_model(target, args.exit_layer)


def run_once(method: str, target, draft, prompt, params, args):
    """(result, draft forwards, stats or None) of one call of `method`."""
    if method == "plain":
        return generate(target, chat(prompt), params), 0, None
    if method == "sd":
        drafter, verify = ModelDrafter(draft, share_prompt_cache=True), "token"
    else:
        drafter = PearlDrafter(draft, parallel=method == "pearl parallel", threads=args.threads_each,
                               share_prompt_cache=True)
        verify = "pearl"
    result = speculative_generate(target, drafter, chat(prompt), params,
                                  SpeculativeConfig(num_draft_tokens=args.gamma, verify=verify))
    return result, result.cost.model_calls - result.cost.target_steps, getattr(drafter, "stats", None)


def run(methods: list[str], target, draft, prompts, args) -> dict[str, dict]:
    """Totals per method; the methods take turns on each prompt (`--repeats` times), so a change
    in the machine's load falls on all of them alike."""
    warm_up, measured = SamplingParams(temperature=0, max_tokens=8), SamplingParams(temperature=0, max_tokens=args.tokens)
    totals = {method: {"tokens": 0, "decode": 0.0, "target": 0, "draft": 0, "ideal": 0.0, "accepted": 0,
                       "proposed": 0} for method in methods}
    for method in methods:
        run_once(method, target, draft, prompts[0], warm_up, args)
    for _ in range(args.repeats):
        for prompt in prompts:
            for method in methods:
                result, draft_forwards, stats = run_once(method, target, draft, prompt, measured, args)
                t = totals[method]
                t["tokens"] += len(result.completions[0].token_ids)
                t["decode"] += result.decode_seconds
                t["target"] += result.cost.target_steps
                t["draft"] += draft_forwards
                t["accepted"] += result.cost.accepted_tokens
                t["proposed"] += result.cost.draft_tokens
                t["ideal"] += stats.ideal_parallel_seconds if stats is not None else 0.0
    return totals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="fp32", choices=("fp32", "bf16", "int8", "int4"))
    parser.add_argument("--draft", default="quantized", choices=("quantized", "early-exit"))
    parser.add_argument("--exit-layer", type=int, default=8)
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--kinds", default="grounded,open", help="prompt kinds: grounded, open")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--unfused", action="store_true",
                        help="decode steps through PyTorch ops instead of the fused kernels")
    parser.add_argument("--threads-each", type=int, default=1)
    parser.add_argument("--threads", type=int, default=None,
                        help="torch intra-op threads of the one-thread methods (default: torch's own)")
    parser.add_argument("--methods", default="plain,sd,pearl serial,pearl parallel")
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    target = load(dtype=args.target)
    draft = draft_model(target, args)
    if args.unfused:
        target.use_fused = draft.use_fused = False
    kinds = args.kinds.split(",")
    prompts = (GROUNDED[: args.prompts] if "grounded" in kinds else []) + (OPEN[: args.prompts] if "open" in kinds else [])
    print(f"target {args.target}, draft {args.draft}, γ = {args.gamma}, {len(prompts)} prompts, "
          f"{args.tokens} tokens at most, torch threads {torch.get_num_threads()}, fused kernels {not args.unfused}, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print("| method | target fwd/token | draft fwd/token | acceptance | decode s | decode tok/s | ideal parallel s |")
    print("|---|---|---|---|---|---|---|")
    methods = args.methods.split(",")
    for method, t in run(methods, target, draft, prompts, args).items():
        tokens = max(t["tokens"], 1)
        acceptance = f"{t['accepted'] / t['proposed']:.2f}" if t["proposed"] else "–"
        ideal = f"{t['ideal']:.2f}" if method == "pearl serial" else "–"
        print(f"| {method} | {t['target'] / tokens:.3f} | {t['draft'] / tokens:.3f} | {acceptance} | {t['decode']:.2f} "
              f"| {tokens / t['decode']:.1f} | {ideal} |", flush=True)

if __name__ == "__main__":
    main()
