"""Train a prefix value head (CD-FUDGE) on the embedded model's own arithmetic samples.

Samples `--samples` completions of each of `--problems` built-in arithmetic problems (task seed
`--task-seed`, disjoint from the evaluation's seed 0 draw), labels each with the exact-answer
verifier, keeps the hidden state at every prefix and fits a linear and an MLP head with CD-FUDGE
(every prefix regresses its completion's reward) and with CD-Q (Bellman targets), problems held
out whole. Prints / writes held-out AUC, Brier
score and calibration error at prefix fractions 0, ¼, ½, ¾, 1 and saves the heads.

Run:  .venv/bin/python benchmarks/value_head.py --out runs/value_head
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict
from pathlib import Path

import torch

from metagen.eval import arithmetic_problems
from metagen.models import load
from metagen.sampling import SamplingParams
from metagen.scoring.exact_answer import ExactAnswerVerifier
from metagen.scoring.value_training import collect_value_data, train_value_head


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problems", type=int, default=400)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--task-seed", type=int, default=1)
    parser.add_argument("--temperature", type=float, default=0.5)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--mlp-hidden", type=int, default=64)
    parser.add_argument("--heads", default="linear,mlp,linear_cdq",
                        help="comma-separated from linear, mlp, linear_cdq, mlp_cdq (MLP CD-Q: 5x the MLP time)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    heads = {"linear": (None, "fudge"), "mlp": (args.mlp_hidden, "fudge"), "linear_cdq": (None, "cd_q"),
             "mlp_cdq": (args.mlp_hidden, "cd_q")}
    chosen = args.heads.split(",")
    for name in chosen:
        if name not in heads:
            raise SystemExit(f"--heads: {name!r} is not one of {', '.join(heads)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model = load()
    problems = arithmetic_problems(args.problems, args.task_seed)
    params = SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens)
    start = time.perf_counter()
    dataset = collect_value_data(model, problems, lambda p: ExactAnswerVerifier(p.answer, math=True), args.samples,
                                 params, generator=torch.Generator().manual_seed(0))
    collect_seconds = time.perf_counter() - start
    positives = int(dataset.rewards.sum())
    print(f"{len(dataset.lengths)} completions, {positives} correct, {dataset.hidden.shape[0]} prefix states, "
          f"{collect_seconds:.0f} s", flush=True)
    summary = {"problems": args.problems, "samples": args.samples, "completions": len(dataset.lengths),
               "correct": positives, "prefix_states": int(dataset.hidden.shape[0]),
               "collect_seconds": collect_seconds, "sampling_cost": dataset.cost.to_dict(), "heads": {}}
    for name in chosen:
        mlp, method = heads[name]
        head, report = train_value_head(dataset, mlp_hidden=mlp, steps=400, group_by_problem=True, method=method)
        head.save(out / f"value_head_{name}.safetensors")
        summary["heads"][name] = asdict(report)
        print(f"{name}: held-out AUC {report.held_out_auc:.3f}, base rate {report.base_rate:.3f}, "
              f"{report.seconds:.0f} s", flush=True)
        for metrics in report.at_fraction:
            print(f"  t = {metrics.fraction:.2f}|y|: AUC {metrics.auc:.3f}  Brier {metrics.brier:.4f}  "
                  f"ECE {metrics.ece:.4f}  ({metrics.count} completions)", flush=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    main()
