"""`metagen generate --contrastive AMATEUR`: contrastive decoding's options and the combiner they make.

Contrastive decoding (Li et al. 2023) scores each next token by log p_exp − log p_ama over the
tokens the expert finds plausible (p_exp ≥ α · max p_exp); with --beta β, by O'Brien & Lewis
2023's (1 + β)·s_exp − β·s_ama on the logits s instead. The expert is the --model, the amateur
is named by --contrastive:

- `early-exit:L`: the expert's own first L layers with its final norm and LM head (no second
  set of weights; the expert must be a native model, `DepthTruncatable`);
- anything --model takes (a GGUF file, an HF directory, a hub name OWNER/NAME[:QUANT], or
  `embedded` for the embedded SmolLM2-135M), loaded at --dtype with --kv-dtype caches. It must
  share the expert's tokenizer.

Both models run on every row, so a step costs the two forwards. The plain path and beam search
take it; --backend (a server has no second model here), --speculative and --strategy are refused.
`metagen eval` takes the same options for every local model of its sweep (`cli/decoders.py`).
"""

from __future__ import annotations

import argparse

from metagen.cli.args import refuse_alone

_OPTIONS = ("alpha", "amateur_temperature", "beta")
# The options of `generate` that choose a path a second model does not run on; `eval` refuses none
# (its strategies call the decoding generator), hence `excludes`.
GENERATE_EXCLUDES = ("speculative", "strategy")


def add_contrastive_options(parser: argparse.ArgumentParser) -> None:
    """The argument group of --contrastive and the options that only apply with it."""
    group = parser.add_argument_group("contrastive decoding (Li et al. 2023: log p_expert − log p_amateur over the "
                                      "tokens the expert finds plausible)")
    group.add_argument("--contrastive", default=None, metavar="AMATEUR",
                       help="the amateur model: early-exit:L (the --model's own first L layers) or a model as "
                            "--model takes it ('embedded' for the embedded SmolLM2-135M); same tokenizer as --model")
    group.add_argument("--alpha", type=float, default=None,
                       help="--contrastive: plausibility threshold in [0, 1], tokens below α · the expert's top "
                            "probability are never chosen (default 0.1)")
    group.add_argument("--amateur-temperature", type=float, default=None, metavar="T",
                       help="--contrastive: temperature > 0 of the amateur's softmax (default 1)")
    group.add_argument("--beta", type=float, default=None, metavar="B",
                       help="--contrastive: score (1 + B)·s_expert − B·s_amateur on the logits s (O'Brien & Lewis "
                            "2023), B a finite number >= 0; without it, log p_expert − log p_amateur")


def contrastive_options(args: argparse.Namespace, excludes=GENERATE_EXCLUDES) -> dict | None:
    """The contrastive settings of `generate` or `eval` (`contrastive_settings`), or None; ValueError
    naming the flag for what it cannot combine with (--backend, and the options named in `excludes`).
    Nothing is loaded here."""
    settings = contrastive_settings(args)
    if settings is not None:
        refuse_with("contrastive", args, "contrastive decoding runs a second (amateur) model next to the local "
                    "one, which a remote server does not have here", excludes)
    return settings


def contrastive_settings(args: argparse.Namespace) -> dict | None:
    """The contrastive settings (checked: α, T, β, the AMATEUR spelling), or None without
    --contrastive; ValueError naming the flag for its options given without it. What the command
    cannot combine it with is its own to refuse (`generate`: `refuse_with`; `serve`: --backend
    and the prefix cache)."""
    if args.contrastive is None:
        refuse_alone(args, _OPTIONS, "--contrastive AMATEUR")
        return None
    from metagen.decoding.combine import ContrastiveConfig

    alpha = 0.1 if args.alpha is None else args.alpha
    temperature = 1.0 if args.amateur_temperature is None else args.amateur_temperature
    ContrastiveConfig(amateur=None, alpha=alpha, amateur_temperature=temperature, beta=args.beta)  # the range checks
    spec = args.contrastive
    refuse_main("contrastive", spec, "the amateur's scores would cancel the expert's")
    return {"amateur": spec, "layers": early_exit_layers("contrastive", spec), "alpha": alpha,
            "amateur_temperature": temperature, "beta": args.beta}


def early_exit_layers(flag: str, spec: str) -> int | None:
    """L of an `early-exit:L` model spelling (ValueError naming --`flag` when L is not an int >= 1),
    None for a model --model takes (`decoding.companion_models`)."""
    from metagen.decoding.companion_models import early_exit_layers as layers

    return layers(spec, f"--{flag}")


def is_own_model(flag: str, spec: str) -> bool:
    """True for a spelling that is the --model itself or cut from it (`main`, `early-exit:L`):
    nothing to find on disk or to load once per sweep."""
    from metagen.decoding.companion_models import MAIN

    return spec == MAIN or early_exit_layers(flag, spec) is not None


def refuse_main(flag: str, spec: str, why: str) -> None:
    """ValueError when --`flag` names `main` (the --model itself), which only --dexperts takes."""
    from metagen.decoding.companion_models import MAIN

    if spec == MAIN:
        raise ValueError(f"--{flag} {MAIN}: needs another model than --model ({why}); "
                         f"'{MAIN}' names the --model only in --dexperts EXPERT,ANTI")


def refuse_with(flag: str, args: argparse.Namespace, why_backend: str, excludes=GENERATE_EXCLUDES) -> None:
    """ValueError naming --`flag` when --backend, or an option of `excludes` (attribute names), is
    given too."""
    if args.backend is not None:
        raise ValueError(f"--{flag} cannot be combined with --backend: {why_backend}")
    for other in excludes:
        if getattr(args, other) is not None:
            raise ValueError(f"--{flag} cannot be combined with --{other.replace('_', '-')}")


def load_companion(flag: str, spec: str, model, args: argparse.Namespace):
    """The model `spec` names next to `model` (`decoding.companion_models.load_companion`): its
    first L layers for `early-exit:L` (ValueError naming --`flag` when it has no such form), else
    a model loaded like --model at --dtype with --kv-dtype caches and --activations ('embedded': the
    embedded model)."""
    from metagen.decoding.companion_models import load_companion as load

    return load(spec, model, dtype=args.dtype, kv_dtype=args.kv_dtype, activations=args.activations,
                where=f"--{flag}")


def make_combiner(options: dict, model, args: argparse.Namespace, load=None):
    """The `ContrastiveConfig` of `contrastive_options`, `model` the expert (the amateur:
    `load(flag, spec, model, args)`, `load_companion` by default)."""
    from metagen.decoding.combine import ContrastiveConfig

    amateur = (load or load_companion)("contrastive", options["amateur"], model, args)
    return ContrastiveConfig(amateur=amateur, alpha=options["alpha"],
                             amateur_temperature=options["amateur_temperature"], beta=options["beta"])
