"""metagen over an OpenAI-compatible server vs the local backend, in one run.

On the built-in arithmetic task (embedded SmolLM2-135M-Instruct, same problems and seeds):

1. greedy and self-consistency@8 through a llama.cpp server (llama-cpp-python's
   `llama_cpp.server` on the embedded GGUF, started here on 127.0.0.1) and through the local
   backend: accuracy ± standard error, and the token accounting each reports side by side
   (prompt tokens computed vs served from a cache, generated tokens, model calls);
2. the client's own overhead per request: CPU seconds the metagen client spends per request
   (building, sending, parsing) next to the request's wall time, over one-token requests;
3. one server replica vs two behind a fleet (`--replicas 2`): wall time and throughput of the
   same self-consistency run with concurrent problems, and how the requests spread.

The server runs with `--n_batch 1`: the llama-cpp-python build on this machine crashes when it
evaluates several tokens per batch (see tests/remote/conftest.py), so its prefill is slower
than llama.cpp's usual one; decode speed is unaffected.

Run:  .venv/bin/python benchmarks/remote.py --problems 20 --markdown
      .venv/bin/python benchmarks/remote.py --only-replicas --replicas 2 --replica-problems 8 --markdown
"""

from __future__ import annotations

import argparse
import contextlib
import json
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import torch

from metagen.decoding import LocalGenerator
from metagen.eval import EvalConfig, arithmetic_problems, evaluate
from metagen.models import embedded_model_path, load
from metagen.remote import OpenAIGenerator
from metagen.sampling import SamplingParams
from metagen.tables import table as render


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def llama_server(threads: int, log: Path):
    """A llama.cpp server on the embedded GGUF; yields its base URL, stops it on exit."""
    port = free_port()
    command = [sys.executable, "-m", "llama_cpp.server", "--model", str(embedded_model_path()),
               "--host", "127.0.0.1", "--port", str(port), "--n_ctx", "2048", "--n_batch", "1",
               "--n_threads", str(threads)]
    with open(log, "wb") as output:
        process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 120
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"llama_cpp.server exited with {process.returncode} (log: {log})")
            try:
                urllib.request.urlopen(f"{url}/models", timeout=2).read()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"llama_cpp.server did not start within 120 s (log: {log})") from None
                time.sleep(0.5)
        yield url
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def run_eval(generator, problems, args, out: Path, concurrency: int = 1):
    config = EvalConfig(("greedy", "self_consistency"), ns=(1, 8),
                        params=SamplingParams(temperature=0.8, max_tokens=args.max_tokens), seed=args.seed)
    extra = {"concurrency": concurrency} if concurrency > 1 else {}
    start = time.perf_counter()
    report = evaluate(generator, problems, config, out, **extra)
    wall = time.perf_counter() - start
    points = {(p.strategy, p.n): p for p in report.points}
    return {"greedy": points[("greedy", 1)], "sc8": points[("self_consistency", 8)], "wall": wall}


def client_cpu(generator: OpenAIGenerator) -> float:
    """CPU seconds spent so far by this thread and by the generator's event loop thread, which
    builds, sends and parses its requests; not process time: torch's OpenMP workers spin between
    kernels and would otherwise be counted as the client's."""
    loop_thread = next(t for t in threading.enumerate() if t.name == generator.loop.name)
    return time.thread_time() + time.clock_gettime(time.pthread_getcpuclockid(loop_thread.ident))


def client_overhead(url: str, requests: int) -> dict:
    """Client CPU per request vs wall per request, over one-token completions (see `client_cpu`)."""
    params = SamplingParams(temperature=0.0, max_tokens=1)
    with OpenAIGenerator(url, chat=False) as generator:
        generator.generate("Hello", params)  # probe + warm connection
        cpu, wall = client_cpu(generator), time.perf_counter()
        for _ in range(requests):
            generator.generate("Hello", params)
        cpu, wall = client_cpu(generator) - cpu, time.perf_counter() - wall
    return {"requests": requests, "client_cpu_ms": 1000 * cpu / requests, "wall_ms": 1000 * wall / requests}


