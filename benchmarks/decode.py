"""Decode speed of metagen's native backend against transformers and llama.cpp, in one run.

Every engine gets the same prompt (a fixed chat, token ids computed once with metagen's
tokenizer and passed as ids), the same weights (a GGUF file, by default the embedded SmolLM2-135M-Instruct Q4_1),
the same number of CPU threads, and decodes with EOS ignored.

A *decode step* is one forward of one new token per row plus choosing the row's next token.
The first new token comes from the prefill logits, so `--tokens N` asks every engine for
N + 1 new tokens = N decode steps, and

    decode tokens/s = N · rows / decode seconds.

Timing per engine:
- metagen: `generate()` (ignore_eos=True) reports `prefill_seconds` and `decode_seconds` itself
  (perf_counter around the prefill, then around the loop: N forwards, N + 1 choices); rows = 1
  (greedy) or n (one prefill, forked into n rows).
- transformers: `generate()` does not split the two phases, so it is timed twice, with
  min_new_tokens = max_new_tokens so that EOS cannot end it early: t(1 new token) = prefill +
  one choice, t(N + 1 new tokens) = prefill + N forwards + N + 1 choices; decode seconds =
  best t(N + 1) − best t(1). The batch input is the prompt repeated n times (transformers
  prefills each copy; the subtraction removes that cost).
- llama.cpp: `Llama.eval(prompt)` + the first `sample(temp=0)` timed as prefill, then a loop of
  `eval([token])` + `sample(temp=0)` timed as decode (the loop never looks at EOS).

Each measurement runs once as warm-up, then `--repeats` times; the table reports the best
(fastest) run, and the JSON keeps every run. The bandwidth ceiling divides a measured memory
read bandwidth (torch.sum over a large buffer) by the weight bytes one batch-1 decode step
reads: every linear weight (with its scales), the LM head and one embedding row.

OpenMP keeps its default wait policy, as the metagen CLI does (workers spin a few milliseconds
after a kernel, then sleep; OMP_WAIT_POLICY=ACTIVE decodes no faster, docs/guides/models.md).

Run:  .venv/bin/python benchmarks/decode.py --out results.json --markdown
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import json
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from metagen.decoding import generate
from metagen.models import embedded_model_path, load
from metagen.sampling import SamplingParams
from metagen.tables import table

PROMPT = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Explain how a refrigerator keeps food cold, step by step."},
]
TOP_P = 0.95  # batched sampling: temperature 1, nucleus 0.95, no top-k
SEED = 0


@dataclass
class Measurement:
    """One engine × weights × mode. Times in seconds, best of the repeats."""

    engine: str  # "metagen" | "transformers" | "llama.cpp"
    weights: str  # "fp32", "bf16", "int8", "int4", "auto", or "GGUF" (llama.cpp on the file's own blocks)
    mode: str  # "greedy" | "sampling"
    rows: int  # sequences decoded together
    steps: int  # decode steps per row
    prefill_seconds: float
    decode_seconds: float
    decode_runs: list[float] = field(default_factory=list)
    detail: str = ""  # how the engine holds the weights
    greedy_tokens: list[int] | None = None  # row 0's tokens, for the agreement check
    agreement: int | None = None  # leading greedy tokens equal to the reference's
    agreement_llama_cpp: int | None = None  # leading greedy tokens equal to llama.cpp's
    ratio_to_hf_fp32: float | None = None
    ratio_to_llama_cpp: float | None = None

    @property
    def tokens_per_second(self) -> float | None:
        """steps · rows / decode seconds; None when timing noise left no positive decode time."""
        return self.steps * self.rows / self.decode_seconds if self.decode_seconds > 0 else None


# ------------------------------------------------------------------ running
def repeat(run, repeats: int) -> list:
    """One warm-up call of `run()`, then `repeats` calls; returns their results."""
    run()
    return [run() for _ in range(repeats)]


def measure_metagen(model, prompt_ids: list[int], args) -> list[Measurement]:
    """Batch-1 greedy and n-row sampling with a metagen model (one weight format)."""
    dtype = model.dtype
    new_tokens = args.tokens + 1
    greedy = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True, n=1, seed=SEED)
    sampling = SamplingParams(
        temperature=1.0, top_p=TOP_P, max_tokens=new_tokens, ignore_eos=True, n=args.batch, seed=SEED
    )
    out = []
    for mode, params in (("greedy", greedy), ("sampling", sampling)):
        results = repeat(lambda: generate(model, prompt_ids, params), args.repeats)
        steps = results[0].cost.model_calls - 1  # calls after the prefill
        if steps != args.tokens:
            raise RuntimeError(f"metagen {dtype} {mode}: expected {args.tokens} decode steps, ran {steps}")
        out.append(
            Measurement(
                "metagen", dtype, mode, params.n, steps,
                prefill_seconds=min(r.prefill_seconds for r in results),
                decode_seconds=min(r.decode_seconds for r in results),
                decode_runs=[r.decode_seconds for r in results],
                detail=f"{dict(model.linears())['qkv'].kind} linears, {dict(model.linears())['lm_head'].kind} LM head, "
                f"{model.matmul_dtype} matmul inputs, float32 attention",
                greedy_tokens=results[0].completions[0].token_ids[: args.tokens] if mode == "greedy" else None,
            )
        )
    return out


def weight_bytes_per_token(model) -> dict[str, int]:
    """Bytes one batch-1 decode step reads from a metagen model's weights.

    Every linear of every layer (qkv, o, gate_up, down: weights, scales, zeros, bias), the LM
    head, and one row of the embedding. Norm weights, the KV cache and activations are left out.
    """

    def linear_bytes(linear) -> int:
        return linear.nbytes

    linears = model.linears()
    return {
        "layers": sum(linear_bytes(linear) for name, linear in linears if name != "lm_head"),
        "lm_head": sum(linear_bytes(linear) for name, linear in linears if name == "lm_head"),
        "embedding_row": model.embed.shape[1] * model.embed.element_size(),
    }


def measure_bandwidth(megabytes: int, repeats: int) -> float:
    """Memory read bandwidth in bytes/s: best time of torch.sum over a `megabytes` fp32 buffer."""
    buffer = torch.ones(megabytes * 2**20 // 4, dtype=torch.float32)  # written once: pages are mapped

    def run() -> float:
        start = time.perf_counter()
        buffer.sum().item()
        return time.perf_counter() - start

    seconds = min(repeat(run, max(repeats, 3)))
    return buffer.numel() * buffer.element_size() / seconds


def measure_transformers(path: Path, dtype: str, prompt_ids: list[int], args) -> list[Measurement]:
    """transformers `generate` on the GGUF weights loaded in `dtype`; decode by subtraction."""
    import transformers
    from transformers import AutoModelForCausalLM

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    torch_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
    with contextlib.redirect_stderr(io.StringIO()):  # the GGUF conversion's progress bar
        model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch_dtype)
    model.eval()
    linear = model.model.layers[0].self_attn.q_proj  # a dequantized nn.Linear, or packed GGUF blocks
    detail = f"{type(linear).__module__}.{type(linear).__name__}, parameters {next(model.parameters()).dtype}"
    pad = model.generation_config.eos_token_id
    pad = pad[0] if isinstance(pad, list) else pad

    def timed(rows: int, new_tokens: int, sample: bool):
        ids = torch.tensor([prompt_ids] * rows)  # (B, T)
        options = dict(do_sample=True, temperature=1.0, top_p=TOP_P, top_k=0) if sample else dict(do_sample=False)
        torch.manual_seed(SEED)
        start = time.perf_counter()
        with torch.inference_mode():
            output = model.generate(
                input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                min_new_tokens=new_tokens, pad_token_id=pad, **options,
            )
        return time.perf_counter() - start, output[0, len(prompt_ids):].tolist()

    out = []
    for mode, rows in (("greedy", 1), ("sampling", args.batch)):
        sample = mode == "sampling"
        pairs = repeat(lambda: (timed(rows, 1, sample), timed(rows, args.tokens + 1, sample)), args.repeats)
        short = [p[0][0] for p in pairs]
        long = [p[1][0] for p in pairs]
        out.append(
            Measurement(
                "transformers", dtype, mode, rows, args.tokens,
                prefill_seconds=min(short),
                decode_seconds=min(long) - min(short),
                decode_runs=[b - a for a, b in zip(short, long)],
                detail=detail,
                greedy_tokens=pairs[0][1][1][: args.tokens] if mode == "greedy" else None,
            )
        )
    return out


def measure_llama_cpp(path: Path, prompt_ids: list[int], args) -> list[Measurement]:
    """llama.cpp batch-1 greedy: timed eval(prompt), then a timed loop of sample + eval([token])."""
    from llama_cpp import Llama

    llm = Llama(str(path), n_ctx=2048, n_threads=args.threads, n_threads_batch=args.threads, verbose=False)

    def run():
        llm.reset()
        start = time.perf_counter()
        llm.eval(prompt_ids)
        token = llm.sample(temp=0.0)
        prefill = time.perf_counter() - start
        tokens = [token]
        start = time.perf_counter()
        for _ in range(args.tokens):  # N decode steps; EOS is never checked
            llm.eval([token])
            token = llm.sample(temp=0.0)
            tokens.append(token)
        return prefill, time.perf_counter() - start, tokens

    runs = repeat(run, args.repeats)
    measurement = Measurement(
        "llama.cpp", "GGUF", "greedy", 1, args.tokens,
        prefill_seconds=min(r[0] for r in runs),
        decode_seconds=min(r[1] for r in runs),
        decode_runs=[r[1] for r in runs],
        detail="llama.cpp on the GGUF's own blocks",
        greedy_tokens=runs[0][2][: args.tokens],
    )
    llm.close()
    return [measurement]


# ------------------------------------------------------------------ comparing
def common_prefix(a: list[int], b: list[int]) -> int:
    count = 0
    for x, y in zip(a, b):
        if x != y:
            break
        count += 1
    return count


def add_comparisons(measurements: list[Measurement]) -> None:
    """Ratios to transformers fp32 (same mode) and to llama.cpp (greedy); greedy agreement with
    the fp32 reference (transformers fp32 greedy when measured, else metagen fp32) and with
    llama.cpp's greedy tokens on the same file.
    """
    find = {(m.engine, m.weights, m.mode): m for m in measurements}
    llama = find.get(("llama.cpp", "GGUF", "greedy"))
    reference = find.get(("transformers", "fp32", "greedy")) or find.get(("metagen", "fp32", "greedy"))
    def ratio(m: Measurement, peer: Measurement | None) -> float | None:
        if peer is None or m.tokens_per_second is None or peer.tokens_per_second is None:
            return None
        return m.tokens_per_second / peer.tokens_per_second

    for m in measurements:
        m.ratio_to_hf_fp32 = ratio(m, find.get(("transformers", "fp32", m.mode)))
        m.ratio_to_llama_cpp = ratio(m, llama) if m.mode == "greedy" else None
        if reference is not None and m.greedy_tokens is not None:
            m.agreement = common_prefix(m.greedy_tokens, reference.greedy_tokens)
        if llama is not None and m is not llama and m.greedy_tokens is not None:
            m.agreement_llama_cpp = common_prefix(m.greedy_tokens, llama.greedy_tokens)


def ceilings(bytes_by_dtype: dict[str, dict[str, int]], bandwidth: float, measurements) -> list[dict]:
    """Batch-1 tokens/s bound = bandwidth / weight bytes per step, beside metagen's greedy rate."""
    greedy = {m.weights: m for m in measurements if m.engine == "metagen" and m.mode == "greedy"}
    rows = []
    for dtype, parts in bytes_by_dtype.items():
        total = sum(parts.values())
        bound = bandwidth / total
        measured = greedy[dtype].tokens_per_second if dtype in greedy else None
        rows.append({
            "dtype": dtype, "bytes_per_token": total, "bytes": parts, "ceiling_tokens_per_second": bound,
            "measured_tokens_per_second": measured,
            "fraction_of_ceiling": None if measured is None else measured / bound,
        })
    return rows


