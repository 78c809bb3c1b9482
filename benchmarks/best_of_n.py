"""16 samples from one prompt: one batched call vs one sample vs 16 separate calls vs transformers.

What best-of-N, voting and MBR pay for their samples, on the embedded SmolLM2-135M-Instruct,
all in one run with the same ~200-token chat prompt (ids computed once), temperature 1, EOS
ignored so every sample has exactly `--tokens` new tokens:

- metagen, n samples in one `LocalGenerator.generate` call: the prompt is prefilled once and the
  cache forked into n rows (Cost shows prompt tokens reused = (n − 1) × prompt length);
- metagen, one sample (the reference for the target "16 samples ≤ 2.5 × one sample");
- metagen, 16 separate one-sample calls (what a strategy without prompt sharing pays);
- transformers `generate(num_return_sequences=16, do_sample=True)` and one sample, on the same
  GGUF weights dequantized to fp32 (its attention over the repeated prompt is recomputed per row).

metagen runs in its default int4 weights and in fp32 (the same numbers transformers uses).
Each measurement runs once as warm-up, then `--repeats` times; the best wall time is reported.

Run:  .venv/bin/python benchmarks/best_of_n.py --markdown
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import time
from pathlib import Path

import torch

from metagen.decoding import LocalGenerator
from metagen.models import embedded_model_path, load
from metagen.sampling import SamplingParams
from metagen.tables import table as render

PASSAGE = (
    "The Amazon rainforest covers much of the Amazon basin of South America. The basin spans about "
    "seven million square kilometres, of which five and a half million are covered by the rainforest. "
    "The region includes territory belonging to nine nations and 3,344 formally acknowledged indigenous "
    "territories. The majority of the forest is contained within Brazil, with 60% of the rainforest, "
    "followed by Peru with 13%, Colombia with 10%, and with minor amounts in Bolivia, Ecuador, French "
    "Guiana, Guyana, Suriname, and Venezuela. The rainforest likely formed during the Eocene era, after "
    "a global reduction of tropical temperatures when the Atlantic Ocean had widened sufficiently to "
    "provide a warm, moist climate to the Amazon basin. It has been in existence for at least 55 million "
    "years, and most of the region remained free of savanna-type biomes at least until the current ice age."
)
PROMPT = [{"role": "user", "content": PASSAGE + "\n\nWrite a short story set in this forest."}]
SEED = 0


def best(run, repeats: int) -> tuple[float, object]:
    run()  # warm-up
    results = [run() for _ in range(repeats)]
    return min(r[0] for r in results), results[0][1]


def measure_metagen(dtype: str, prompt_ids: list[int], args) -> list[dict]:
    model = load(dtype=dtype)
    generator = LocalGenerator(model, prompt_cache=False)  # every call cold: what the recorded table measured

    def call(n: int):
        params = SamplingParams(temperature=1.0, max_tokens=args.tokens, ignore_eos=True, n=n, seed=SEED)
        start = time.perf_counter()
        result = generator.generate(prompt_ids, params)
        return time.perf_counter() - start, result

    def separate():
        start = time.perf_counter()
        costs = [call(1)[1].cost for _ in range(args.samples)]
        return time.perf_counter() - start, costs

    one, _ = best(lambda: call(1), args.repeats)
    batched, result = best(lambda: call(args.samples), args.repeats)
    apart, costs = best(separate, args.repeats)
    cost = result.cost
    return [
        {"engine": f"metagen {dtype}", "run": "1 sample", "seconds": one},
        {"engine": f"metagen {dtype}", "run": f"{args.samples} samples, one call", "seconds": batched,
         "prompt_tokens_computed": cost.prompt_tokens_computed, "prompt_tokens_reused": cost.prompt_tokens_reused,
         "generated_tokens": cost.generated_tokens, "flops": cost.flops},
        {"engine": f"metagen {dtype}", "run": f"{args.samples} separate calls", "seconds": apart,
         "prompt_tokens_computed": sum(c.prompt_tokens_computed for c in costs),
         "prompt_tokens_reused": sum(c.prompt_tokens_reused for c in costs),
         "generated_tokens": sum(c.generated_tokens for c in costs)},
    ]


def measure_transformers(path: Path, prompt_ids: list[int], args) -> list[dict]:
    import transformers
    from transformers import AutoModelForCausalLM

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    with contextlib.redirect_stderr(io.StringIO()):
        model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    model.eval()
    pad = model.generation_config.eos_token_id
    pad = pad[0] if isinstance(pad, list) else pad
    ids = torch.tensor([prompt_ids])

    def call(n: int):
        torch.manual_seed(SEED)
        start = time.perf_counter()
        with torch.inference_mode():
            output = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True,
                                    temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=args.tokens,
                                    min_new_tokens=args.tokens, num_return_sequences=n, pad_token_id=pad)
        return time.perf_counter() - start, output.shape

    one, _ = best(lambda: call(1), args.repeats)
    batched, shape = best(lambda: call(args.samples), args.repeats)
    assert shape == (args.samples, len(prompt_ids) + args.tokens), shape
    return [
        {"engine": "transformers fp32", "run": "1 sample", "seconds": one},
        {"engine": "transformers fp32", "run": f"{args.samples} samples, num_return_sequences", "seconds": batched},
    ]


def table(rows: list[dict], markdown: bool) -> str:
    one = {r["engine"]: r["seconds"] for r in rows if r["run"] == "1 sample"}
    reference = next(r["seconds"] for r in rows if r["engine"].startswith("transformers") and r["run"] != "1 sample") \
        if any(r["engine"].startswith("transformers") for r in rows) else None
    header = ["engine", "run", "wall s", "× its 1 sample", "speed-up vs transformers 16", "prompt computed / reused"]
    lines = [header]
    for r in rows:
        reuse = (f"{r['prompt_tokens_computed']} / {r['prompt_tokens_reused']}" if "prompt_tokens_computed" in r else "")
        lines.append([r["engine"], r["run"], f"{r['seconds']:.2f}", f"{r['seconds'] / one[r['engine']]:.2f}",
                      f"{reference / r['seconds']:.2f}×" if reference and r["run"] != "1 sample" else "", reuse])
    return render(header, lines[1:], markdown)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dtypes", default="int4,fp32")
    parser.add_argument("--skip-hf", action="store_true")
    parser.add_argument("--out", default=None, help="JSON with every number")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    path = embedded_model_path()
    tokenizer = load().tokenizer
    prompt_ids = tokenizer.encode_chat(PROMPT, add_generation_prompt=True)
    print(f"prompt {len(prompt_ids)} tokens, {args.samples} samples x {args.tokens} tokens, "
          f"{args.threads} threads, best of {args.repeats}", file=sys.stderr)
    rows = []
    for dtype in args.dtypes.split(","):
        rows += measure_metagen(dtype, prompt_ids, args)
        print(f"  metagen {dtype} done", file=sys.stderr, flush=True)
    if not args.skip_hf:
        rows += measure_transformers(path, prompt_ids, args)
        print("  transformers done", file=sys.stderr, flush=True)
    print(table(rows, args.markdown))
    if args.out:
        Path(args.out).write_text(json.dumps({"prompt_tokens": len(prompt_ids), "args": vars(args), "rows": rows},
                                             indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
