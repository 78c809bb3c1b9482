"""`metagen generate PROMPT`: text from a prompt, by one of four paths.

- plain: sample (or decode greedily) `--n` completions, streamed to stdout or one --json object;
- `--beam-width W`: beam search, the best hypothesis (`--n K`: the K best); `--beam-groups G
  --diversity-penalty λ`: diverse beam search;
- `--speculative DRAFTER`: the plain path with a drafter proposing γ tokens per target step;
- `--strategy NAME`: a meta-generation strategy (metagen.strategies) with `--n` as its budget.

`--contrastive AMATEUR` (`cli/contrastive.py`) makes the plain path and beam search score tokens
by contrastive decoding, the --model as the expert; `--dexperts EXPERT,ANTI` by DExperts / proxy
tuning, the --model as the base; `--entropy-adaptive LARGE` (plain path) lets a larger model give
the tokens where the --model is uncertain (`cli/mixing.py`); `--adadec` (plain path) reranks the
top tokens by a short greedy lookahead where the --model's entropy is high (`cli/adadec.py`).
`--superposed K` writes K drafts from one forward per step by superposed decoding (`cli/superposed.py`).

Every option the chosen path would not read is refused before the model is loaded. With
`--backend URL` the plain and strategy paths run on an OpenAI-compatible server (see
`cli/backend.py`); the server's answer is printed when it is complete (no streaming).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from metagen.cli import backend, common
from metagen.cli.adadec import adadec_config, add_adadec_options
from metagen.cli.args import chat_prompt, unescape
from metagen.cli.contrastive import add_contrastive_options, contrastive_options, make_combiner
from metagen.cli.mixing import add_mixing_options, make_mixing_combiner, mixing_options
from metagen.cli.sampling import FLOAT_PARAMS, INT_PARAMS, OTHER_OPTIONS, add_sampling_options, given, sampling_params
from metagen.cli.speculative import add_speculative_options, make_drafter, speculative_options, speculative_summary
from metagen.cli.structured import CONSTRAINT_OPTIONS, STRUCTURED_OPTIONS
from metagen.cli.strategy import add_shared_option, add_strategy_options, generate_with_strategy, refuse_strategy_options
from metagen.cli.superposed import add_superposed_options, run_superposed, superposed_options
from metagen.decoding.beam_diversity import DIVERSITY_KINDS
from metagen.strategies.spec import StrategyOptions


# The options only beam search reads (besides --beam-width, which chooses it).
BEAM_OPTIONS = ("length-penalty", "beam-groups", "diversity-penalty", "diversity", "diversity-ngram")


def add_parser(commands) -> None:
    gen = commands.add_parser("generate", help="generate text from a prompt")
    gen.add_argument("prompt", help="the prompt (wrapped in the chat template unless --no-chat)")
    gen.add_argument("--chat", action=argparse.BooleanOptionalAction, default=None,
                     help="wrap a text prompt in the chat template (default: a local model's when it has one; with "
                          "--backend, the server's, on /v1/chat/completions, unless --tokenizer has no template); "
                          "--no-chat: the prompt as it is (with --backend, on /v1/completions)")
    gen.add_argument("--system", default=None, help="system message (chat only)")
    add_sampling_options(gen)
    gen.add_argument("--beam-width", type=int, default=None, help="beam search with this many beams")
    gen.add_argument("--length-penalty", type=float, default=None, help="beam search: α in logp/len^α (default 1)")
    gen.add_argument("--beam-groups", type=int, default=None, metavar="G",
                     help="diverse beam search: the beams split into G groups (dividing --beam-width) that "
                          "penalise each other's tokens (default 1)")
    gen.add_argument("--diversity-penalty", type=float, default=None, metavar="λ",
                     help="diverse beam search: λ ≥ 0 subtracted per earlier group's choice of the same token "
                          "(needs --beam-groups > 1; default 0)")
    gen.add_argument("--diversity", default=None, choices=DIVERSITY_KINDS,
                     help="diverse beam search: what a repeat is, the same token (hamming, default) or the same "
                          "last n tokens (ngram)")
    gen.add_argument("--diversity-ngram", type=int, default=None, metavar="N",
                     help="--diversity ngram: the n-gram length (default 2)")
    gen.add_argument("--strategy", default=None, help="meta-generation strategy (see `metagen eval --help`); --n is its budget")
    add_shared_option(gen, "value")
    add_shared_option(gen, "step_delimiter", " (default newline; escapes as in --stop)", type=unescape)
    add_shared_option(gen, "aggregation")
    add_shared_option(gen, "answer_field", " (with --strategy; for voting over a field of a --json-schema output)",
                      metavar="PATH")
    gen.add_argument("--json", action="store_true", help="print one JSON object instead of streaming")
    add_speculative_options(gen)
    add_contrastive_options(gen)
    add_mixing_options(gen)
    add_superposed_options(gen)
    add_adadec_options(gen)
    common.add_model_options(gen)
    backend.add_backend_options(gen)
    add_strategy_options(gen)  # a strategy option named as a sampling flag is --strategy-NAME (cli/strategy.py)
    gen.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Check the options against the path they choose, load the model, generate and print."""
    contrastive = contrastive_options(args)
    mixing = mixing_options(args)
    rerank = adadec_config(args)
    backend.check_backend_options(args)
    params = sampling_params(args)
    prompt = chat_prompt(args)
    beam = _beam_config(args, params)
    superposed = superposed_options(args, params)
    speculative = speculative_options(args)
    if speculative is not None and args.beam_width is not None:
        raise ValueError("--speculative cannot be combined with --beam-width")
    if args.strategy is not None:
        return generate_with_strategy(args, params, speculative)
    refuse_strategy_options(args)
    if args.answer_field is not None:
        raise ValueError("--answer-field applies to --strategy (it says where a strategy reads each answer)")
    if args.logprobs is not None and not args.json:
        raise ValueError("--logprobs shows in the --json output only: add --json")
    if any(getattr(args, name) != getattr(StrategyOptions, name) for name in ("value", "step_delimiter", "aggregation")):
        raise ValueError("--value, --step-delimiter and --aggregation apply to --strategy (tree search, "
                         "controlled decoding)")
    if args.backend is not None:
        return _sample_remote(args, prompt, params)
    start = time.perf_counter()
    model = common.load_model(args)
    drafter = make_drafter(speculative, model) if speculative is not None else None
    combiner = make_combiner(contrastive, model, args) if contrastive is not None else None
    if mixing is not None:
        combiner = make_mixing_combiner(mixing, model, args)
    load_seconds = time.perf_counter() - start
    if superposed is not None:
        return run_superposed(args, model, prompt, superposed, load_seconds)
    if beam is not None:
        return _beam_search(args, model, prompt, beam, load_seconds, combiner)
    return _sample(args, model, prompt, params, speculative, drafter, load_seconds, combiner, rerank)