# ------------------------------------------------------------------ reporting
def _ratio(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}×"


def result_rows(measurements: list[Measurement], tokens: int) -> list[list[str]]:
    rows = [["engine", "weights", "mode", "prefill ms", "decode tok/s", "vs HF fp32", "vs llama.cpp", "greedy agrees",
             "= llama.cpp greedy"]]
    for m in measurements:
        mode = "greedy, 1 row" if m.mode == "greedy" else f"sampling, {m.rows} rows"
        agrees = "—" if m.agreement is None else f"{m.agreement}/{tokens}"
        same = "—" if m.agreement_llama_cpp is None else f"{m.agreement_llama_cpp}/{tokens}"
        rate = "n/a (noise)" if m.tokens_per_second is None else f"{m.tokens_per_second:.1f}"
        rows.append([
            m.engine, m.weights, mode, f"{1000 * m.prefill_seconds:.1f}", rate,
            _ratio(m.ratio_to_hf_fp32), _ratio(m.ratio_to_llama_cpp), agrees, same,
        ])
    return rows


def ceiling_rows(ceiling: list[dict]) -> list[list[str]]:
    rows = [["metagen weights", "MB read / token", "ceiling tok/s", "greedy tok/s", "of ceiling"]]
    for c in ceiling:
        measured = c["measured_tokens_per_second"]
        rows.append([
            c["dtype"], f"{c['bytes_per_token'] / 1e6:.1f}", f"{c['ceiling_tokens_per_second']:.1f}",
            "—" if measured is None else f"{measured:.1f}",
            "—" if measured is None else f"{100 * c['fraction_of_ceiling']:.0f}%",
        ])
    return rows


