"""The sampling options of `metagen generate` and the `SamplingParams` they make.

Every field of `SamplingParams` a user can set has a flag of the same name (`--top-p` -> `top_p`);
a flag left out keeps the field's default. `--temperature 0` decodes greedily, so a flag only
sampling reads is refused with it (penalties and logit bias still apply under greedy decoding, and
momentum decoding, `--momentum-ngram`, needs it).
"""

from __future__ import annotations

import argparse

from metagen.cli.args import parse_logit_bias, unescape
from metagen.cli.structured import add_structured_options, structured_fields

FLOAT_PARAMS = (
    ("temperature", "0 = greedy"),
    ("top-p", "nucleus mass in (0, 1]"),
    ("min-p", "relative probability floor"),
    ("typical-p", "locally typical mass"),
    ("epsilon-cutoff", "absolute probability floor"),
    ("eta-cutoff", "eta sampling"),
    ("repetition-penalty", "CTRL penalty on prompt+generated tokens"),
    ("frequency-penalty", "OpenAI frequency penalty"),
    ("presence-penalty", "OpenAI presence penalty"),
    ("mirostat-tau", "Mirostat target surprise (bits)"),
    ("mirostat-eta", "Mirostat learning rate"),
    ("momentum-resistance", "momentum decoding: confidence lost per unit of loop depth (default 0.2)"),
)
INT_PARAMS = (
    ("top-k", "tokens kept (0 = off)"),
    ("no-repeat-ngram-size", "ban repeated n-grams"),
    ("mirostat-mode", "Mirostat version with --mirostat-tau: 2 (default) or 1 (Zipf-estimated top-k)"),
    ("momentum-ngram", "momentum decoding, with --temperature 0: longest repeated n-gram a loop's depth "
                       "counts (the authors use 5; 0 = off)"),
    ("momentum-candidates", "momentum decoding: most likely tokens ranked (default 5)"),
    ("max-tokens", "new tokens at most (default 256)"),
    ("n", "samples (with --beam-width: hypotheses returned, at most the width)"),
    ("logprobs", "top log-probabilities per token in --json"),
    ("seed", "random seed"),
)
# Every sampling option beyond the numbers, as typed (see `attribute`).
OTHER_OPTIONS = ("stop", "stop-token-id", "ignore-eos", "logit-bias")

_DESTINATIONS = {"stop-token-id": "stop_token_ids"}  # options whose attribute is not the plain name
# What only sampling reads: greedy decoding ignores these (penalties and logit bias still apply).
SAMPLING_ONLY = ("temperature", "top-p", "top-k", "min-p", "typical-p", "epsilon-cutoff", "eta-cutoff",
                 "mirostat-tau", "mirostat-eta", "mirostat-mode", "seed")


def attribute(option: str) -> str:
    """The namespace attribute of an option typed without its dashes: "top-p" -> "top_p"."""
    return _DESTINATIONS.get(option, option.replace("-", "_"))


def given(args: argparse.Namespace, options) -> list[str]:
    """Those of `options` (names as typed, without dashes) that the command line set."""
    return [name for name in options if getattr(args, attribute(name)) is not None]


def add_sampling_options(parser: argparse.ArgumentParser) -> None:
    """The numeric sampling flags, then --stop, --stop-token-id, --ignore-eos, --logit-bias and the
    structured-output flags (`cli/structured.py`)."""
    for name, text in FLOAT_PARAMS:
        parser.add_argument(f"--{name}", type=float, default=None, help=text)
    for name, text in INT_PARAMS:
        parser.add_argument(f"--{name}", type=int, default=None, help=text)
    parser.add_argument("--stop", action="append", default=None, type=unescape,
                        help="stop string (repeatable); \\n, \\t, \\xHH, \\uHHHH... are interpreted")
    parser.add_argument("--stop-token-id", action="append", type=int, default=None, dest="stop_token_ids",
                        help="stop at this token id, besides EOS (repeatable)")
    parser.add_argument("--ignore-eos", action="store_true", default=None,
                        help="keep generating past the end-of-sequence token, up to --max-tokens")
    parser.add_argument("--logit-bias", action="append", default=None, metavar="ID=BIAS", help="repeatable")
    add_structured_options(parser)


def sampling_params(args: argparse.Namespace):
    """`SamplingParams` of the flags given; raises ValueError for a flag --temperature 0 would not read."""
    from metagen.sampling import SamplingParams

    fields = {}
    for name, _ in FLOAT_PARAMS + INT_PARAMS:
        value = getattr(args, attribute(name))
        if value is not None:
            fields[attribute(name)] = value
    if args.stop:
        fields["stop"] = tuple(args.stop)
    if args.stop_token_ids:
        fields["stop_token_ids"] = tuple(args.stop_token_ids)
    if args.ignore_eos:
        fields["ignore_eos"] = True
    if args.logit_bias:
        fields["logit_bias"] = parse_logit_bias(args.logit_bias)
    if args.temperature == 0:
        unread = [name for name in given(args, SAMPLING_ONLY) if name != "temperature"]
        if unread:
            raise ValueError(f"--temperature 0 decodes greedily: {', '.join('--' + n for n in unread)} would have no effect")
    fields.update(structured_fields(args))
    if "structured_outputs" in fields and fields.get("ignore_eos"):
        raise ValueError(f"--ignore-eos cannot be combined with {fields['structured_outputs'].field}: the constraint "
                         "ends the output where it accepts, and only EOS can follow")
    return SamplingParams(**fields)
