"""Tree search, controlled decoding and sampling baselines at matched compute on arithmetic.

The embedded SmolLM2-135M-Instruct (int4) on the built-in arithmetic task (seed 0, the
evaluation draw; the value head is trained on seed-1 problems by benchmarks/value_head.py),
temperature 0.5, at most 128 new tokens, steps ending at a newline. Two harness runs:

- sampling baselines: greedy, and self-consistency at n = 4, 8, 16 from one pool of 16 samples
  per problem (n-subsets averaged);
- value-guided strategies at n = 4, 8 (what n means per search: strategies/tree/runner.py):
  best-of-N by the value, step-level beam search, DVTS, REBASE, MCTS, A*, particle filtering,
  blockwise CD (blocks of 16 tokens), tokenwise CD (top-n, λ = 4), all guided by `--value`
  (a value-head file, "steps" for the exact step verifier, or "judge").

Prints one markdown table: accuracy ± standard error, its 95% bootstrap interval over problems,
generated tokens, TFLOPs per problem (the value's share), the share of prompt + prefix tokens
computed against what re-prefilling every expansion would compute, and whether the point is on
the accuracy-vs-FLOPs frontier (`metagen.eval.frontier`: no other point is at least as accurate
for fewer FLOPs); then the "at budget C use X" table. figures_*/frontier.png draws them.
Results are resumable (`--out`); the baselines are shared by runs with different values in the
same `--out`.

Run:  .venv/bin/python benchmarks/tree_search.py --value runs/value_head/value_head_linear.safetensors \\
          --out runs/tree_search --markdown
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from metagen.decoding import LocalGenerator
from metagen.eval import EvalConfig, arithmetic_problems, evaluate
from metagen.eval.fingerprint import model_identity
from metagen.eval.frontier import format_compute_optimal, frontier
from metagen.eval.config import ORACLE, EvalReport
from metagen.models import load
from metagen.sampling import SamplingParams
from metagen.strategies.registry import StrategyOptions

SEARCHES = ("best_of_n_value", "step_beam", "dvts", "rebase", "mcts", "astar", "particle_filter", "blockwise_cd",
            "tokenwise_cd")


def table(points) -> str:
    best = {point.key for point in frontier(points).points}
    lines = ["| strategy | n | accuracy | 95% interval | generated tokens | TFLOPs (value) | prefix computed / naive "
             "| frontier |", "|---|---|---|---|---|---|---|---|"]
    for p in points:
        cost = p.cost
        naive = cost.prompt_tokens_computed + cost.prompt_tokens_reused
        share = f"{cost.prompt_tokens_computed / naive:.3f}" if naive else "–"
        lines.append(f"| {p.strategy} | {p.n} | {p.accuracy:.3f} ± {p.stderr:.3f} | "
                     f"[{p.interval[0]:.3f}, {p.interval[1]:.3f}] | {cost.generated_tokens:.0f} | "
                     f"{cost.flops / 1e12:.3f} ({cost.scorer_flops / 1e12:.4f}) | {share} | "
                     f"{'yes' if p.key in best else ''} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--value", required=True)
    parser.add_argument("--count", type=int, default=60)
    parser.add_argument("--ns", default="4,8")
    parser.add_argument("--strategies", default=",".join(SEARCHES))
    parser.add_argument("--aggregation", default="best")
    parser.add_argument("--out", required=True)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    out = Path(args.out)
    model = load()
    generator = LocalGenerator(model)
    problems = arithmetic_problems(args.count, 0)
    params = SamplingParams(temperature=0.5, max_tokens=128)
    started = time.perf_counter()

    def progress(label):
        return lambda done, total: print(f"{label}: {done}/{total} problems, {time.perf_counter() - started:.0f} s",
                                         flush=True)

    baselines = evaluate(generator, problems, EvalConfig(("greedy", "self_consistency"), (4, 8, 16), params),
                         out / "baselines", model=model_identity(model), progress=progress("baselines"))
    options = StrategyOptions(value=args.value, aggregation=args.aggregation)
    ns = tuple(int(n) for n in args.ns.split(","))
    searches = evaluate(generator, problems, EvalConfig(tuple(args.strategies.split(",")), ns, params, options=options),
                        out / f"searches_{Path(args.value).stem}", model=model_identity(model),
                        progress=progress("searches"))
    points = [p for p in baselines.points + searches.points if p.strategy != ORACLE]
    report = EvalReport(points + [p for p in baselines.points if p.strategy == ORACLE])
    figures = out / f"figures_{Path(args.value).stem}"
    figures.mkdir(parents=True, exist_ok=True)
    (figures / "summary.json").write_text(json.dumps(report.to_dict(), indent=1) + "\n")
    from metagen.eval.plots import plot_curves, plot_frontier

    title = f"SmolLM2-135M int4, {len(problems)} arithmetic problems, value: {Path(args.value).stem}"
    plot_curves(report, figures, title=title)
    plot_frontier(points, figures / "frontier.png", title=title)
    print(table(points) + "\n\n" + format_compute_optimal(points) if args.markdown else json.dumps(report.to_dict()))


if __name__ == "__main__":
    main()
