"""Shared-prefix (cascade) attention on forked rows: decode speed with the split on and off.

One prompt of `--prompt-tokens` tokens is prefilled once and kept as a snapshot; every run
restores it into `--rows` rows (a fork: the rows share the prompt's slots) and decodes
`--tokens` steps, each row greedily from its own first token (the prompt's top-`rows` tokens),
with `DecoderModel.use_shared_prefix` on or off. Runs alternate on / off (and a 1-row run for
reference) `--repeats` times, so a machine whose load changes during the benchmark affects both
alike; the table reports the median and the best run.

    decode tokens/s = rows · tokens / decode seconds
    attention ms/step = time inside the attention kernels (paged_decode_attention, or
                        shared_prefix_attention + paged_attention_part + combine_attention_parts)
                        summed over the layers, per decode step

Run:  PYTHONPATH=src .venv/bin/python benchmarks/shared_prefix.py --markdown
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch

from metagen.models import load

TEXT = ("The lighthouse keeper climbed the spiral stairs every evening, counting the steps, checking the lamp, "
        "and writing the weather into a logbook that nobody had read for forty years. ")
ATTENTION_KERNELS = ("paged_decode_attention", "shared_prefix_attention", "paged_attention_part",
                     "combine_attention_parts")


class TimedKernels:
    """The fused kernels module with the attention kernels timed (perf_counter per call)."""

    def __init__(self, module) -> None:
        self.module, self.seconds = module, 0.0
        for name in ATTENTION_KERNELS:
            setattr(self, name, self._timed(getattr(module, name)))

    def _timed(self, kernel):
        def call(*args):
            start = time.perf_counter()
            out = kernel(*args)
            self.seconds += time.perf_counter() - start
            return out
        return call

    def __getattr__(self, name):
        return getattr(self.module, name)


def run(model, cache, snapshot, first_tokens, rows: int, tokens: int, split: bool) -> tuple[float, float]:
    """Decode `tokens` steps on `rows` rows forked from the snapshot: (tokens/s, attention ms per step)."""
    model.use_shared_prefix = split
    cache.restore([snapshot] * rows)
    timed = model.kernels
    ids = [[int(t)] for t in first_tokens[:rows]]
    timed.seconds = 0.0
    start = time.perf_counter()
    for _ in range(tokens):
        logits = model.forward(cache, ids).logits
        ids = [[int(t)] for t in logits.argmax(-1)]
    seconds = time.perf_counter() - start
    return rows * tokens / seconds, 1e3 * timed.seconds / tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", default="auto", help="weights of the embedded model (default: auto)")
    parser.add_argument("--prompt-tokens", type=int, default=2000)
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=32, help="decode steps per run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = load(dtype=args.dtype)
    if model.kernels is None:
        raise SystemExit("the fused kernels could not be built: the split runs only on the fused path")
    model.kernels = TimedKernels(model.kernels)
    unit = model.tokenizer.encode(TEXT)
    prompt = (unit * (args.prompt_tokens // len(unit) + 1))[: args.prompt_tokens]
    cache = model.new_cache(1, capacity=args.prompt_tokens + 2 * args.rows * args.tokens + 64)
    first_tokens = model.forward(cache, [prompt]).logits[0].topk(args.rows).indices
    snapshot = cache.snapshot(0)
    results: dict[str, list[tuple[float, float]]] = {"1 row": [], "off": [], "on": []}
    run(model, cache, snapshot, first_tokens, args.rows, 2, True)  # warm-up
    for _ in range(args.repeats):
        for label, rows, split in (("off", args.rows, False), ("on", args.rows, True), ("1 row", 1, True)):
            results[label].append(run(model, cache, snapshot, first_tokens, rows, args.tokens, split))
    model.use_shared_prefix = True
    header = (f"{platform.processor() or platform.machine()}, {args.threads} threads, torch {torch.__version__}, "
              f"weights {model.dtype}, prompt {args.prompt_tokens} tokens, {args.tokens} steps, "
              f"{args.repeats} alternating repeats")
    print(header)
    lines = ["| rows | split | decode tok/s (median) | best | attention ms/step (median) | best |",
             "|---:|---|---:|---:|---:|---:|"]
    for label in ("1 row", "off", "on"):
        speeds = [r[0] for r in results[label]]
        attention = [r[1] for r in results[label]]
        rows = 1 if label == "1 row" else args.rows
        split = "—" if label == "1 row" else label
        lines.append(f"| {rows} | {split} | {statistics.median(speeds):.1f} | {max(speeds):.1f} | "
                     f"{statistics.median(attention):.2f} | {min(attention):.2f} |")
    off, on = (statistics.median(r[0] for r in results[k]) for k in ("off", "on"))
    att_off, att_on = (statistics.median(r[1] for r in results[k]) for k in ("off", "on"))
    lines.append("")
    lines.append(f"split on / off: decode speed {on / off:.2f}×, attention time {att_on / att_off:.2f}×; "
                 f"{args.rows} rows on = {args.rows * statistics.median(r[0] for r in results['1 row']) / on:.2f}× "
                 f"the wall time of 1 row per token")
    print("\n".join(lines) if args.markdown else "\n".join(lines).replace("|", " "))


if __name__ == "__main__":
    main()
