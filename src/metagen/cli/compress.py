"""`metagen compress [MODEL] --method ... --out DIR`: quantize and/or prune every linear of the
decoder layers (`metagen.compress`), calibrated layer by layer on a text file for the
second-order methods, and save the result; `--model DIR` loads it in every other command."""

from __future__ import annotations

import argparse
import json

from metagen.cli.perplexity import progress_bar, read_text


def add_parser(commands) -> None:
    parser = commands.add_parser("compress", help="quantize / prune a model (GPTQ, SparseGPT, OBC, RTN, magnitude)")
    parser.add_argument("model", nargs="?", default=None, help="GGUF file, HF directory or hub name OWNER/NAME[:QUANT] (default: embedded model)")
    parser.add_argument("--method", required=True, choices=["rtn", "magnitude", "obc", "gptq", "sparsegpt"],
                        help="compression method (obc, gptq and sparsegpt need --calibration)")
    parser.add_argument("--bits", type=int, default=None, choices=[3, 4, 8], help="quantize to this many bits")
    parser.add_argument("--group-size", type=int, default=32, help="input features per grid for 3/4 bits (default 32)")
    parser.add_argument("--clip", action="store_true", help="choose each grid's clipping range by least squared error")
    parser.add_argument("--sparsity", default=None, help="fraction to prune (e.g. 0.5) or N:M (e.g. 2:4)")
    parser.add_argument("--damp", type=float, default=0.01, help="relative Hessian dampening (default 0.01)")
    parser.add_argument("--block-size", type=int, default=128, help="GPTQ/SparseGPT lazy block (default 128)")
    parser.add_argument("--calibration", default=None, help="calibration text file (obc, gptq, sparsegpt)")
    parser.add_argument("--samples", type=int, default=16, help="calibration sequences (default 16)")
    parser.add_argument("--seq-len", type=int, default=256, help="tokens per calibration sequence (default 256)")
    parser.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"], help="format of pruned weights")
    parser.add_argument("--out", required=True, help="directory to save the compressed model in")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.set_defaults(run=run)


def parse_sparsity(value: str | None) -> tuple[float, tuple[int, int] | None]:
    """"0.5" -> (0.5, None); "2:4" -> (0.0, (2, 4)); ValueError naming --sparsity otherwise."""
    if value is None:
        return 0.0, None
    try:
        if ":" in value:
            n, m = (int(part) for part in value.split(":"))
            return 0.0, (n, m)
        return float(value), None
    except ValueError:
        raise ValueError(f"--sparsity {value!r} is neither a fraction (0.5) nor N:M (2:4)") from None


def calibration_rows(tokenizer, text: str, samples: int, seq_len: int) -> list[list[int]]:
    """`samples` consecutive chunks of `seq_len` tokens from the start of the text (fewer if the
    text is shorter, at least one)."""
    if samples < 1 or seq_len < 2:
        raise ValueError(f"--samples={samples} must be >= 1 and --seq-len={seq_len} >= 2")
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) < seq_len:
        raise ValueError(f"--calibration has {len(ids)} tokens, fewer than one sequence of --seq-len={seq_len}")
    count = min(samples, len(ids) // seq_len)
    return [ids[i * seq_len:(i + 1) * seq_len] for i in range(count)]


def run(args: argparse.Namespace) -> int:
    import hashlib

    import torch

    from metagen.compress.calibrate import Recipe, compress_model
    from metagen.models import load
    from metagen.models.conversion_cache import save_model
    from metagen.outputs import check_writable_directory

    sparsity, n_m = parse_sparsity(args.sparsity)
    recipe = Recipe(args.method, bits=args.bits, group_size=args.group_size, clip=args.clip, sparsity=sparsity,
                    n_m=n_m, damp=args.damp, block_size=args.block_size, dtype=args.dtype)
    if recipe.needs_calibration and args.calibration is None:
        raise ValueError(f"--method {args.method} needs --calibration FILE (text to record layer inputs on)")
    if not recipe.needs_calibration and args.calibration is not None:
        raise ValueError(f"--method {args.method} is data-free: --calibration is not used by it")
    check_writable_directory(args.out)
    text = read_text(args.calibration, "--calibration") if args.calibration else None
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    model = load(args.model, "fp32")
    rows = calibration_rows(model.tokenizer, text, args.samples, args.seq_len) if text else None
    compressed, facts = compress_model(model, recipe, rows, progress=progress_bar("layers"))
    record = {"recipe": recipe.to_dict(), "source": model.source, **facts}
    if text is not None:
        record |= {"calibration": {"file": args.calibration, "sha256": hashlib.sha256(text.encode()).hexdigest(),
                                   "samples": len(rows), "seq_len": args.seq_len}}
    save_model(compressed, args.out, record)
    print(json.dumps({"out": args.out, "dtype": compressed.dtype, **record}))
    return 0
