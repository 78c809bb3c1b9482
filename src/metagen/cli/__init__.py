"""Command line: `metagen generate`, `metagen eval`, `metagen task`, `metagen train-exit-adapter`,
`metagen train-stop-head`, `metagen train-medusa`, `metagen compress`, `metagen perplexity`,
`metagen theory`, `metagen info`, `metagen cache`.

One module per command (`train_heads` holds the two head-training commands), each with
`add_parser(commands)` (which sets the command's `run` as the parser default) and a run
function `(args) -> exit code`; `main` parses, dispatches to `args.run` and turns
every failure into one line on stderr. Importing this package and building the parser import no
torch (tests/test_cli_imports.py: the strategy table is light); commands import
what they need when they run.
"""

from __future__ import annotations

import argparse
import os
import sys

from metagen.cli import eval as evaluation
from metagen.cli import cache, compress, generate, info, perplexity, serve, task, theory, train_adapter, train_heads
from metagen.cli.args import check_threads

_COMMANDS = (generate, evaluation, serve, task, train_adapter, train_heads, compress, perplexity, theory, info, cache)  # in the order `metagen --help` lists them


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="metagen", description="Inference-time algorithms for language models.")
    commands = parser.add_subparsers(dest="command", required=True)
    for command in _COMMANDS:
        command.add_parser(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Exit codes: 0 done, 2 bad input (ValueError, FileNotFoundError, NotImplementedError, or an
    argparse error), 3 a constrained output cut before its constraint accepted it (`generate`),
    130 interrupted, 1 anything else (METAGEN_TRACEBACK=1 shows the traceback)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        check_threads(getattr(args, "threads", None))
        return args.run(args)
    except (ValueError, FileNotFoundError, NotImplementedError) as error:
        print(f"metagen: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("metagen: interrupted", file=sys.stderr)
        return 130
    except Exception as error:  # noqa: BLE001 - the last line of defence: one line, not a traceback
        if os.environ.get("METAGEN_TRACEBACK"):
            raise
        print(f"metagen: error: {type(error).__name__}: {error} (set METAGEN_TRACEBACK=1 to see where)",
              file=sys.stderr)
        return 1
