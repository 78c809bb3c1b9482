"""Load on `metagen serve` and on llama.cpp's own server: 1, 4 and 16 concurrent openai clients
(by default), each sending streamed completions one after another (EOS ignored, so every request
generates `--max-tokens` tokens) for `--duration` seconds (or `--requests` each), against servers
started here on 127.0.0.1 (all of them up at once, idle while another is measured; each level
runs on every server before the next level starts, so slow drifts of the machine hit all of them
alike), on the same GGUF with the same threads.

Per server and concurrency level: requests/s and output tokens/s over the level's wall time,
p50 / p99 latency and time to first token (first streamed text), errors (must be 0), and for
metagen the mean rows per decode step read from /metrics (how much continuous batching batched).
The peer is `llama-server` (`--llama-server PATH`; built from the llama.cpp sources that
llama-cpp-python vendors, since the wheel ships only the library) with `--parallel` slots equal to
the most clients, continuous batching, the same context per slot as metagen's rows and its
per-slot prompt cache on (its default).

Workloads (`--workload`):
- plain: short distinct completion prompts (above);
- shared-system: chat requests with one ~500-token system prompt and a distinct question each;
- multi-turn: each client holds a chat; request k sends the k previous questions and answers
  plus a new question (turn k's prompt starts with turn k-1's prompt and answer).
The two chat workloads run on a server with the prefix cache and on one without (`--prefix-cache
both`), and also report the prompt tokens taken from the cache (`cached_tokens` of the usage).

`--soak SECONDS` instead runs `--soak-clients` (8) plain clients for that long against each server
and samples the server process's resident memory every 10 s: the first and last samples, the
peak, and errors. `--hostile K` soaks each server a second time with K hostile clients beside the
valid ones (benchmarks/hostile.py: malformed, oversized and work-multiplying requests), and
reports what each hostile request was answered, and the number of /metrics lines after each run.

    python benchmarks/serve.py [--workload plain|shared-system|multi-turn] [--clients 1,4,16]
                               [--duration 30 | --requests 4] [--max-tokens 32] [--threads 2]
                               [--prefix-cache both|on|off] [--llama-server PATH] [--soak SECONDS [--hostile K]]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "serve"))

from server import Server, serve_process  # noqa: E402  (tests/serve/server.py: start, wait for /health, stop)

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
    f"Rule {i + 1}: {rule}" for i, rule in enumerate(SYSTEM_RULES + SYSTEM_RULES[:4]))  # 510 tokens (SmolLM2)
QUESTIONS = ["How much is a croissant?", "Do you deliver to the station?", "Is the rye loaf vegan?",
             "Can I order thirty rolls for Friday?", "Are you open on Sunday?", "What has almonds in it?",
             "What do you suggest if the brioche is sold out?", "How much are two baguettes?"]

PROMPTS = ["The history of the printing press", "A recipe for bread:", "def quicksort(items):",
           "The three laws of motion are", "Once upon a time in a small village", "Photosynthesis is"]


def numbers(requests: int, deadline: float | None):
    """Request numbers 0, 1, ...: `requests` of them, or as many as start before `deadline`."""
    number = 0
    while (number < requests) if deadline is None else (time.perf_counter() < deadline):
        yield number
        number += 1


def one_client(url: str, model: str, client_index: int, requests: int, max_tokens: int,
               deadline: float | None = None) -> list[dict]:
    from openai import OpenAI

    records = []
    with OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=600) as client:
        for number in numbers(requests, deadline):
            start = time.perf_counter()
            first, tokens, error = None, 0, None
            try:
                stream = client.completions.create(
                    model=model, prompt=PROMPTS[(client_index + number) % len(PROMPTS)], max_tokens=max_tokens,
                    temperature=0.8, seed=client_index * 1000 + number, stream=True,
                    stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
                for chunk in stream:
                    if first is None and chunk.choices and chunk.choices[0].text:
                        first = time.perf_counter() - start
                    if chunk.usage is not None:
                        tokens = chunk.usage.completion_tokens
            except Exception as failure:  # noqa: BLE001 - counted, reported
                error = f"{type(failure).__name__}: {failure}"
            records.append({"latency": time.perf_counter() - start, "ttft": first, "tokens": tokens, "error": error})
    return records


def chat_client(url: str, model: str, client_index: int, requests: int, max_tokens: int, workload: str,
                tag: str, deadline: float | None = None) -> list[dict]:
    """The chat workloads: shared-system (one system prompt, a new question per request) or multi-turn
    (one growing conversation per client). `tag` names the customer, so that no run reuses another
    run's conversations."""
    from openai import OpenAI

    records = []
    history = [{"role": "system", "content": SYSTEM_PROMPT}]
    with OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=600) as client:
        for number in numbers(requests, deadline):
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
                        details = chunk.usage.prompt_tokens_details
                        cached = (details.cached_tokens or 0) if details is not None else 0
            except Exception as failure:  # noqa: BLE001 - counted, reported
                error = f"{type(failure).__name__}: {failure}"
            if workload == "multi-turn":
                history = messages + [{"role": "assistant", "content": "".join(text)}]
            records.append({"latency": time.perf_counter() - start, "ttft": first if first is not None else 0.0,
                            "tokens": tokens, "cached": cached, "error": error})
    return records


