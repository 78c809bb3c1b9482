"""Load on `metagen serve`: 1, 4 and 16 concurrent openai clients (by default), each sending
`--requests` streamed completions one after another (EOS ignored, so every request generates
`--max-tokens` tokens), against one server started here on 127.0.0.1.

Per concurrency level: requests/s and output tokens/s over the level's wall time, p50 / p99
latency and time to first token (first streamed chunk), errors (must be 0), and the mean rows
per decode step read from /metrics (how much continuous batching batched). The comparison with
llama.cpp's server and the prefix-cache workloads of issue 17 are not here yet.

    python benchmarks/serve.py [--clients 1,4,16] [--requests 4] [--max-tokens 32] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "serve"))

from server import serve_process  # noqa: E402  (tests/serve/server.py: start, wait for /health, stop)

PROMPTS = ["The history of the printing press", "A recipe for bread:", "def quicksort(items):",
           "The three laws of motion are", "Once upon a time in a small village", "Photosynthesis is"]


def one_client(url: str, model: str, client_index: int, requests: int, max_tokens: int) -> list[dict]:
    from openai import OpenAI

    records = []
    with OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=600) as client:
        for number in range(requests):
            start = time.perf_counter()
            first, tokens, error = None, 0, None
            try:
                stream = client.completions.create(
                    model=model, prompt=PROMPTS[(client_index + number) % len(PROMPTS)], max_tokens=max_tokens,
                    temperature=0.8, seed=client_index * 1000 + number, stream=True,
                    stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
                for chunk in stream:
                    if first is None:
                        first = time.perf_counter() - start
                    if chunk.usage is not None:
                        tokens = chunk.usage.completion_tokens
            except Exception as failure:  # noqa: BLE001 - counted, reported
                error = f"{type(failure).__name__}: {failure}"
            records.append({"latency": time.perf_counter() - start, "ttft": first, "tokens": tokens, "error": error})
    return records


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", default="1,4,16")
    parser.add_argument("--requests", type=int, default=4, help="requests per client")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--threads", default="2")
    parser.add_argument("--json", default=None, help="also write the results to this file")
    args = parser.parse_args()
    levels = [int(level) for level in args.clients.split(",")]
    results = []
    with serve_process("--max-rows", str(max(levels)), "--max-queue", str(4 * max(levels)),
                       "--threads", args.threads) as server:
        model = json.loads(server.get("/v1/models"))["data"][0]["id"]
        one_client(server.url, model, 0, 1, 4)  # warm-up
        for clients in levels:
            steps0 = server.metric("metagen_decode_steps_total")
            rows0 = server.metric("metagen_decode_step_rows_total")
            start = time.perf_counter()
            with ThreadPoolExecutor(clients) as pool:
                runs = list(pool.map(lambda i: one_client(server.url, model, i, args.requests, args.max_tokens),
                                     range(clients)))
            wall = time.perf_counter() - start
            records = [record for run in runs for record in run]
            ok = [record for record in records if record["error"] is None]
            steps = server.metric("metagen_decode_steps_total") - steps0
            rows = server.metric("metagen_decode_step_rows_total") - rows0
            results.append({
                "clients": clients, "requests": len(records), "errors": len(records) - len(ok),
                "requests_per_s": len(ok) / wall, "output_tokens_per_s": sum(r["tokens"] for r in ok) / wall,
                "latency_p50": percentile([r["latency"] for r in ok], 0.5),
                "latency_p99": percentile([r["latency"] for r in ok], 0.99),
                "ttft_p50": percentile([r["ttft"] for r in ok], 0.5),
                "ttft_p99": percentile([r["ttft"] for r in ok], 0.99),
                "mean_rows_per_step": rows / steps if steps else 0.0,
                "first_error": next((r["error"] for r in records if r["error"]), None),
            })
    print(f"{'clients':>7} {'req/s':>7} {'out tok/s':>9} {'p50 s':>7} {'p99 s':>7} {'ttft p50':>8} {'ttft p99':>8} "
          f"{'rows/step':>9} {'errors':>6}")
    for r in results:
        print(f"{r['clients']:>7} {r['requests_per_s']:>7.2f} {r['output_tokens_per_s']:>9.1f} {r['latency_p50']:>7.2f} "
              f"{r['latency_p99']:>7.2f} {r['ttft_p50']:>8.3f} {r['ttft_p99']:>8.3f} {r['mean_rows_per_step']:>9.2f} "
              f"{r['errors']:>6}")
    print(f"({args.requests} requests per client, {args.max_tokens} tokens each, EOS ignored)")
    for r in results:
        if r["first_error"]:
            print(f"{r['clients']} clients, first error: {r['first_error']}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