def _beam_config(args: argparse.Namespace, params):
    """The `BeamSearchConfig` of --beam-width, or None; beam search reads --max-tokens, --stop,
    --stop-token-id, --ignore-eos and the constraint options (--json-schema, --regex, ...), so
    any other sampling option given (--token-healing included) is refused."""
    from metagen.decoding import BeamSearchConfig

    beam_only = [name for name in BEAM_OPTIONS if getattr(args, name.replace("-", "_")) is not None]
    if beam_only and args.beam_width is None:
        verb = "applies" if len(beam_only) == 1 else "apply"
        raise ValueError(f"{', '.join('--' + name for name in beam_only)} {verb} to beam search only: "
                         "add --beam-width N")
    if args.beam_width is None:
        return None
    read = ("max-tokens", "n", "stop", "stop-token-id", "ignore-eos", "max-whitespace", *CONSTRAINT_OPTIONS)
    options = [name for name, _ in FLOAT_PARAMS + INT_PARAMS] + list(OTHER_OPTIONS) + list(STRUCTURED_OPTIONS)
    options = [name for name in options if name not in read]
    ignored = given(args, options)
    if ignored:
        raise ValueError(f"--beam-width cannot be combined with {', '.join('--' + name for name in ignored)}")
    diverse = {field: getattr(args, field) for field in ("diversity_penalty", "diversity", "diversity_ngram")
               if getattr(args, field) is not None}
    if args.n is not None and args.n > args.beam_width:
        raise ValueError(f"--n {args.n} is out of range with --beam-width {args.beam_width}: beam search returns "
                         "at most --beam-width hypotheses")
    return BeamSearchConfig(
        width=args.beam_width, length_penalty=1.0 if args.length_penalty is None else args.length_penalty,
        max_tokens=params.max_tokens, n_best=params.n, stop=params.stop, stop_token_ids=params.stop_token_ids,
        ignore_eos=params.ignore_eos, structured_outputs=params.structured_outputs,
        groups=1 if args.beam_groups is None else args.beam_groups, **diverse,
    )


