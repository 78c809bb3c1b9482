"""How long a running stream of `metagen serve` stalls while a long prompt arrives.

One client streams a completion (EOS ignored) and records when each chunk arrives; the gaps
between consecutive chunks are its inter-token latencies. Two phases on one server:
- alone: the stream with nothing else running;
- long prompt: the same stream, and once it has emitted `--warmup` tokens a second client sends a
  `--prompt-tokens`-token prompt (distinct text, so no prefix is reused) asking for one token.
Per phase: the stream's median, p99 and max gap, and for the second phase the long prompt's time
to its answer. A whole-prompt prefill stops every running stream for the prompt's whole prefill;
a chunked one (`--prefill-chunk`) for one chunk per step.

The server runs whatever `metagen` PYTHONPATH points at, so the same script measures two
checkouts:

    PYTHONPATH=src python benchmarks/prefill_stall.py [--prefill-chunk 256] [--prompt-tokens 3000]
                                                      [--max-tokens 300] [--repeats 2]
(the server runs on 2 threads, as the tests' servers do).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "serve"))

from server import serve_process  # noqa: E402  (tests/serve/server.py: start, wait for /health, stop)

WORDS = ("bread oven flour crust rye loaf tart apple butter dough morning street baker shop window price "
         "croissant sugar salt yeast").split()


def _post(url: str, body: dict, timeout: float = 600.0):
    request = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    return urllib.request.urlopen(request, timeout=timeout)


def stream_gaps(url: str, max_tokens: int, started: threading.Event, warmup: int) -> list[float]:
    """Stream one completion; the seconds between consecutive chunks. Sets `started` after `warmup` chunks."""
    body = {"prompt": "Tell me a long story about a bakery.", "max_tokens": max_tokens, "ignore_eos": True,
            "temperature": 0, "stream": True}
    arrivals = []
    with _post(url, body) as answer:
        for line in answer:
            if line.startswith(b"data: {"):
                arrivals.append(time.perf_counter())
                if len(arrivals) == warmup:
                    started.set()
    started.set()
    return [b - a for a, b in zip(arrivals, arrivals[1:])]


def long_prompt(tokens: int, salt: int) -> str:
    """About `tokens` tokens of distinct words (~1 token per word on SmolLM2's vocabulary)."""
    return " ".join(WORDS[(i * 7 + salt) % len(WORDS)] + ("." if i % 13 == 12 else "") for i in range(tokens))


def phase(url: str, args, prompt: str | None) -> tuple[list[float], float | None]:
    started = threading.Event()
    result: dict = {}
    streamer = threading.Thread(target=lambda: result.update(gaps=stream_gaps(url, args.max_tokens, started,
                                                                              args.warmup)))
    streamer.start()
    latency = None
    if prompt is not None:
        started.wait()
        start = time.perf_counter()
        with _post(url, {"prompt": prompt, "max_tokens": 1, "temperature": 0}) as answer:
            usage = json.loads(answer.read())["usage"]
        latency = time.perf_counter() - start
        print(f"    long prompt: {usage['prompt_tokens']} tokens answered in {latency:.2f} s", flush=True)
    streamer.join()
    return result["gaps"], latency


def summary(gaps: list[float]) -> str:
    ordered = sorted(gaps)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return (f"{len(gaps)} gaps, median {statistics.median(gaps) * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms, "
            f"max {max(gaps) * 1000:.0f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prefill-chunk", type=int, default=None, help="passed to metagen serve (default: its own)")
    parser.add_argument("--prompt-tokens", type=int, default=3000)
    parser.add_argument("--max-tokens", type=int, default=300, help="tokens of the running stream")
    parser.add_argument("--warmup", type=int, default=20, help="stream tokens before the long prompt is sent")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    options = ["--max-rows", "4", "--no-prefix-cache"]
    if args.prefill_chunk is not None:
        options += ["--prefill-chunk", str(args.prefill_chunk)]
    import metagen

    print(f"metagen from {Path(metagen.__file__).parent}; serve {' '.join(options)}", flush=True)
    with serve_process(*options) as server:
        phase(server.url, argparse.Namespace(**{**vars(args), "max_tokens": 8}), None)  # warm the server
        for repeat in range(args.repeats):
            alone, _ = phase(server.url, args, None)
            print(f"  run {repeat + 1} alone:       {summary(alone)}", flush=True)
            loaded, _ = phase(server.url, args, long_prompt(args.prompt_tokens, repeat))
            print(f"  run {repeat + 1} long prompt: {summary(loaded)}", flush=True)


if __name__ == "__main__":
    main()
