"""Load on `metagen serve`: 1, 4 and 16 concurrent openai clients (by default), each sending
`--requests` streamed completions one after another (EOS ignored, so every request generates
`--max-tokens` tokens), against one server started here on 127.0.0.1.

Per concurrency level: requests/s and output tokens/s over the level's wall time, p50 / p99
latency and time to first token (first streamed chunk), errors (must be 0), and the mean rows
per decode step read from /metrics (how much continuous batching batched). The comparison with
llama.cpp's server is not here yet.

Workloads (`--workload`):
- plain: short distinct completion prompts (above);
- shared-system: chat requests with one ~500-token system prompt and a distinct question each;
- multi-turn: each client holds a chat; request k sends the k previous questions and answers
  plus a new question (turn k's prompt starts with turn k-1's prompt and answer).
The two chat workloads run on a server with the prefix cache and on one without (`--prefix-cache
both`), and also report the prompt tokens taken from the cache (`cached_tokens` of the usage).

    python benchmarks/serve.py [--workload plain|shared-system|multi-turn] [--clients 1,4,16]
                               [--requests 4] [--max-tokens 32] [--threads 2] [--prefix-cache both|on|off]
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

SYSTEM_RULES = [
    "Greet the customer and answer in at most two sentences.",
    "Prices are in euros: croissant 1.40, pain au chocolat 1.60, baguette 1.20, rye loaf 3.80, apple tart 4.50, "
    "lemon cake slice 3.20, sourdough loaf 4.90, brioche 2.60, cinnamon roll 2.40, fruit scone 2.10.",
    "The bakery opens at seven in the morning on weekdays and at eight on Saturdays; it is closed on Sundays and "
    "on public holidays, and nobody may promise other hours.",
    "Allergens: every bread contains gluten; the brioche, croissants and cakes contain butter, milk and eggs; the "
    "apple tart contains almonds; the rye loaf and the sourdough are vegan.",
    "Orders of more than twelve items need one day of notice and a deposit of twenty percent, paid at the counter.",
    "Never give medical advice; for questions about allergies beyond the list, ask the customer to talk to the "
    "baker in person.",
    "If a product is sold out, suggest the closest alternative from the list and its price.",
    "Deliveries go to addresses within five kilometres, cost three euros and leave at eleven and at four.",
]
SYSTEM_PROMPT = "You are the assistant of the Little Oven bakery. " + " ".join(
    f"Rule {i + 1}: {rule}" for i, rule in enumerate(SYSTEM_RULES * 2))
QUESTIONS = ["How much is a croissant?", "Do you deliver to the station?", "Is the rye loaf vegan?",
             "Can I order thirty rolls for Friday?", "Are you open on Sunday?", "What has almonds in it?",
             "What do you suggest if the brioche is sold out?", "How much are two baguettes?"]

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


def chat_client(url: str, model: str, client_index: int, requests: int, max_tokens: int, workload: str,
                tag: str) -> list[dict]:
    """The chat workloads: shared-system (one system prompt, a new question per request) or multi-turn
    (one growing conversation per client). `tag` names the customer, so that no run reuses another
    run's conversations."""
    from openai import OpenAI

    records = []
    history = [{"role": "system", "content": SYSTEM_PROMPT}]
    with OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=600) as client:
        for number in range(requests):
            question = f"(customer {tag}-{client_index}) " + QUESTIONS[(client_index * 3 + number) % len(QUESTIONS)]
            if workload == "shared-system":
                messages = [history[0], {"role": "user", "content": question}]
            else:
                messages = history + [{"role": "user", "content": question}]
            start = time.perf_counter()
            first, tokens, cached, text, error = None, 0, 0, [], None
            try:
                stream = client.chat.completions.create(
                    model=model, messages=messages, max_tokens=max_tokens, temperature=0.8,
                    seed=client_index * 1000 + number, stream=True, stream_options={"include_usage": True},
                    extra_body={"ignore_eos": True})
                for chunk in stream:
                    if first is None and chunk.choices and chunk.choices[0].delta.content:
                        first = time.perf_counter() - start  # the first generated text, not the role chunk
                    if chunk.choices and chunk.choices[0].delta.content:
                        text.append(chunk.choices[0].delta.content)
                    if chunk.usage is not None:
                        tokens = chunk.usage.completion_tokens
                        cached = chunk.usage.prompt_tokens_details.cached_tokens
            except Exception as failure:  # noqa: BLE001 - counted, reported
                error = f"{type(failure).__name__}: {failure}"
            if workload == "multi-turn":
                history = messages + [{"role": "assistant", "content": "".join(text)}]
            records.append({"latency": time.perf_counter() - start, "ttft": first if first is not None else 0.0,
                            "tokens": tokens, "cached": cached, "error": error})
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
    parser.add_argument("--workload", choices=["plain", "shared-system", "multi-turn"], default="plain")
    parser.add_argument("--prefix-cache", choices=["both", "on", "off"], default="both",
                        help="for the chat workloads: run with the prefix cache, without, or both (default)")
    parser.add_argument("--json", default=None, help="also write the results to this file")
    args = parser.parse_args()
    levels = [int(level) for level in args.clients.split(",")]
    results = []
    settings = ["on"] if args.workload == "plain" else (["on", "off"] if args.prefix_cache == "both"
                                                          else [args.prefix_cache])
    for setting in settings:
        run_server(args, levels, setting, results)
    print(f"workload {args.workload}")
    print(f"{'cache':>5} {'clients':>7} {'req/s':>7} {'out tok/s':>9} {'p50 s':>7} {'p99 s':>7} {'ttft p50':>8} "
          f"{'ttft p99':>8} {'cached/prompt':>13} {'rows/step':>9} {'errors':>6}")
    for r in results:
        print(f"{r['prefix_cache']:>5} {r['clients']:>7} {r['requests_per_s']:>7.2f} {r['output_tokens_per_s']:>9.1f} "
              f"{r['latency_p50']:>7.2f} {r['latency_p99']:>7.2f} {r['ttft_p50']:>8.3f} {r['ttft_p99']:>8.3f} "
              f"{r['cached_per_prompt']:>13.1f} {r['mean_rows_per_step']:>9.2f} {r['errors']:>6}")
    print(f"({args.requests} requests per client, {args.max_tokens} tokens each, EOS ignored)")
    for r in results:
        if r["first_error"]:
            print(f"{r['clients']} clients, first error: {r['first_error']}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


def run_server(args, levels: list[int], setting: str, results: list[dict]) -> None:
    """Start one server (prefix cache `setting`), run every concurrency level on it."""
    options = ["--max-rows", str(max(levels)), "--max-queue", str(4 * max(levels)), "--threads", args.threads]
    if setting == "off":
        options.append("--no-prefix-cache")
    if args.workload == "plain":
        def worker(url, model, i, clients):
            return one_client(url, model, i, args.requests, args.max_tokens)
    else:
        def worker(url, model, i, clients):
            return chat_client(url, model, i, args.requests, args.max_tokens, args.workload, str(clients))
    with serve_process(*options) as server:
        model = json.loads(server.get("/v1/models"))["data"][0]["id"]
        one_client(server.url, model, 0, 1, 4)  # warm-up (a plain prompt: nothing of the workload cached)
        for clients in levels:
            steps0 = server.metric("metagen_decode_steps_total")
            rows0 = server.metric("metagen_decode_step_rows_total")
            start = time.perf_counter()
            with ThreadPoolExecutor(clients) as pool:
                runs = list(pool.map(lambda i: worker(server.url, model, i, clients), range(clients)))
            wall = time.perf_counter() - start
            records = [record for run in runs for record in run]
            ok = [record for record in records if record["error"] is None]
            steps = server.metric("metagen_decode_steps_total") - steps0
            rows = server.metric("metagen_decode_step_rows_total") - rows0
            results.append({
                "prefix_cache": setting, "clients": clients,
                "cached_per_prompt": sum(r.get("cached", 0) for r in ok) / max(1, len(ok)),
                "requests": len(records), "errors": len(records) - len(ok),
                "requests_per_s": len(ok) / wall, "output_tokens_per_s": sum(r["tokens"] for r in ok) / wall,
                "latency_p50": percentile([r["latency"] for r in ok], 0.5),
                "latency_p99": percentile([r["latency"] for r in ok], 0.99),
                "ttft_p50": percentile([r["ttft"] for r in ok], 0.5),
                "ttft_p99": percentile([r["ttft"] for r in ok], 0.99),
                "mean_rows_per_step": rows / steps if steps else 0.0,
                "first_error": next((r["error"] for r in records if r["error"]), None),
            })


if __name__ == "__main__":
    main()
