"""Greedy HumanEval pass@1 of metagen's native backend next to llama.cpp on the same GGUF file.

Both engines get the same token ids: the problem asked chat-style (`eval/code_prompts.py`, the
request `metagen eval --task humaneval` sends an instruct model), rendered by the model's chat
template with metagen's tokenizer, then decoded greedily (temperature 0) up to --max-tokens or
the end of turn. metagen runs the file in its default format ("auto": each tensor as the file
stores it); llama.cpp runs it through llama-cpp-python. Both replies are graded by metagen's
grader (`eval/code_grading.py`: the hidden tests in the sandbox).

Where the two replies differ, the file's fp32 model (every tensor dequantized, fp32 compute:
`load(path, "fp32")`) is run greedily on that problem too: the engine whose reply equals fp32's
reproduces the checkpoint there. A peer that scores higher through its own rounding is lucky,
not more faithful; the table reports both.

Records are appended to --out/<model stem>.jsonl one problem at a time, so a killed run
resumes where it stopped.

    .venv/bin/python benchmarks/humaneval_peer.py --model models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf \\
        --out runs/humaneval_peer [--limit 40] [--fp32] [--markdown]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from metagen.decoding import LocalGenerator
from metagen.decoding.prompts import encode_prompt
from metagen.eval.code_grading import grade
from metagen.eval.code_prompts import code_prompt
from metagen.eval.tasks import humaneval_problems
from metagen.models import load
from metagen.sampling import SamplingParams


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", action="append", required=True, help="a GGUF file (repeat for several)")
    parser.add_argument("--out", required=True, help="directory for the per-model records (resumable)")
    parser.add_argument("--limit", type=int, default=None, help="the first N problems only")
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--fp32", action="store_true", help="run the fp32 model where the engines' replies differ")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    problems = humaneval_problems()[: args.limit]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = [run_model(Path(path), problems, out, args) for path in args.model]
    print(table(rows, len(problems)))


def run_model(path: Path, problems, out: Path, args) -> dict:
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

        model = load(str(path))
        generator = LocalGenerator(model)
        peer = Llama(model_path=str(path), n_ctx=4096, n_threads=args.threads, n_batch=512, verbose=False)
        params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
        with open(records_path, "a") as sink:
            for problem in todo:
                ids = encode_prompt(model.tokenizer, code_prompt(problem.question, "chat"))
                start = time.perf_counter()
                ours = generator.generate(ids, params).completions[0]
                ours_seconds = time.perf_counter() - start
                start = time.perf_counter()
                answer = peer.create_completion(prompt=ids, max_tokens=args.max_tokens, temperature=0.0)
                peer_seconds = time.perf_counter() - start
                theirs = answer["choices"][0]["text"]
                record = {"id": problem.id, "metagen": ours.text, "llama_cpp": theirs,
                          "metagen_tokens": len(ours.token_ids or ()),
                          "llama_cpp_tokens": answer["usage"]["completion_tokens"],
                          "metagen_seconds": ours_seconds, "llama_cpp_seconds": peer_seconds,
                          "metagen_passed": grade(problem, ours.text).passed,
                          "llama_cpp_passed": grade(problem, theirs).passed}
                sink.write(json.dumps(record) + "\n")
                sink.flush()
                done[problem.id] = record
                print(f"{path.stem} {problem.id}: metagen {record['metagen_passed']}, llama.cpp "
                      f"{record['llama_cpp_passed']}, {'same' if ours.text == theirs else 'different'} text", flush=True)
        del model, generator, peer
    records = [done[p.id] for p in problems]
    if args.fp32:
        fp32_check(path, problems, records, records_path, args)
    return summarize(path.stem, records)


def fp32_check(path: Path, problems, records: list[dict], records_path: Path, args) -> None:
    """Run the fp32 model on every problem whose two replies differ and that has no fp32 reply yet."""
    by_id = {p.id: p for p in problems}
    todo = [r for r in records if r["metagen"] != r["llama_cpp"] and "fp32" not in r]
    if not todo:
        return
    reference = load(str(path), "fp32")
    generator = LocalGenerator(reference)
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    for record in todo:
        ids = encode_prompt(reference.tokenizer, code_prompt(by_id[record["id"]].question, "chat"))
        record["fp32"] = generator.generate(ids, params).completions[0].text
        record["fp32_passed"] = grade(by_id[record["id"]], record["fp32"]).passed
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


def table(rows: list[dict], problems: int) -> str:
    lines = [f"HumanEval, first {problems} problems, greedy, chat-style request, same token ids in both engines", "",
             "| model | metagen pass@1 | llama.cpp pass@1 | replies differ | fp32 run on | = metagen | = llama.cpp "
             "| fp32 passes | metagen tok/s | llama.cpp tok/s |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        n = r["problems"]
        lines.append(f"| {r['model']} | {r['metagen'] / n:.3f} ({r['metagen']}/{n}) | "
                     f"{r['llama_cpp'] / n:.3f} ({r['llama_cpp']}/{n}) | {r['differ']} | {r['fp32_checked']} | "
                     f"{r['metagen_is_fp32']} | {r['llama_cpp_is_fp32']} | {r['fp32_passed']} | "
                     f"{r['metagen_tok_s']:.1f} | {r['llama_cpp_tok_s']:.1f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
