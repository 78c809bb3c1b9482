"""What llama.cpp-style int8 activation codes trade against the default int16 ones, in one run.

Per model (the embedded SmolLM2 and each `--model` file), both settings of
`load(..., activations=)`:

- faithfulness: teacher-forced over faithfulness.py's prompts + greedy fp32 continuations, against
  the fp32 dequantized checkpoint — max |Δlogit|, mean KL(fp32 ‖ setting) per position and top-1
  agreement (faithfulness.py's `compare`), with llama.cpp (llama-cpp-python, when installed) on
  the same file and positions as the yardstick: it rounds activations to 8 bits itself.
- cost: CPU milliseconds of one forward over a CONTEXT-token cached prompt — a 1-token step, a
  5-token verification (logits at every position), a 16-row step (forks of the prompt) — and of
  batch-1 greedy decoding per token (DECODE_TOKENS steps), each the best of `--repeats` rounds
  that alternate the settings (the cache is truncated back after every step). CPU time of the
  process with `--threads` (1 by default) is what a shared machine distorts least; the wall
  time of the same best round is printed next to it.

    python benchmarks/activations.py [--model FILE.gguf ...] [--repeats 5] [--threads 1] [--markdown]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from faithfulness import compare, llama_cpp_logits, reference_sequences  # noqa: E402

from metagen.models import load  # noqa: E402
from metagen.models.embedded import embedded_model_path  # noqa: E402
from metagen.models.kernel_backend import ACTIVATIONS  # noqa: E402

CONTEXT = 60  # cached prompt tokens every timed step attends to
DECODE_TOKENS = 16  # greedy steps of the batch-1 decode timing
CALLS = 4  # calls per timed round (a round's figure is their mean)
CASES = ("1-token step", "5-token verification", "16-row step", "decode ms/token")


def timed(run, calls: int) -> tuple[float, float]:
    """(CPU ms, wall ms) per call of `run` (called `calls` times)."""
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(calls):
        run()
    return (time.process_time() - cpu) * 1e3 / calls, (time.perf_counter() - wall) * 1e3 / calls


def one_round(model) -> dict[str, tuple[float, float]]:
    """(CPU ms, wall ms) of each of CASES, once."""
    prompt = [(17 * i + 5) % model.vocab_size for i in range(CONTEXT)]
    cache = model.new_cache(1, capacity=CONTEXT + DECODE_TOKENS + 8)
    model.forward(cache, [prompt])

    def step(tokens: int):
        def run():
            model.forward(cache, [[42] * tokens], logits="all" if tokens > 1 else "last")
            cache.truncate(0, CONTEXT)
        return run

    def decode():
        token = 42
        for _ in range(DECODE_TOKENS):
            token = int(model.forward(cache, [[token]]).logits[0].argmax())
        cache.truncate(0, CONTEXT)

    rows = model.new_cache(1, capacity=16 * (CONTEXT + 8))
    model.forward(rows, [prompt])
    rows.select([0] * 16)

    def sixteen():
        model.forward(rows, [[42]] * 16)
        for row in range(16):
            rows.truncate(row, CONTEXT)

    costs = {CASES[0]: timed(step(1), CALLS), CASES[1]: timed(step(5), CALLS), CASES[2]: timed(sixteen, CALLS)}
    cpu, wall = timed(decode, 1)
    costs[CASES[3]] = (cpu / DECODE_TOKENS, wall / DECODE_TOKENS)
    return costs


def measure(path: Path, repeats: int, yardstick: bool) -> dict:
    """Faithfulness and best-of-`repeats` costs of each setting on the model at `path`."""
    reference = load(path, "fp32")
    sequences = reference_sequences(reference)
    ref_logits = [reference.forward(reference.new_cache(1), [ids], logits="all").logits[0] for ids in sequences]
    name = reference.name
    del reference
    models = {setting: load(path, activations=setting) for setting in ACTIVATIONS}
    faithful = {}
    for setting, model in models.items():
        logits = [model.forward(model.new_cache(1), [ids], logits="all").logits[0] for ids in sequences]
        faithful[setting] = compare(ref_logits, logits)
    if yardstick:
        faithful["llama.cpp"] = compare(ref_logits, llama_cpp_logits(path, sequences))
    for model in models.values():  # warm-up: the kernels' first calls, the caches' pools
        one_round(model)
    best = {setting: {} for setting in models}
    for round_index in range(repeats):
        order = ACTIVATIONS if round_index % 2 == 0 else ACTIVATIONS[::-1]  # alternate who goes first
        for setting in order:
            for case, (cpu, wall) in one_round(models[setting]).items():
                if case not in best[setting] or cpu < best[setting][case][0]:
                    best[setting][case] = (cpu, wall)
    positions = sum(len(ids) for ids in sequences)
    return {"name": name, "positions": positions, "faithful": faithful, "cost": best}


def report(result: dict, markdown: bool) -> None:
    print(f"\n{result['name']} ({result['positions']} positions over 4 prompts)")
    if markdown:
        print("\n| activations | max abs Δlogit | mean KL(fp32 ‖ it) | top-1 agreement |")
        print("|---|---|---|---|")
    for setting, (diff, kl, agreement) in result["faithful"].items():
        if markdown:
            print(f"| {setting} | {diff:.3f} | {kl:.5f} | {agreement:.2%} |")
        else:
            print(f"{setting:>9}: max|Δlogit| {diff:.3f}  mean KL {kl:.5f}  top-1 {agreement:.2%}")
    int16 = result["cost"]["int16"]
    if markdown:
        print(f"\n| activations | {' | '.join(CASES)} |")
        print("|---|" + "---|" * len(CASES))
    for setting, costs in result["cost"].items():
        cells = []
        for case in CASES:
            cpu, wall = costs[case]
            ratio = f", {cpu / int16[case][0]:.2f}×" if setting != "int16" else ""
            cells.append(f"{cpu:.2f} ms ({wall:.2f} wall{ratio})")
        print(f"| {setting} | {' | '.join(cells)} |" if markdown else f"{setting:>9}: " + "; ".join(
            f"{case} {cell}" for case, cell in zip(CASES, cells)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", action="append", default=None, metavar="PATH",
                        help="a GGUF file or HF directory (repeatable); the embedded SmolLM2 always runs first")
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds per setting (best kept)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    if args.repeats < 1 or args.threads < 1:
        raise SystemExit("--repeats and --threads must be >= 1")
    torch.set_num_threads(args.threads)
    try:
        import llama_cpp  # noqa: F401
        yardstick = True
    except ImportError:
        yardstick = False
        print("(llama-cpp-python is not installed: no llama.cpp yardstick)")
    print(f"{args.threads} thread(s), best of {args.repeats} alternating rounds, context {CONTEXT} tokens; "
          f"timings in CPU ms of this process (wall ms of the same round beside)")
    for path in [embedded_model_path(), *(Path(p) for p in args.model or [])]:
        report(measure(path, args.repeats, yardstick), args.markdown)


if __name__ == "__main__":
    main()