def environment() -> dict[str, str]:
    info = {"python": platform.python_version(), "torch": torch.__version__, "machine": platform.machine()}
    try:
        names = [line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")]
        info["cpu"] = names[0] if names else platform.processor()
    except OSError:
        info["cpu"] = platform.processor()
    for module in ("transformers", "llama_cpp"):
        try:
            info[module] = __import__(module).__version__
        except Exception:  # optional peers: absent or broken installs are simply not reported
            pass
    try:
        repo = Path(__file__).resolve().parent.parent
        info["metagen_commit"] = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        pass
    return info


def markdown_report(
    settings: dict, env: dict, bandwidth: float, results: str, limits: str, notes: list[str]
) -> str:
    lines = [
        f"Decode speed, {settings['prompt_tokens']}-token chat prompt, {settings['tokens']} decode steps, "
        f"EOS ignored, {settings['threads']} threads, best of {settings['repeats']} timed runs "
        f"({env.get('cpu', 'unknown CPU')}; torch {env['torch']}"
        + (f", transformers {env['transformers']}" if "transformers" in env else "")
        + (f", llama-cpp-python {env['llama_cpp']}" if "llama_cpp" in env else "")
        + (f"; metagen {env['metagen_commit']}" if "metagen_commit" in env else "") + ").",
        "",
        results,
        "",
        f"Bandwidth ceiling: measured read bandwidth {bandwidth / 1e9:.1f} GB/s (torch.sum, "
        f"{settings['threads']} threads) ÷ weight bytes per batch-1 decode step.",
        "",
        limits,
    ]
    lines += [""] + [f"Note: {note}" for note in notes] if notes else []
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------ main
def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=None, help="GGUF file (default: the embedded SmolLM2-135M)")
    parser.add_argument("--tokens", type=int, default=128, help="decode steps per row (default 128)")
    parser.add_argument("--batch", type=int, default=16, help="rows of the sampling measurement (default 16)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs after one warm-up (default 3)")
    parser.add_argument("--threads", type=int, default=2, help="CPU threads for every engine (default 2)")
    parser.add_argument("--dtypes", default="fp32,bf16,int8,int4,auto", help="metagen weight formats, comma-separated")
    parser.add_argument("--activations", default=None, choices=["int16", "int8"],
                        help="metagen kernels' activation codes (load's activations=; default int16)")
    parser.add_argument("--bandwidth-mb", type=int, default=1024, help="buffer size of the bandwidth probe")
    parser.add_argument("--skip-hf", action="store_true", help="do not measure transformers")
    parser.add_argument("--skip-llamacpp", action="store_true", help="do not measure llama.cpp")
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    parser.add_argument(
        "--markdown", nargs="?", const="-", default=None, metavar="PATH",
        help="write Markdown tables for BENCHMARKS.md to PATH (no PATH: print them)",
    )
    args = parser.parse_args(argv)
    args.dtypes = [d for d in args.dtypes.split(",") if d]
    unknown = sorted(set(args.dtypes) - {"auto", "fp32", "bf16", "int8", "int4"})
    if unknown:
        parser.error(f"--dtypes: unknown {', '.join(unknown)}; choose from auto, fp32, bf16, int8, int4")
    for name in ("tokens", "batch", "repeats", "threads", "bandwidth_mb"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    return args


def prompt_token_ids(path: Path) -> list[int]:
    """The fixed chat prompt as ids, with the tokenizer the GGUF file describes."""
    import gguf

    from metagen.models.tokenizer import Tokenizer

    return Tokenizer.from_gguf(gguf.GGUFReader(str(path))).encode_chat(PROMPT, add_generation_prompt=True)


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    path = Path(args.model) if args.model is not None else embedded_model_path()
    prompt_ids = prompt_token_ids(path)
    print(f"model {path.name}, prompt {len(prompt_ids)} tokens, {args.tokens} decode steps, "
          f"batch {args.batch}, {args.threads} threads, best of {args.repeats}", file=sys.stderr)

    def progress(text: str) -> None:
        print(f"  {text}", file=sys.stderr, flush=True)

    progress("memory bandwidth")
    bandwidth = measure_bandwidth(args.bandwidth_mb, args.repeats)
    gc.collect()

    measurements: list[Measurement] = []
    bytes_by_dtype: dict[str, dict[str, int]] = {}
    notes: list[str] = []
    for dtype in args.dtypes:
        progress(f"metagen {dtype}")
        model = load(path, dtype, activations=args.activations)
        measurements += measure_metagen(model, prompt_ids, args)
        bytes_by_dtype[dtype] = weight_bytes_per_token(model)
        del model
        gc.collect()
    if not args.skip_hf:
        for dtype in ("fp32", "bf16"):
            progress(f"transformers {dtype}")
            try:
                measurements += measure_transformers(path, dtype, prompt_ids, args)
            except ImportError as error:
                notes.append(f"transformers not measured ({error})")
                break
            gc.collect()
    if not args.skip_llamacpp:
        progress("llama.cpp")
        try:
            measurements += measure_llama_cpp(path, prompt_ids, args)
        except ImportError as error:
            notes.append(f"llama.cpp not measured: llama-cpp-python is not importable ({error})")
    for note in notes:
        print(f"note: {note}", file=sys.stderr)

    add_comparisons(measurements)
    ceiling = ceilings(bytes_by_dtype, bandwidth, measurements)
    results, limits = result_rows(measurements, args.tokens), ceiling_rows(ceiling)
    print()
    print(table(results[0], results[1:]))
    print()
    print(f"memory read bandwidth {bandwidth / 1e9:.1f} GB/s")
    print(table(limits[0], limits[1:]))

    settings = {
        "model": str(path), "prompt": PROMPT, "prompt_tokens": len(prompt_ids), "tokens": args.tokens,
        "batch": args.batch, "repeats": args.repeats, "threads": args.threads, "top_p": TOP_P,
        "statistic": "best of repeats after one warm-up",
    }
    env = environment()
    if args.out is not None:
        records = [
            asdict(m) | {"tokens_per_second": m.tokens_per_second,
                         "decode_seconds_median": statistics.median(m.decode_runs)}
            for m in measurements
        ]
        for record in records:
            record.pop("greedy_tokens")
        report = {"settings": settings, "environment": env, "bandwidth_bytes_per_second": bandwidth,
                  "measurements": records, "ceilings": ceiling, "notes": notes}
        args.out.write_text(json.dumps(report, indent=2) + "\n")
        print(f"\nwrote {args.out}")
    if args.markdown is not None:
        text = markdown_report(settings, env, bandwidth, table(results[0], results[1:], markdown=True),
                               table(limits[0], limits[1:], markdown=True), notes)
        if args.markdown == "-":
            print("\n" + text, end="")
        else:
            Path(args.markdown).write_text(text)
            print(f"wrote {args.markdown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