def replicas(args, problems, work: Path, tokenizer) -> list[dict]:
    """The same concurrent self-consistency run on one replica with all threads and on
    `args.replicas` replicas sharing them: wall, throughput, requests per endpoint."""
    from metagen.remote import connect

    rows = []
    for count in (1, args.replicas):
        threads = max(1, args.threads // count)
        with contextlib.ExitStack() as stack:
            urls = [stack.enter_context(llama_server(threads, work / f"replica{count}-{i}.log")) for i in range(count)]
            generator = stack.enter_context(contextlib.closing(connect(urls, chat=True, tokenizer=tokenizer)))
            run = run_eval(generator, problems, args, work / f"replicas{count}", concurrency=args.concurrency)
            served = generator.stats() if hasattr(generator, "stats") else {urls[0]: {"requests": "all"}}
        tokens = run["sc8"].cost.generated_tokens * len(problems) + run["greedy"].cost.generated_tokens * len(problems)
        rows.append({"replicas": count, "threads_each": threads, "wall": run["wall"],
                     "tokens_per_second": tokens / run["wall"], "accuracy_sc8": run["sc8"].accuracy,
                     "requests_per_endpoint": [v.get("requests") for v in served.values()]})
    return rows


def cost_row(name: str, point) -> list[str]:
    cost = point.cost
    return [name, f"{point.strategy}@{point.n}", f"{point.accuracy:.3f} ± {point.stderr:.3f}",
            f"{cost.prompt_tokens_computed:.1f}", f"{cost.prompt_tokens_reused:.1f}", f"{cost.generated_tokens:.1f}",
            f"{cost.model_calls:.1f}", "unknown" if cost.flops is None else f"{cost.flops / 1e9:.1f}"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--problems", type=int, default=40, help="arithmetic problems (default 40)")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--overhead-requests", type=int, default=30)
    parser.add_argument("--replicas", type=int, default=0, help="also compare 1 vs this many server replicas")
    parser.add_argument("--replica-problems", type=int, default=8, help="problems of the replica comparison")
    parser.add_argument("--concurrency", type=int, default=4, help="problems in flight in the replica comparison")
    parser.add_argument("--only-replicas", action="store_true", help="run only the replica comparison")
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    problems = arithmetic_problems(args.problems, 0, 9)
    work = Path(tempfile.mkdtemp(prefix="metagen-remote-bench-"))
    results: dict = {"problems": args.problems, "max_tokens": args.max_tokens}

    model = load()
    if args.only_replicas:
        return print_replicas(args, problems, work, model, results)
    print("local backend", file=sys.stderr)
    local = run_eval(LocalGenerator(model), problems, args, work / "local")
    print("llama.cpp server", file=sys.stderr)
    with llama_server(args.threads, work / "server.log") as url:
        # llama.cpp returns no token ids: the model's own tokenizer gives them (the pools count tokens)
        with OpenAIGenerator(url, chat=True, tokenizer=model.tokenizer) as generator:
            remote = run_eval(generator, problems, args, work / "remote")
        overhead = client_overhead(url, args.overhead_requests)
    results |= {"local_wall": local["wall"], "remote_wall": remote["wall"], "overhead": overhead}

    rows = [["backend", "strategy", "accuracy", "prompt tokens computed", "prompt tokens cached/reused",
             "generated tokens", "model calls", "GFLOPs"]]
    for name, run in (("local (metagen int4)", local), ("llama.cpp server", remote)):
        rows += [cost_row(name, run["greedy"]), cost_row(name, run["sc8"])]
        results[name] = {key: run[key].to_dict() for key in ("greedy", "sc8")}
    print(render(rows[0], rows[1:], markdown=True) if args.markdown else json.dumps(results, indent=1))
    print(f"\nwall for the whole evaluation: local {local['wall']:.1f} s, server {remote['wall']:.1f} s "
          f"(per problem, costs above are means)")
    print(f"client overhead: {overhead['client_cpu_ms']:.2f} ms of client CPU per request vs "
          f"{overhead['wall_ms']:.1f} ms wall per one-token request ({overhead['requests']} requests)")
    return print_replicas(args, problems, work, model, results)


def print_replicas(args, problems, work: Path, model, results: dict) -> int:
    if args.replicas > 1:
        results["replicas"] = replicas(args, problems[: args.replica_problems], work, model.tokenizer)
        table = [["replicas", "threads each", "wall s", "generated tok/s", "self-consistency@8", "requests per endpoint"]]
        for row in results["replicas"]:
            table.append([str(row["replicas"]), str(row["threads_each"]), f"{row['wall']:.1f}",
                          f"{row['tokens_per_second']:.1f}", f"{row['accuracy_sc8']:.3f}",
                          " / ".join(str(r) for r in row["requests_per_endpoint"])])
        print()
        print(render(table[0], table[1:], markdown=True))
    if args.out is not None:
        args.out.write_text(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
