"""Two-model token-level decoders on real tasks: accuracy and compute against the large model alone.

A small and a large model sharing a tokenizer (Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF and
Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF, Q4_K_M; `benchmarks/qwen_models.py` assembles them) decode
the first `--gsm8k` GSM8K test problems and the first `--humaneval` HumanEval problems greedily,
one problem at a time, with each decoder:

    large alone           greedy with the 1.5B model
    small alone           greedy with the 0.5B model
    contrastive           expert = large, amateur = small, α = 0.1, β = 0.5 (O'Brien & Lewis's setting
                          for reasoning: (1 + β)·s_large − β·s_small on the α-plausible tokens)
    DExperts              base = expert = large, anti-expert = small, α = 0.5: log p_large + α·(log p_large
                          − log p_small), i.e. the same contrast without the plausibility cut
    entropy-adaptive      the small model decodes; the large one takes over while the small one's rolling
                          entropy (window 5) is above τ bits, for each τ of `--ead-thresholds`

GSM8K prompts are the question plus an instruction to end with "The answer is N", graded by the
last number matched against the reference (`scoring.answers`, as math); HumanEval prompts are
metagen's chat-style code request, graded by running the problem's hidden tests in the sandbox
(`eval.code_grading`). FLOPs are `result.cost.flops` (every model's forwards, prefill included).

Results are appended to `--out` (JSONL, one line per decoder × problem), so an interrupted run
resumes where it stopped; `--report` prints the tables from that file without running anything.

    PYTHONPATH=src .venv/bin/python benchmarks/decoders_tasks.py --gsm8k-data PATH/test.jsonl \\
        --small models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf --large models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

from metagen.decoding import ContrastiveConfig, DExpertsConfig, EntropyAdaptiveConfig, generate
from metagen.eval.code_grading import grade
from metagen.eval.code_prompts import code_prompt
from metagen.eval.tasks import Problem, humaneval_problems
from metagen.models import load
from metagen.sampling import SamplingParams
from metagen.scoring.answers import answers_match, extract_answer

GSM8K_SUFFIX = "\nSolve it step by step, then end with the line 'The answer is N' where N is a number."


def gsm8k_problems(path: Path, count: int) -> list[Problem]:
    """The first `count` problems of GSM8K's test.jsonl (question, answer ending in '#### N')."""
    problems = []
    with open(path, encoding="utf-8") as lines:
        for number, line in enumerate(lines):
            if len(problems) == count:
                break
            record = json.loads(line)
            problems.append(Problem(f"gsm8k/{number}", record["question"],
                                    record["answer"].rsplit("####", 1)[1].strip().replace(",", "")))
    return problems


def decoders(small, large, thresholds: list[float]) -> dict[str, tuple]:
    """name -> (generating model, combiner)."""
    table = {
        "large alone": (large, None),
        "small alone": (small, None),
        "contrastive (α 0.1, β 0.5)": (large, ContrastiveConfig(small, alpha=0.1, beta=0.5)),
        "DExperts (anti = small, α 0.5)": (large, DExpertsConfig(large, small, alpha=0.5)),
    }
    for threshold in thresholds:
        table[f"entropy-adaptive (τ {threshold:g} bits)"] = (small, EntropyAdaptiveConfig(large, threshold=threshold))
    return table


def run_one(model, combiner, problem: Problem, max_tokens: int) -> dict:
    prompt = code_prompt(problem.question, "chat") if problem.is_code else problem.question + GSM8K_SUFFIX
    start = time.perf_counter()
    result = generate(model, prompt, SamplingParams(temperature=0, max_tokens=max_tokens), chat=True,
                      combiner=combiner)
    seconds = time.perf_counter() - start
    text = result.completions[0].text
    if problem.is_code:
        correct = grade(problem, text).passed
    else:
        correct = answers_match(extract_answer(text), problem.answer, True)
    return {"correct": bool(correct), "tokens": len(result.completions[0].token_ids), "flops": result.cost.flops,
            "calls": result.cost.model_calls, "seconds": seconds, "model_tokens": dict(result.model_tokens)}


def _timing(records: list[dict], base_seconds: dict[str, float], timed: str | None) -> list[str]:
    """[seconds per problem, wall-time ratio to the large model alone] over the timed records."""
    seconds = {r["id"]: r["seconds"] for r in records if timed in (None, r["commit"])}
    if not seconds:
        return ["–", "–"]
    shared = [key for key in seconds if key in base_seconds]
    ratio = (f"{sum(seconds[k] for k in shared) / sum(base_seconds[k] for k in shared):.2f}×"
             if shared else "–")
    return [f"{sum(seconds.values()) / len(seconds):.1f}", ratio]


