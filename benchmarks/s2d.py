"""S2D's acceptance per nested target: one sorted draft (early exits of the embedded model at
`--draft-depths`) serving targets at `--target-depths` of the same model, greedy, on the
`speculative.py` prompts (`--prompts` of each kind).

Per target depth, summed over the prompts: acceptance (accepted / proposed draft tokens), draft
tokens per target forward, tokens per target forward (block efficiency, the prefill counted),
the share of draft tokens each sub-model supplied, and the decode seconds of S2D and of plain
greedy decoding of the same target (under whatever load the machine carries).

Run:  PYTHONPATH=src .venv/bin/python benchmarks/s2d.py --target-depths 15,20,25,30 --draft-depths 4,8
"""

from __future__ import annotations

import argparse

from speculative import GROUNDED, OPEN, chat

from metagen.decoding import generate
from metagen.models import load
from metagen.sampling import SamplingParams
from metagen.speculative import SpeculativeConfig, early_exit_model, speculative_generate
from metagen.speculative.s2d import SortedDraft


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="fp32")
    parser.add_argument("--target-depths", default="15,20,25,30")
    parser.add_argument("--draft-depths", default="4,8")
    parser.add_argument("--threshold", type=float, default=0.5)
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=48)
    args = parser.parse_args()
    base = load(dtype=args.dtype)
    draft = SortedDraft(base, [int(d) for d in args.draft_depths.split(",")], default_threshold=args.threshold)
    prompts = GROUNDED[: args.prompts] + OPEN[: args.prompts]
    params = SamplingParams(temperature=0, max_tokens=args.tokens)
    print(f"{args.dtype}, draft exits {draft.draft_depths}, θ = {args.threshold}, γ = {args.gamma}, "
          f"{len(prompts)} prompts, {args.tokens} tokens at most")
    print("| target depth | acceptance | draft tokens / target fwd | block eff. | tokens per sub-model | "
          "S2D decode s | plain decode s |")
    print("|---|---|---|---|---|---|---|")
    for depth in (int(d) for d in args.target_depths.split(",")):
        target = base if depth == base.config.num_hidden_layers else early_exit_model(base, depth)
        totals = {"accepted": 0, "proposed": 0, "steps": 0, "tokens": 0, "s2d": 0.0, "plain": 0.0}
        selected = [0] * len(draft.draft_depths)
        for prompt in prompts:
            drafter = draft.drafter(target)
            result = speculative_generate(target, drafter, chat(prompt), params,
                                          SpeculativeConfig(num_draft_tokens=args.gamma))
            plain = generate(target, chat(prompt), params)
            cost = result.cost
            totals["accepted"] += cost.accepted_tokens
            totals["proposed"] += cost.draft_tokens
            totals["steps"] += cost.target_steps
            totals["tokens"] += len(result.completions[0].token_ids)
            totals["s2d"] += result.decode_seconds
            totals["plain"] += plain.decode_seconds
            selected = [a + b for a, b in zip(selected, drafter.selected)]
        share = "/".join(f"{n / max(sum(selected), 1):.2f}" for n in selected)
        print(f"| {depth} | {totals['accepted'] / max(totals['proposed'], 1):.2f} | "
              f"{totals['proposed'] / max(totals['steps'], 1):.2f} | {totals['tokens'] / max(totals['steps'], 1):.2f} "
              f"| {share} | {totals['s2d']:.2f} | {totals['plain']:.2f} |", flush=True)


if __name__ == "__main__":
    main()