SLOT_CONTEXT = 8192  # tokens of context per llama-server slot: the embedded model's context, as metagen's rows have


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def rss_mib(server) -> float:
    """Resident memory of a server's process (`server.process`), MiB."""
    for line in Path(f"/proc/{server.process.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextmanager
def llama_server(binary: str, gguf: str, threads: str, slots: int, context_per_slot: int):
    """llama.cpp's `llama-server` on a free port: `slots` parallel slots, continuous batching, waits
    for /health, killed (its process group) when the block ends."""
    port = free_port()
    command = [binary, "-m", gguf, "--host", "127.0.0.1", "--port", str(port), "-t", threads, "-tb", threads,
               "--parallel", str(slots), "-c", str(slots * context_per_slot), "--cont-batching", "--no-webui"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    server = Server(process, port)  # its URL and GET
    try:
        deadline = time.monotonic() + 120
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"llama-server exited with {process.returncode}: {process.stderr.read()[-2000:]}")
            try:
                if '"ok"' in server.get("/health"):
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("llama-server did not answer /health within 120 s")
            time.sleep(0.2)
        threading.Thread(target=process.stderr.read, daemon=True).start()  # drain its log
        yield server
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", default="1,4,16")
    parser.add_argument("--requests", type=int, default=4, help="requests per client (without --duration)")
    parser.add_argument("--duration", type=float, default=0.0, help="seconds per level; clients start requests "
                                                                   "until then (0: --requests each)")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--threads", default="2")
    parser.add_argument("--workload", choices=["plain", "shared-system", "multi-turn"], default="plain")
    parser.add_argument("--prefix-cache", choices=["both", "on", "off"], default="both",
                        help="for the chat workloads: metagen with the prefix cache, without, or both (default)")
    parser.add_argument("--llama-server", default=None, help="path of llama.cpp's llama-server: also measure it")
    parser.add_argument("--soak", type=float, default=0.0, help="seconds of the soak run (plain workload)")
    parser.add_argument("--soak-clients", type=int, default=8)
    parser.add_argument("--hostile", type=int, default=0,
                        help="with --soak: soak again beside this many hostile clients (benchmarks/hostile.py)")
    parser.add_argument("--json", default=None, help="also write the results to this file")
    args = parser.parse_args()
    if args.soak:
        results = soak(args)
    else:
        results = load_levels(args)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


def servers(args, levels: list[int]):
    """(label, context manager factory) of every server the run measures."""
    from metagen.models.embedded import embedded_model_path

    max_rows = max(levels)
    settings = ["on"] if args.workload == "plain" or args.soak else (
        ["on", "off"] if args.prefix_cache == "both" else [args.prefix_cache])
    for setting in settings:
        options = ["--max-rows", str(max_rows), "--max-queue", str(4 * max_rows), "--threads", args.threads]
        if setting == "off":
            options.append("--no-prefix-cache")
        yield f"metagen cache {setting}", lambda options=options: serve_process(*options)
    if args.llama_server:
        yield "llama.cpp", lambda: llama_server(args.llama_server, str(embedded_model_path()), args.threads,
                                                max_rows, SLOT_CONTEXT)


def load_levels(args) -> list[dict]:
    levels = [int(level) for level in args.clients.split(",")]
    results = []
    with ExitStack() as stack:  # every server up at once; the levels alternate between them
        running = []
        for label, start in servers(args, levels):
            server = stack.enter_context(start())
            model = json.loads(server.get("/v1/models"))["data"][0]["id"]
            one_client(server.url, model, 0, 1, 4)  # warm-up (a plain prompt: nothing of the workload cached)
            running.append((label, server, model))
        for clients in levels:
            for label, server, model in running:
                results.append(run_level(args, server, model, label, clients))
    print(f"workload {args.workload}")
    print(f"{'server':>17} {'clients':>7} {'req/s':>7} {'out tok/s':>9} {'p50 s':>7} {'p99 s':>7} {'ttft p50':>8} "
          f"{'ttft p99':>8} {'cached/prompt':>13} {'rows/step':>9} {'errors':>6}")
    for r in results:
        print(f"{r['server']:>17} {r['clients']:>7} {r['requests_per_s']:>7.2f} {r['output_tokens_per_s']:>9.1f} "
              f"{r['latency_p50']:>7.2f} {r['latency_p99']:>7.2f} {r['ttft_p50']:>8.3f} {r['ttft_p99']:>8.3f} "
              f"{r['cached_per_prompt']:>13.1f} {r['mean_rows_per_step']:>9.2f} {r['errors']:>6}")
    per = f"for {args.duration:g} s per level" if args.duration else f"{args.requests} requests per client"
    print(f"({per}, {args.max_tokens} tokens each, EOS ignored, {args.threads} threads)")
    for r in results:
        if r["first_error"]:
            print(f"{r['server']}, {r['clients']} clients, first error: {r['first_error']}")
    return results


def worker_for(args, deadline: float | None):
    if args.workload == "plain" or args.soak:
        return lambda url, model, i, clients: one_client(url, model, i, args.requests, args.max_tokens, deadline)
    return lambda url, model, i, clients: chat_client(url, model, i, args.requests, args.max_tokens, args.workload,
                                                      str(clients), deadline)


def metric(server, name: str) -> float:
    """An unlabelled metagen metric from /metrics (0 for servers without it)."""
    try:
        text = server.get("/metrics")
    except OSError:
        return 0.0
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def run_level(args, server, model: str, label: str, clients: int) -> dict:
    steps0 = metric(server, "metagen_decode_steps_total")
    rows0 = metric(server, "metagen_decode_step_rows_total")
    start = time.perf_counter()
    worker = worker_for(args, start + args.duration if args.duration else None)
    with ThreadPoolExecutor(clients) as pool:
        runs = list(pool.map(lambda i: worker(server.url, model, i, clients), range(clients)))
    wall = time.perf_counter() - start
    records = [record for run in runs for record in run]
    ok = [record for record in records if record["error"] is None]
    steps = metric(server, "metagen_decode_steps_total") - steps0
    rows = metric(server, "metagen_decode_step_rows_total") - rows0
    return {
        "server": label, "clients": clients, "latency_max": max((r["latency"] for r in ok), default=float("nan")),
        "cached_per_prompt": sum(r.get("cached", 0) for r in ok) / max(1, len(ok)),
        "requests": len(records), "errors": len(records) - len(ok),
        "requests_per_s": len(ok) / wall, "output_tokens_per_s": sum(r["tokens"] for r in ok) / wall,
        "latency_p50": percentile([r["latency"] for r in ok], 0.5),
        "latency_p99": percentile([r["latency"] for r in ok], 0.99),
        "ttft_p50": percentile([r["ttft"] for r in ok if r["ttft"] is not None], 0.5),
        "ttft_p99": percentile([r["ttft"] for r in ok if r["ttft"] is not None], 0.99),
        "mean_rows_per_step": rows / steps if steps else 0.0,
        "first_error": next((r["error"] for r in records if r["error"]), None),
    }


def soak(args) -> list[dict]:
    """`--soak-clients` plain clients for `--soak` seconds per server; resident memory every 10 s.
    With `--hostile K`, each server is soaked twice in one run: the valid clients alone, then the
    same clients beside K hostile ones (benchmarks/hostile.py), so their latency and errors can be
    read side by side."""
    results, hostile_runs = [], [0] + ([args.hostile] if args.hostile else [])
    for label, start in servers(args, [args.soak_clients]):
        with start() as server:
            model = json.loads(server.get("/v1/models"))["data"][0]["id"]
            one_client(server.url, model, 0, 1, 4)
            for hostile in hostile_runs:
                results.append(soak_run(args, server, model, label, hostile))
    print(f"soak: {args.soak_clients} clients for {args.soak:g} s, {args.max_tokens} tokens per request")
    print(f"{'server':>17} {'hostile':>7} {'requests':>8} {'errors':>6} {'out tok/s':>9} {'p50 s':>7} {'p99 s':>7} "
          f"{'max s':>7} {'RSS first':>9} {'RSS last':>8} {'RSS peak':>8} {'/metrics lines':>14}")
    for r in results:
        print(f"{r['server']:>17} {r['hostile']:>7} {r['requests']:>8} {r['errors']:>6} "
              f"{r['output_tokens_per_s']:>9.1f} {r['latency_p50']:>7.2f} {r['latency_p99']:>7.2f} "
              f"{r['latency_max']:>7.2f} {r['rss_first_mib']:>9.0f} {r['rss_last_mib']:>8.0f} "
              f"{r['rss_peak_mib']:>8.0f} {r['metrics_lines']:>14}")
        for name, entry in r.get("hostile_answers", {}).items():
            statuses = ", ".join(f"{status} x{count}" for status, count in sorted(entry["statuses"].items()))
            print(f"{'':>19}{name:<26} {statuses:<28} slowest {entry['max_seconds']:.1f} s")
        if r["first_error"]:
            print(f"{'':>19}first error of a valid client: {r['first_error']}")
    return results


def soak_run(args, server, model: str, label: str, hostile: int) -> dict:
    """One soak of `server`: the valid clients for `--soak` seconds, beside `hostile` hostile ones."""
    from hostile import hostile_client, summary  # benchmarks/hostile.py

    samples, done = [rss_mib(server)], threading.Event()

    def sample() -> None:
        while not done.wait(10.0):
            samples.append(rss_mib(server))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    stop_at = time.perf_counter() + args.soak
    with ThreadPoolExecutor(max(1, hostile)) as pool:
        attacks = [pool.submit(hostile_client, server.url, model, 5 * index, stop_at) for index in range(hostile)]
        soak_args = argparse.Namespace(**{**vars(args), "duration": args.soak})
        row = run_level(soak_args, server, model, label, args.soak_clients)
        records = [record for attack in attacks for record in attack.result()]
    done.set()
    sampler.join()
    samples.append(rss_mib(server))
    row.update(hostile=hostile, rss_first_mib=samples[0], rss_last_mib=samples[-1], rss_peak_mib=max(samples),
               rss_samples=samples, metrics_lines=len(server.get("/metrics").splitlines()))
    if hostile:
        row["hostile_answers"] = summary(records)
    return row


if __name__ == "__main__":
    main()
