"""`metagen generate --superposed K`: superposed decoding's options and its run.

Superposed decoding (Shen et al. 2024; `metagen.decoding.superposed`) writes K drafts from one
forward per step: the model is fed the probability-weighted sum of the drafts' last token
embeddings, and the K best of the K × K extensions by the model's log-probability, log-linearly
interpolated with an n-gram model, become the next drafts. The n-grams are counted in
`--ngram-corpus FILE` (one document per line) and, unless `--no-prompt-ngrams`, the prompt.

It reads --max-tokens, --stop, --stop-token-id and --ignore-eos; every other sampling option
and --n (K is the number of drafts) are refused, as are --beam-width, --speculative, --strategy,
--backend (a server takes no input embeddings) and the several-model decoders.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from metagen.cli.args import refuse_alone
from metagen.cli.contrastive import refuse_with
from metagen.cli.sampling import FLOAT_PARAMS, INT_PARAMS, OTHER_OPTIONS, given
from metagen.cli.structured import STRUCTURED_OPTIONS

_OPTIONS = ("lm_weight", "ngram_corpus", "ngram_weights", "prompt_ngrams")
_READ = ("max-tokens", "stop", "stop-token-id", "ignore-eos")


def add_superposed_options(parser: argparse.ArgumentParser) -> None:
    """The argument group of --superposed and the options that only apply with it."""
    group = parser.add_argument_group("superposed decoding (Shen et al. 2024: K drafts from one forward per step "
                                      "of their superposed embeddings, ranked with an n-gram model)")
    group.add_argument("--superposed", type=int, default=None, metavar="K",
                       help="write K >= 1 drafts at the cost of one forward per step")
    group.add_argument("--lm-weight", type=float, default=None, metavar="λ",
                       help="--superposed: the model's share λ in [0, 1] of λ·log p_model + (1 − λ)·log p_ngram "
                            "(default 0.46; 1: the model alone, no n-grams)")
    group.add_argument("--ngram-corpus", default=None, metavar="FILE",
                       help="--superposed: a UTF-8 text file, one document per line, whose n-grams score the drafts "
                            "(with the prompt's)")
    group.add_argument("--ngram-weights", default=None, metavar="W2,W3,...",
                       help="--superposed: weights of the n-gram orders 2, 3, ..., comma-separated "
                            "(default 0.02,0.08,0.30,0.36,0.24)")
    group.add_argument("--prompt-ngrams", action=argparse.BooleanOptionalAction, default=None,
                       help="--superposed: count the prompt's n-grams too (default: yes)")


def superposed_options(args: argparse.Namespace, params) -> dict | None:
    """The settings of --superposed (K, the checked `SuperposedConfig` built with `params`' stop
    fields, the corpus path), or None; ValueError naming the flag for options without
    --superposed, for what it cannot combine with and for values out of range. Nothing is loaded."""
    if args.superposed is None:
        refuse_alone(args, _OPTIONS, "--superposed K")
        return None
    refuse_with("superposed", args, "superposed decoding feeds input embeddings, which a remote server does not take")
    for flag, value in (("beam-width", args.beam_width), ("contrastive", args.contrastive),
                        ("dexperts", args.dexperts), ("entropy-adaptive", args.entropy_adaptive)):
        if value is not None:
            raise ValueError(f"--superposed cannot be combined with --{flag}")
    options = [name for name, _ in FLOAT_PARAMS + INT_PARAMS] + list(OTHER_OPTIONS) + list(STRUCTURED_OPTIONS)
    ignored = given(args, [name for name in options if name not in _READ])
    if ignored:
        raise ValueError(f"--superposed cannot be combined with {', '.join('--' + name for name in ignored)} "
                         "(it reads --max-tokens, --stop, --stop-token-id and --ignore-eos; K is the number of drafts)")
    if args.superposed < 1:
        raise ValueError(f"--superposed {args.superposed} is out of range: must be >= 1")
    from metagen.decoding.superposed import LM_WEIGHT, ORDER_WEIGHTS, SuperposedConfig

    lm_weight = LM_WEIGHT if args.lm_weight is None else args.lm_weight
    corpus = None if args.ngram_corpus is None else Path(args.ngram_corpus)
    if corpus is not None and lm_weight == 1.0:
        raise ValueError("--ngram-corpus has no effect with --lm-weight 1 (the model alone)")
    if corpus is not None and not corpus.is_file():
        raise ValueError(f"--ngram-corpus {args.ngram_corpus!r} does not exist or is not a file")
    weights = ORDER_WEIGHTS if args.ngram_weights is None else _weights(args.ngram_weights)
    config = SuperposedConfig(lm_weight=lm_weight, order_weights=weights,
                              prompt_ngrams=args.prompt_ngrams is not False, max_tokens=params.max_tokens,
                              stop=params.stop, stop_token_ids=params.stop_token_ids, ignore_eos=params.ignore_eos)
    return {"k": args.superposed, "config": config, "corpus": corpus}


def _weights(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(item) for item in text.split(","))
    except ValueError:
        raise ValueError(f"--ngram-weights {text!r} must be comma-separated numbers (e.g. 0.1,0.3,0.6)") from None


def run_superposed(args: argparse.Namespace, model, prompt, options: dict, load_seconds: float) -> int:
    """Decode, then print the K drafts (best score first) or one --json object."""
    from metagen.decoding.superposed import superposed_decode

    begin = time.perf_counter()
    result = superposed_decode(model, prompt, options["k"], corpus=options["corpus"], config=options["config"],
                               chat=args.chat)
    seconds = time.perf_counter() - begin
    drafts = [{"text": c.text, "tokens": c.token_ids, "score": c.score, "finish_reason": c.finish_reason}
              for c in result.completions]
    if args.json:
        print(json.dumps({"completions": drafts, "timing": {
            "load_seconds": round(load_seconds, 4), "decode_seconds": round(seconds, 4),
            "generated_tokens": result.generated_tokens, "model_calls": result.cost.model_calls},
            "cost": result.cost.to_dict()}))
        return 0
    for i, draft in enumerate(drafts):
        print(f"--- draft {i} (score {draft['score']:.4f}, {draft['finish_reason']})\n{draft['text']}")
    return 0
