"""Greedy accuracy of metagen's native backend next to llama.cpp on the same GGUF file, on a task of
`metagen eval` (humaneval, gsm8k, mbpp, math500).

Both engines get the same token ids: the request `metagen eval --task TASK` sends an instruct
model (`eval/code_prompts.request`: a code problem asked chat-style, a question as it is),
rendered by the model's chat template with metagen's tokenizer, then decoded greedily
(temperature 0) up to --max-tokens or the end of turn. metagen runs the file in its default
format with --activations (the sweep's int8 codes, or the default); llama.cpp runs it through
llama-cpp-python. Both replies are graded as `metagen eval` grades them (`eval/judging.reply_correct`:
a program against the hidden tests in the sandbox, an answer extracted and matched).

--sweep DIR takes metagen's replies from a `metagen eval --out DIR` run's greedy units of the same
file (its `results.jsonl`, read without being touched, so a running sweep may keep writing it)
instead of decoding them again; problems it has no greedy unit for are decoded here.

Where the two replies differ, --fp32 runs the file's fp32 model (every tensor dequantized, fp32
compute: `load(path, "fp32")`) greedily on that problem too: the engine whose reply equals fp32's
reproduces the checkpoint there. A peer that scores higher through its own rounding is lucky,
not more faithful; the table reports both.

Records are appended to --out/<task>/<model stem>.jsonl one problem at a time, so a killed run
resumes where it stopped.

    .venv/bin/python benchmarks/greedy_peer.py --task gsm8k --data test.jsonl --limit 100 \\
        --model models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf --out runs/greedy_peer \\
        [--activations int8] [--sweep runs/gsm8k] [--fp32] [--markdown]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from metagen.decoding import LocalGenerator
from metagen.decoding.prompts import encode_prompt
from metagen.eval import EvalConfig
from metagen.eval.code_prompts import request
from metagen.eval.judging import reply_correct
from metagen.eval.standard_tasks import load_task
from metagen.models import load
from metagen.sampling import SamplingParams
from metagen.tables import table

TASKS = ("humaneval", "gsm8k", "mbpp", "math500")
MAX_TOKENS = {"humaneval": 512, "mbpp": 512, "gsm8k": 384, "math500": 1024}  # the runs' settings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", action="append", required=True, help="a GGUF file (repeat for several)")
    parser.add_argument("--task", choices=TASKS, default="humaneval")
    parser.add_argument("--data", default=None, help="the task's file (gsm8k, mbpp, math500), as metagen eval --data")
    parser.add_argument("--out", required=True, help="directory for the per-model records (resumable)")
    parser.add_argument("--limit", type=int, default=None, help="the first N problems only")
    parser.add_argument("--max-tokens", type=int, default=None, help="default: the task's (humaneval 512, gsm8k 384)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--activations", default=None, help="metagen's activation codes (int8, int16; default: the "
                                                            "model's default)")
    parser.add_argument("--sweep", default=None, metavar="DIR",
                        help="read metagen's greedy replies from this metagen eval --out directory")
    parser.add_argument("--fp32", action="store_true", help="run the fp32 model where the engines' replies differ")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    if args.limit is not None and args.limit < 1:
        parser.error(f"--limit {args.limit} is out of range: must be >= 1")
    problems = load_task(args.task, args.data).problems[: args.limit]
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens or MAX_TOKENS[args.task])
    config = EvalConfig(("greedy",), ns=(1,), params=params)
    out = Path(args.out) / args.task
    out.mkdir(parents=True, exist_ok=True)
    rows = [run_model(Path(path), problems, config, out, args) for path in args.model]
    metric = "pass@1" if problems[0].is_code else "accuracy"
    print(f"{args.task}, {'first ' if args.limit else ''}{len(problems)} problems, greedy, the request metagen eval "
          f"sends, the same token ids in both engines (metagen activations: {args.activations or 'default'})\n")
    print(report(rows, metric, args.markdown))


def chat_ids(model, problem, config) -> list[int]:
    """The token ids of the request `metagen eval` sends a chat model for `problem`."""
    prompt, _ = request(problem, config, "chat" if problem.is_code else None)
    return encode_prompt(model.tokenizer, prompt)


def sweep_replies(directory: str, path: Path) -> dict[str, dict]:
    """Problem id -> the stored greedy unit of the model whose label is the file's stem, read line
    by line (a torn last line of a running sweep is skipped, the file left as it is)."""
    fingerprints, replies = set(), {}
    for line in (Path(directory) / "results.jsonl").read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("kind") == "setup" and record.get("model") == path.stem:
            fingerprints.add(record["fingerprint"])
        elif (record.get("kind") == "live" and record.get("strategy") == "greedy"
              and record["fingerprint"]["setup"] in fingerprints):
            replies[record["id"]] = record
    if not fingerprints:
        raise SystemExit(f"--sweep {directory}: no model labelled {path.stem!r} in its results.jsonl")
    return replies


def run_model(path: Path, problems, config, out: Path, args) -> dict:
    import torch

    torch.set_num_threads(args.threads)
    records_path = out / f"{path.stem}.jsonl"
    done = {}
    if records_path.exists():
        for line in records_path.read_text().splitlines():
            try:
                record = json.loads(line)
            except ValueError:  # a torn last line of a killed run
                continue
            done[record["id"]] = record
    todo = [p for p in problems if p.id not in done]
    if todo:
        from llama_cpp import Llama

        stored = sweep_replies(args.sweep, path) if args.sweep else {}
        model = load(str(path), activations=args.activations)
        generator = LocalGenerator(model)
        peer = Llama(model_path=str(path), n_ctx=4096, n_threads=args.threads, n_batch=512, verbose=False)
        with open(records_path, "a") as sink:
            for problem in todo:
                ids = chat_ids(model, problem, config)
                if problem.id in stored:
                    unit = stored[problem.id]
                    ours, ours_tokens = unit["text"], unit["cost"]["generated_tokens"]
                    ours_seconds, source = unit["cost"]["wall_seconds"], "sweep"
                else:
                    start = time.perf_counter()
                    completion = generator.generate(ids, config.params).completions[0]
                    ours_seconds, source = time.perf_counter() - start, "here"
                    ours, ours_tokens = completion.text, len(completion.token_ids or ())
                start = time.perf_counter()
                answer = peer.create_completion(prompt=ids, max_tokens=config.params.max_tokens, temperature=0.0)
                peer_seconds = time.perf_counter() - start
                theirs = answer["choices"][0]["text"]
                record = {"id": problem.id, "metagen": ours, "llama_cpp": theirs, "metagen_from": source,
                          "metagen_tokens": ours_tokens, "llama_cpp_tokens": answer["usage"]["completion_tokens"],
                          "metagen_seconds": ours_seconds, "llama_cpp_seconds": peer_seconds,
                          "metagen_passed": reply_correct(ours, problem, config),
                          "llama_cpp_passed": reply_correct(theirs, problem, config)}
                sink.write(json.dumps(record) + "\n")
                sink.flush()
                done[problem.id] = record
                print(f"{path.stem} {problem.id}: metagen {record['metagen_passed']}, llama.cpp "
                      f"{record['llama_cpp_passed']}, {'same' if ours == theirs else 'different'} text", flush=True)
        del model, generator, peer
    records = [done[p.id] for p in problems]
    if args.fp32:
        fp32_check(path, problems, config, records, records_path)
    return summarize(path.stem, records)


def fp32_check(path: Path, problems, config, records: list[dict], records_path: Path) -> None:
    """Run the fp32 model on every problem whose two replies differ and that has no fp32 reply yet."""
    by_id = {p.id: p for p in problems}
    todo = [r for r in records if r["metagen"] != r["llama_cpp"] and "fp32" not in r]
    if not todo:
        return
    reference = load(str(path), "fp32")
    generator = LocalGenerator(reference)
    for record in todo:
        problem = by_id[record["id"]]
        record["fp32"] = generator.generate(chat_ids(reference, problem, config), config.params).completions[0].text
        record["fp32_passed"] = reply_correct(record["fp32"], problem, config)
        print(f"{path.stem} {record['id']}: fp32 {record['fp32_passed']}", flush=True)
        with open(records_path, "a") as sink:  # the later record of an id replaces the earlier one
            sink.write(json.dumps(record) + "\n")


def summarize(name: str, records: list[dict]) -> dict:
    differ = [r for r in records if r["metagen"] != r["llama_cpp"]]
    checked = [r for r in differ if "fp32" in r]
    tokens = sum(r["metagen_tokens"] for r in records), sum(r["llama_cpp_tokens"] for r in records)
    seconds = sum(r["metagen_seconds"] for r in records), sum(r["llama_cpp_seconds"] for r in records)
    return {"model": name, "problems": len(records),
            "metagen": sum(r["metagen_passed"] for r in records), "llama_cpp": sum(r["llama_cpp_passed"] for r in records),
            "differ": len(differ), "fp32_checked": len(checked),
            "metagen_is_fp32": sum(r["fp32"] == r["metagen"] for r in checked),
            "llama_cpp_is_fp32": sum(r["fp32"] == r["llama_cpp"] for r in checked),
            "fp32_passed": sum(r["fp32_passed"] for r in checked),
            "metagen_tok_s": tokens[0] / max(seconds[0], 1e-9), "llama_cpp_tok_s": tokens[1] / max(seconds[1], 1e-9)}


def report(rows: list[dict], metric: str, markdown: bool) -> str:
    header = ["model", f"metagen {metric}", f"llama.cpp {metric}", "replies differ", "fp32 run on", "= metagen",
              "= llama.cpp", "fp32 right", "metagen tok/s", "llama.cpp tok/s"]
    lines = []
    for r in rows:
        n = r["problems"]
        lines.append([r["model"], f"{r['metagen'] / n:.3f} ({r['metagen']}/{n})",
                      f"{r['llama_cpp'] / n:.3f} ({r['llama_cpp']}/{n})", str(r["differ"]), str(r["fp32_checked"]),
                      str(r["metagen_is_fp32"]), str(r["llama_cpp_is_fp32"]), str(r["fp32_passed"]),
                      f"{r['metagen_tok_s']:.1f}", f"{r['llama_cpp_tok_s']:.1f}"])
    return table(header, lines, markdown)


if __name__ == "__main__":
    main()