def _beam_search(args: argparse.Namespace, model, prompt, config, load_seconds: float, combiner=None) -> int:
    from metagen.decoding import beam_search

    begin = time.perf_counter()
    result = beam_search(model, prompt, config, chat=args.chat, combiner=combiner)
    seconds = time.perf_counter() - begin
    hypotheses = [{"text": h.text, "tokens": h.token_ids, "logprob": h.cumulative_logprob, "score": h.score,
                   "finish_reason": h.finish_reason or "length", "complete": h.complete} for h in result.completions]
    if args.json:
        payload = dict(hypotheses[0]) if len(hypotheses) == 1 else {"completions": hypotheses}
        payload["timing"] = {"load_seconds": load_seconds, "search_seconds": seconds,
                             "model_calls": result.cost.model_calls}
        payload["cost"] = result.cost.to_dict()
        print(json.dumps(payload))
    elif len(hypotheses) == 1:
        print(hypotheses[0]["text"])
    else:
        for i, hypothesis in enumerate(hypotheses):
            print(f"--- hypothesis {i} (score {hypothesis['score']:.4f}, {hypothesis['finish_reason']})\n"
                  f"{hypothesis['text']}")
    return _exit_code(result)


def _sample(args: argparse.Namespace, model, prompt, params, speculative, drafter, load_seconds: float,
            combiner=None, rerank=None) -> int:
    """Plain or speculative sampling: one completion streams as it is decoded, n > 1 print at the end."""
    from metagen.decoding import GenerationResult, stream

    result = GenerationResult([], [])
    if drafter is None:
        events = stream(model, prompt, params, chat=args.chat, result=result, combiner=combiner, rerank=rerank)
    else:
        from metagen.speculative import speculative_stream

        events = speculative_stream(model, drafter, prompt, params, speculative["config"], chat=args.chat, result=result)
    if args.json:
        for _ in events:
            pass
        payload = _json_payload(result, load_seconds)
        if rerank is not None:  # AdaDec: the row-steps that paused for a lookahead
            payload["lookahead_steps"] = result.lookahead_steps
        if drafter is not None:
            payload["speculative"] = speculative_summary(speculative, result.cost)
        print(json.dumps(payload))
        return _exit_code(result)
    for event in events:
        if params.n > 1:
            continue
        sys.stdout.write(event.text)
        sys.stdout.flush()
    if params.n > 1:
        for i, completion in enumerate(result.completions):
            print(f"--- completion {i} ({completion.finish_reason})\n{completion.text}")
    else:
        sys.stdout.write("\n")
    return _exit_code(result)


def _sample_remote(args: argparse.Namespace, prompt, params) -> int:
    """Plain sampling on the --backend server: its completions, printed when they are done."""
    start = time.perf_counter()
    generator = backend.make_generator(args, chat=args.chat)
    load_seconds = time.perf_counter() - start
    try:
        result = generator.generate(prompt, params)
    finally:
        generator.close()
    if args.json:
        print(json.dumps(_json_payload(result, load_seconds)))
    elif params.n > 1:
        for i, completion in enumerate(result.completions):
            print(f"--- completion {i} ({completion.finish_reason})\n{completion.text}")
    else:
        print(result.completions[0].text)
    return _exit_code(result)


def _exit_code(result) -> int:
    """0, or 3 with a line on stderr when a constrained output was cut (max tokens, context) before
    its constraint accepted it: such text is not valid output and must not pass for it."""
    outputs = result.completions
    cut = [i for i, output in enumerate(outputs) if output.complete is False]
    if not cut:
        return 0
    which = "the output" if len(outputs) == 1 else f"completions {', '.join(map(str, cut))}"
    sys.stdout.flush()
    print(f"metagen: warning: {which} ended (finish_reason {outputs[cut[0]].finish_reason or 'length'!r}) before "
          "the constraint accepted it: not valid output (raise --max-tokens)", file=sys.stderr)
    return 3


def _json_payload(result, load_seconds: float) -> dict:
    """One completion's fields (or {"completions": [...]}), the timing and the `Cost`."""
    completions = [
        {
            "text": c.text,
            "tokens": c.token_ids,
            "logprobs": c.logprobs,
            "top_logprobs": None if c.top_logprobs is None else [{str(k): v for k, v in d.items()} for d in c.top_logprobs],
            "finish_reason": c.finish_reason,
            "stop_reason": c.stop_reason,
            "complete": c.complete,
        }
        for c in result.completions
    ]
    payload = dict(completions[0]) if len(completions) == 1 else {"completions": completions}
    payload["timing"] = {
        "load_seconds": round(load_seconds, 4),
        "prefill_seconds": round(result.prefill_seconds, 4),
        "decode_seconds": round(result.decode_seconds, 4),
        "prompt_tokens": result.prompt_tokens,
        "generated_tokens": result.generated_tokens,
        "tokens_per_second": round(result.tokens_per_second, 2),
    }
    payload["cost"] = result.cost.to_dict()
    if result.model_tokens:  # entropy-adaptive decoding: the tokens each model gave
        payload["model_tokens"] = result.model_tokens
    return payload
