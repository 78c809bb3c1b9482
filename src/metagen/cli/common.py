"""What every model-loading command shares: the --model / --dtype / --kv-dtype / --activations / --threads
options and the load.

`load_model` is the one place a command loads weights; commands call it as `common.load_model`, so
a test replaces the load for all of them by patching this module.
"""

from __future__ import annotations

import argparse
from pathlib import Path

EMBEDDED = "embedded"  # how --model (and a companion model's option) names the embedded model


def add_model_options(parser: argparse.ArgumentParser, repeat: bool = False) -> None:
    """--model, --dtype, --kv-dtype, --activations and --threads (checked in `metagen.cli.main` before
    any command runs); `repeat`: --model may be given several times (a list, `metagen eval`'s sweep
    of models)."""
    if repeat:
        parser.add_argument("--model", action="append", default=None, metavar="PATH",
                            help="GGUF file, HF directory or Hugging Face Hub name OWNER/NAME[:QUANT]; repeat it "
                                 "to evaluate several models in one sweep ('embedded' names the embedded "
                                 "SmolLM2-135M; default: it alone, unless --backend is given)")
    else:
        parser.add_argument("--model", default=None,
                            help="GGUF file, HF directory or Hugging Face Hub name OWNER/NAME[:QUANT], e.g. "
                                 "Qwen/Qwen2.5-0.5B-Instruct-GGUF:Q4_K_M (default: embedded SmolLM2-135M)")
    parser.add_argument("--dtype", default=None, choices=["auto", "fp32", "bf16", "int8", "int4"],
                        help="weight format (default auto: each tensor at least at the precision the file stores)")
    parser.add_argument("--kv-dtype", default=None, choices=["fp32", "bf16", "int8"],  # models.cache.KV_DTYPES
                        help="KV cache format (default fp32; bf16 halves the bytes per cached token, int8 with a "
                             "scale per head stores about a quarter)")
    parser.add_argument("--activations", default=None, choices=["int16", "int8"],  # models.kernel_backend.ACTIVATIONS
                        help="what metagen's int4/int8 kernels quantize activations to (default int16; int8, as "
                             "llama.cpp, halves the multiply-adds at a measurable cost in faithfulness)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")


def check_model_source(flag: str, path: str) -> None:
    """FileNotFoundError naming --`flag` unless `path` is 'embedded', an existing file or
    directory, or a hub name OWNER/NAME[:QUANT] (nothing is loaded or downloaded)."""
    from metagen.models.hub import parse_hub_name

    if path != EMBEDDED and not Path(path).exists() and parse_hub_name(path) is None:
        raise FileNotFoundError(f"--{flag} {path}: no such file or directory (nor a hub name OWNER/NAME[:QUANT])")


def local_names(path: str) -> tuple[str, str]:
    """(short, long) names of a local model as --model takes it: the file's stem or directory's
    name, and that after its parent directory's name; of a hub name, NAME[:QUANT] and the whole
    name; 'embedded': the embedded model's file."""
    from metagen.models import embedded_model_path
    from metagen.models.hub import parse_hub_name

    if path != EMBEDDED and not Path(path).exists() and parse_hub_name(path) is not None:
        return path.split("/", 1)[1], path
    source = embedded_model_path() if path == EMBEDDED else Path(path).resolve()
    short = source.stem if source.is_file() else source.name
    return short, f"{source.parent.name}/{short}"


def load_model(args: argparse.Namespace):
    """The model of --model at --dtype with --kv-dtype caches and --activations, torch using --threads
    threads (torch imported here)."""
    import torch

    from metagen.models import load

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    return load(args.model, args.dtype, kv_dtype=args.kv_dtype, activations=args.activations)
