"""`metagen perplexity --data FILE`: sliding-window, token-weighted perplexity of a model on a text
file (`metagen.eval.perplexity`); a model saved by `metagen compress` loads with --model DIR."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from metagen.cli import common


def add_parser(commands) -> None:
    parser = commands.add_parser("perplexity", help="perplexity of a model on a text file (sliding windows)")
    common.add_model_options(parser)
    parser.add_argument("--data", required=True, help="UTF-8 text file to score")
    parser.add_argument("--window", type=int, default=512, help="tokens per window (default 512)")
    parser.add_argument("--stride", type=int, default=256, help="tokens between window starts (default 256)")
    parser.add_argument("--max-tokens", type=int, default=None, help="score only the first N tokens of the text")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(run=run)


def read_text(path: str, option: str) -> str:
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"{option} {path!r} is not a file")
    text = file.read_text(encoding="utf-8")
    if not text.strip():
        raise ValueError(f"{option} {path!r} is empty")
    return text


def progress_bar(what: str):
    """A `progress(done, total)` drawing a bar with the time left on stderr (when a terminal)."""
    started = time.perf_counter()

    def show(done: int, total: int) -> None:
        if not sys.stderr.isatty():
            return
        elapsed = time.perf_counter() - started
        filled = int(30 * done / total)
        remaining = elapsed / done * (total - done) if done else 0.0
        sys.stderr.write(f"\r[{'#' * filled}{'.' * (30 - filled)}] {done}/{total} {what}, {elapsed:.0f} s elapsed, "
                         f"~{remaining:.0f} s left ")
        if done == total:
            sys.stderr.write("\n")
        sys.stderr.flush()

    return show


def run(args: argparse.Namespace) -> int:
    from metagen.eval.perplexity import perplexity, windows

    text = read_text(args.data, "--data")
    if args.max_tokens is not None and args.max_tokens < 2:
        raise ValueError(f"--max-tokens={args.max_tokens} is out of range: must be >= 2")
    windows(2, args.window, args.stride)  # checks --window / --stride before the model loads
    model = common.load_model(args)
    ids = model.tokenizer.encode(text, add_special_tokens=False)[: args.max_tokens]
    result = perplexity(model, ids, window=args.window, stride=args.stride, progress=progress_bar("windows"))
    facts = {"perplexity": result.perplexity, "tokens": result.tokens, "nll": result.nll, "windows": result.windows,
             "window": result.window, "stride": result.stride, "model": model.source or model.name, "data": args.data}
    if args.json:
        print(json.dumps(facts))
    else:
        print(f"perplexity {result.perplexity:.3f} over {result.tokens} tokens ({result.windows} windows of "
              f"{result.window}, stride {result.stride})")
    return 0
