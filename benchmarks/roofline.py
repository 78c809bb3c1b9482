"""Where the milliseconds of one decode step go, next to what the machine allows (a roofline).

For each op of one decode step at batch 1 and 16 (default `--rows 1,16`; `--tokens 1,5` adds a
γ = 4 speculative verification: 5 new tokens per row), the roofline model
time ≥ max(FLOPs / peak FLOP/s, bytes / bandwidth), with this machine's peak and bandwidth
measured here, beside the measured time of the op:

- each kind of linear (qkv, o, gate_up, down) and the LM head, on activations of the step's
  shape: every linear of the model called once in the step's order (layer by layer), each call
  timed, summed per kind; the median over passes. Every weight is read once per pass, as in a
  step, so no weight is still in cache from its own previous call (timing one layer's linear in
  a loop would measure cache, not memory). FLOPs = 2·rows·N·K; bytes = the weight's stored
  bytes (codes, scales, zeros, bias) + the activations in and out;
- attention over the cached context (`--context` tokens per row) plus everything else of the step
  (embedding, norms, RoPE, residuals, cache writes, the Python of the forward): measured as the
  whole step minus the linears; its bound counts the keys and values read (every row reads its
  own context: the rows here are forks of one prompt, which an attention that reads shared
  prefixes once would read once) and 4·rows·layers·heads·head_dim·context FLOPs;
- the whole step (`model.forward` of one token per row), measured.

Peaks: dense linears and attention, the FLOP/s of a 1024³ float32 or bfloat16 matmul (torch, the
step's threads); each quantized format, its own kernel's compute roof: the FLOP/s of the same
kernel and format on a weight that sits in cache (N = 4096, K = 1024) at M = 64 rows, where only
its instruction mix bounds it (with the default 16-bit activation codes every weight byte takes
two int8 dot products). Above the kernels' roofs, the instruction's own peak: independent
vpdpbusd (64 int8 multiply-adds each) on one thread (`dot_peak` of the compiled kernels), times
the threads; each quantized kind's roof is then printed as a share of it (halved for 16-bit
codes, which take two dot products per multiply-add). Bandwidth: the best torch.sum over a 1 GiB float32 buffer. "% of bound"
= bound / measured: 100% is at the roof.

    python benchmarks/roofline.py [--model PATH] [--dtype auto] [--rows 1,16] [--context 128]
                                  [--threads 2] [--activations int16] [--markdown]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path


import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

from decode import measure_bandwidth  # noqa: E402

from metagen.models import load  # noqa: E402


def timed(run, calls: int, repeats: int = 5) -> float:
    """Median over `repeats` of the mean seconds of `calls` calls of `run()` (after a warm-up)."""
    run()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            run()
        samples.append((time.perf_counter() - start) / calls)
    return statistics.median(samples)


def peak_flops(dtype: torch.dtype, size: int = 1024) -> float:
    a = torch.randn(size, size).to(dtype)
    b = torch.randn(size, size).to(dtype)
    seconds = min(timed(lambda: torch.mm(a, b), 3, 1) for _ in range(5))
    return 2 * size**3 / seconds


def linear_bytes(linear) -> int:
    return linear.nbytes


def _same_format(linear, n: int, k: int):
    """A random (n, k) linear in `linear`'s quantized format, or None for a dense one."""
    from metagen.models.linear import GroupedLinear, Int4Linear, Int8Linear
    from metagen.models.packing import Factored

    generator = torch.Generator().manual_seed(0)
    if isinstance(linear, Int4Linear):
        return Int4Linear.from_codes(torch.randint(0, 16, (n, k), generator=generator), torch.rand(n, k // 32) * 0.01,
                                     torch.rand(n, k // 32) * 0.01)
    if isinstance(linear, Int8Linear):
        return Int8Linear.quantize(torch.randn(n, k, generator=generator))
    if isinstance(linear, GroupedLinear):
        groups = k // linear.group

        def values():
            if linear.factored:
                return Factored(torch.rand(n, k // 256).half().float(), torch.randint(0, 64, (n, groups), generator=generator))
            return torch.rand(n, groups).half().float() if linear.half else torch.rand(n, groups)

        low = 1 if linear.bits == 8 else 0
        return GroupedLinear(torch.randint(low, 2**linear.bits, (n, k), generator=generator), values(),
                             values() if linear.zeros is not None else None, linear.bits, linear.group, linear.offset)
    return None


_kernel_peaks: dict[str, float] = {}


def kernel_peak(linear, peaks: dict, matmul_dtype: torch.dtype) -> float:
    """FLOP/s roof of the kernel `linear` runs on (see the module docstring); a concatenation of
    linears in several formats takes its slowest part's."""
    parts = getattr(linear, "parts", None)
    if parts is not None:
        return min(kernel_peak(part, peaks, matmul_dtype) for part in parts)
    if linear.kind == "dense":
        return peaks["bf16"] if matmul_dtype == torch.bfloat16 else peaks["fp32"]
    if linear.kind not in _kernel_peaks:
        rows, n, k = 64, 4096, 1024
        sample = _same_format(linear, n, k)
        sample.set_activations(linear.activations)  # the codes the step's own linear runs with
        x = torch.randn(rows, k).to(matmul_dtype)
        _kernel_peaks[linear.kind] = 2 * rows * n * k / min(timed(lambda: sample(x), 20, 1) for _ in range(5))
    return _kernel_peaks[linear.kind]


def dot_peak(threads: int) -> float | None:
    """int8 multiply-adds per second of vpdpbusd at its peak on this machine (one thread's, times
    `threads`), or None without the compiled kernels or AVX-512 VNNI."""
    from metagen.models.kernels import matmul_kernels

    kernels = matmul_kernels()
    if kernels is None or kernels.dot_peak(1) < 0:
        return None
    rounds = 20_000_000
    seconds = min(timed(lambda: kernels.dot_peak(rounds), 1, 1) for _ in range(3))
    return threads * 12 * 64 * rounds / seconds


def step_rows(model, rows: int, context: int, peaks: dict, bandwidth: float, steps: int, tokens: int = 1) -> list[dict]:
    """The table rows of one decode step of `tokens` new tokens per row (5 for a γ = 4
    speculative verification) at `rows` rows over `context` cached tokens."""
    config = model.config
    linears = model.linears()
    counts: dict[str, int] = {}
    first: dict[str, object] = {}
    kinds: dict[str, list[str]] = {}
    for name, linear in linears:
        counts[name] = counts.get(name, 0) + 1
        first.setdefault(name, linear)
        if linear.kind not in kinds.setdefault(name, []):
            kinds[name].append(linear.kind)
    act = torch.empty(0, dtype=model.matmul_dtype).element_size()
    m = rows * tokens  # activation rows of each linear
    inputs = {name: torch.randn(m, linear.in_features).to(model.matmul_dtype) for name, linear in first.items()}
    passes: dict[str, list[float]] = {name: [] for name in first}
    for _ in range(6):  # the first pass warms up
        spent = dict.fromkeys(first, 0.0)
        for name, linear in linears:
            x = inputs[name]
            start = time.perf_counter()
            linear(x)
            spent[name] += time.perf_counter() - start
        for name, seconds in spent.items():
            passes[name].append(seconds)
    out = []
    linear_seconds = 0.0
    for name in first:
        seconds = statistics.median(passes[name][1:])
        alike = [linear for kind, linear in linears if kind == name]  # e.g. down: Q4_K in some layers, Q6_K in others
        flops = sum(2 * m * linear.out_features * linear.in_features for linear in alike)
        moved = sum(linear_bytes(linear) + m * (linear.in_features + linear.out_features) * act for linear in alike)
        # the kinds' roofs weighted by their FLOPs: the time the compute bound allows for all of them
        compute_seconds = sum(2 * m * linear.out_features * linear.in_features / kernel_peak(linear, peaks,
                                                                                            model.matmul_dtype)
                              for linear in alike)
        label = f"{name} ({', '.join(kinds[name])}) ×{counts[name]}"
        out.append(row(label, seconds, flops, moved, flops / compute_seconds, bandwidth))
        linear_seconds += seconds
    # the whole step: one token per row over `context` cached tokens (forks of one prompt)
    cache = model.new_cache(1, capacity=context + steps + 8)
    prompt = [[(17 * i + 5) % config.vocab_size for i in range(context)]]
    model.forward(cache, prompt)
    cache.select([0] * rows)
    new = torch.full((rows, tokens), 42, dtype=torch.long)
    samples = []
    for _ in range(steps):
        start = time.perf_counter()
        model.forward(cache, new, logits="all" if tokens > 1 else "last")  # a verification scores every position
        samples.append(time.perf_counter() - start)
        if tokens > 1:
            for row_index, length in enumerate(cache.lengths):  # a rejected draft: back to the context
                cache.truncate(row_index, length - tokens)
    step = statistics.median(samples[2:])
    kv = 2 * config.num_key_value_heads * config.head_dim * 4 * config.num_hidden_layers  # float32 K and V
    keys = context + (1 if tokens > 1 else steps // 2)  # keys each new token attends to, on average
    attention_bytes = rows * keys * kv
    attention_flops = 4 * m * config.num_hidden_layers * config.num_attention_heads * config.head_dim * keys
    out.append(row("attention + rest", step - linear_seconds, attention_flops, attention_bytes, peaks["fp32"],
                   bandwidth))
    total_flops = sum(r["flops"] for r in out)
    total_bytes = sum(r["bytes"] for r in out)
    whole = row("whole step", step, total_flops, total_bytes, peaks["fp32"], bandwidth)
    # the whole step's compute bound: each op's, summed (its ops run on different roofs)
    whole["compute_ms"] = sum(r["compute_ms"] for r in out)
    whole.update(_bound(whole["compute_ms"], whole["memory_ms"], step))
    out.append(whole)
    return out


def _bound(compute_ms: float, memory_ms: float, seconds: float) -> dict:
    bound = max(compute_ms, memory_ms)
    return {"bound_ms": bound, "limit": "memory" if memory_ms >= compute_ms else "compute",
            "of_bound": bound / 1e3 / seconds if seconds > 0 else float("nan")}


def row(op: str, seconds: float, flops: float, moved: float, peak: float, bandwidth: float) -> dict:
    compute, memory = flops / peak * 1e3, moved / bandwidth * 1e3
    return {"op": op, "ms": seconds * 1e3, "flops": flops, "bytes": moved, "compute_ms": compute, "memory_ms": memory,
            "peak": peak} | _bound(compute, memory, seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--dtype", default=None, help="weight format (default: the model's default)")
    parser.add_argument("--rows", default="1,16")
    parser.add_argument("--context", type=int, default=128, help="cached tokens per row")
    parser.add_argument("--steps", type=int, default=24, help="decode steps timed for the whole step")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tokens", default="1", help="new tokens per row per step, comma-separated (5: a γ = 4 "
                        "verification; the cache is truncated back after each step)")
    parser.add_argument("--activations", default="int16", choices=("int16", "int8"),
                        help="activation codes of the compiled kernels (default int16)")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = load(args.model, args.dtype, activations=args.activations)
    bandwidth = measure_bandwidth(1024, 5)
    peaks = {"fp32": peak_flops(torch.float32), "bf16": peak_flops(torch.bfloat16)}
    print(f"{model.config.name}, {args.threads} threads: read bandwidth {bandwidth / 1e9:.1f} GB/s, peak "
          f"{peaks['fp32'] / 1e9:.0f} GFLOP/s fp32, {peaks['bf16'] / 1e9:.0f} GFLOP/s bf16; context {args.context}")
    instruction = dot_peak(args.threads)
    if instruction is not None:
        print(f"vpdpbusd peak: {instruction / 1e9:.0f} G int8 multiply-adds/s on {args.threads} threads "
              f"({2 * instruction / 1e9:.0f} GFLOP/s with int8 activation codes, {instruction / 1e9:.0f} with int16)")
    shapes = [(int(r), int(t)) for r in args.rows.split(",") for t in args.tokens.split(",")]
    for rows, tokens in shapes:
        table = step_rows(model, rows, args.context, peaks, bandwidth, args.steps, tokens)
        print(f"\nrows {rows}, {tokens} new token{'s' if tokens > 1 else ''} per row")
        if args.markdown:
            print("| op | measured ms | MFLOP | MB moved | roof GFLOP/s | compute bound ms | memory bound ms | limit | % of bound |")
            print("|---|---|---|---|---|---|---|---|---|")
            for r in table:
                roof = "" if r["op"] == "whole step" else f"{r['peak'] / 1e9:.0f}"
                print(f"| {r['op']} | {r['ms']:.3f} | {r['flops'] / 1e6:.1f} | {r['bytes'] / 1e6:.2f} | {roof} | "
                      f"{r['compute_ms']:.3f} | {r['memory_ms']:.3f} | {r['limit']} | {r['of_bound']:.0%} |")
        else:
            print(f"{'op':>28} {'ms':>8} {'MFLOP':>9} {'MB':>8} {'compute':>8} {'memory':>8} {'limit':>8} {'%bound':>7}")
            for r in table:
                print(f"{r['op']:>28} {r['ms']:>8.3f} {r['flops'] / 1e6:>9.1f} {r['bytes'] / 1e6:>8.2f} "
                      f"{r['compute_ms']:>8.3f} {r['memory_ms']:>8.3f} {r['limit']:>8} {r['of_bound']:>7.0%}")
    if instruction is not None and _kernel_peaks:
        codes = args.activations
        ceiling = 2 * instruction / (2 if codes == "int16" else 1)  # FLOP/s: 2 per multiply-add
        shares = ", ".join(f"{kind} {roof / 1e9:.0f} GFLOP/s ({roof / ceiling:.0%})" for kind, roof in _kernel_peaks.items())
        print(f"\nkernel roofs against the vpdpbusd peak with {codes} activation codes "
              f"({ceiling / 1e9:.0f} GFLOP/s): {shares}")


if __name__ == "__main__":
    main()