def report(path: Path, markdown: bool, timed: str | None = None) -> None:
    """The tables of `path`; wall time from the records of commit `timed` only (a run on an idle
    machine; default: every record), as seconds per problem and as a ratio to the large model
    alone on the problems both have timed."""
    rows: dict[tuple[str, str], list[dict]] = {}
    for line in path.read_text().splitlines():
        record = json.loads(line)
        rows.setdefault((record["task"], record["decoder"]), []).append(record)
    for task in dict.fromkeys(task for task, _ in rows):
        base = rows.get((task, "large alone"))
        base_flops = sum(r["flops"] for r in base) if base else None
        base_seconds = {r["id"]: r["seconds"] for r in base or () if timed in (None, r["commit"])}
        header = ["decoder", "problems", "correct", "accuracy", "tokens", "FLOPs vs large alone", "s / problem",
                  "wall vs large alone", "tokens by model"]
        lines = []
        for (t, decoder), records in rows.items():
            if t != task:
                continue
            flops = sum(r["flops"] for r in records)
            shares: dict[str, int] = {}
            for r in records:
                for role, count in r["model_tokens"].items():
                    shares[role] = shares.get(role, 0) + count
            total = sum(shares.values())
            mix = ", ".join(f"{role} {count / total:.0%}" for role, count in sorted(shares.items())) if total else ""
            same = base is not None and len(base) == len(records)
            lines.append([decoder, str(len(records)), str(sum(r["correct"] for r in records)),
                          f"{sum(r['correct'] for r in records) / len(records):.2f}",
                          str(sum(r["tokens"] for r in records)),
                          f"{flops / base_flops:.2f}×" if same and base_flops else "?",
                          *_timing(records, base_seconds, timed), mix])
        timed_problems = len(base_seconds)
        print(f"\n{task}" + (f" (wall time: the {timed_problems} problems timed at {timed})" if timed else ""))
        if markdown:
            print("| " + " | ".join(header) + " |\n|" + "---|" * len(header))
            print("\n".join("| " + " | ".join(line) + " |" for line in lines))
        else:
            for line in [header, *lines]:
                print("  ".join(line))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", type=Path, default=Path("models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"))
    parser.add_argument("--large", type=Path, default=Path("models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"))
    parser.add_argument("--gsm8k-data", type=Path, help="GSM8K's test.jsonl (question, answer per line)")
    parser.add_argument("--gsm8k", type=int, default=20, help="first N GSM8K test problems (0: none)")
    parser.add_argument("--humaneval", type=int, default=20, help="first N HumanEval problems (0: none)")
    parser.add_argument("--gsm8k-tokens", type=int, default=320)
    parser.add_argument("--humaneval-tokens", type=int, default=384)
    parser.add_argument("--ead-thresholds", default="0.5,1.5", help="entropy-adaptive thresholds, bits, comma-separated")
    parser.add_argument("--decoders", default=None, help="comma-separated decoder names to run (default: all)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("decoders_tasks.jsonl"))
    parser.add_argument("--report", action="store_true", help="print the tables of --out and stop")
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--timed", default=None, metavar="COMMIT",
                        help="--report: wall time from the records of this commit only (an idle run)")
    args = parser.parse_args()
    if args.report:
        report(args.out, args.markdown, args.timed)
        return
    torch.set_num_threads(args.threads)
    problems: list[tuple[str, Problem, int]] = []
    if args.gsm8k:
        if args.gsm8k_data is None:
            parser.error("--gsm8k-data PATH is required when --gsm8k > 0")
        problems += [("gsm8k", p, args.gsm8k_tokens) for p in gsm8k_problems(args.gsm8k_data, args.gsm8k)]
    if args.humaneval:
        code = [("humaneval", p, args.humaneval_tokens) for p in humaneval_problems()[:args.humaneval]]
        problems = [entry for pair in zip(problems, code) for entry in pair] + problems[len(code):] + code[len(problems):]
    small, large = load(args.small), load(args.large)
    table = decoders(small, large, [float(t) for t in args.ead_thresholds.split(",")])
    wanted = args.decoders.split(",") if args.decoders else list(table)
    unknown = [name for name in wanted if name not in table]
    if unknown:
        parser.error(f"unknown decoders {unknown}; known: {list(table)}")
    done = set()
    if args.out.exists():
        done = {(r["task"], r["decoder"], r["id"]) for r in map(json.loads, args.out.read_text().splitlines())}
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    print(f"commit {commit}, {len(problems)} problems, decoders {wanted}, {args.threads} threads", file=sys.stderr)
    with open(args.out, "a", encoding="utf-8") as sink:
        for task, problem, max_tokens in problems:  # every decoder on a problem, then the next problem:
            for name in wanted:                      # a partial run compares every decoder on the same problems
                model, combiner = table[name]
                if (task, name, problem.id) in done:
                    continue
                record = {"task": task, "decoder": name, "id": problem.id, "commit": commit,
                          **run_one(model, combiner, problem, max_tokens)}
                sink.write(json.dumps(record) + "\n")
                sink.flush()
                print(f"{name} {problem.id}: {'ok' if record['correct'] else 'wrong'} "
                      f"({record['tokens']} tokens, {record['seconds']:.1f} s)", file=sys.stderr, flush=True)
    report(args.out, args.markdown)


if __name__ == "__main__":
    main()
