"""Command line: `metagen generate`, `metagen eval`, `metagen task`, `metagen train-exit-adapter`, `metagen theory`,
`metagen info`."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from metagen.cli_args import check_threads, parse_logit_bias, unescape

_FLOAT_PARAMS = (
    ("temperature", "0 = greedy"),
    ("top-p", "nucleus mass in (0, 1]"),
    ("min-p", "relative probability floor"),
    ("typical-p", "locally typical mass"),
    ("epsilon-cutoff", "absolute probability floor"),
    ("eta-cutoff", "eta sampling"),
    ("repetition-penalty", "CTRL penalty on prompt+generated tokens"),
    ("frequency-penalty", "OpenAI frequency penalty"),
    ("presence-penalty", "OpenAI presence penalty"),
    ("mirostat-tau", "Mirostat 2.0 target surprise (bits)"),
    ("mirostat-eta", "Mirostat learning rate"),
)
_INT_PARAMS = (
    ("top-k", "tokens kept (0 = off)"),
    ("no-repeat-ngram-size", "ban repeated n-grams"),
    ("max-tokens", "new tokens at most (default 256)"),
    ("n", "samples"),
    ("logprobs", "top log-probabilities per token in --json"),
    ("seed", "random seed"),
)

_DESTINATIONS = {"stop-token-id": "stop_token_ids"}  # options whose attribute is not the plain name
# What only sampling reads: greedy decoding ignores these (penalties and logit bias still apply).
_SAMPLING_ONLY = ("temperature", "top-p", "top-k", "min-p", "typical-p", "epsilon-cutoff", "eta-cutoff",
                  "mirostat-tau", "mirostat-eta", "seed")


def use_spinning_threads() -> None:
    """Keep OpenMP worker threads spinning between kernels (unless the user chose otherwise).

    A decode step is hundreds of small kernels; waking sleeping workers for each costs ~20% of
    batch-1 decode time on 2 cores. Takes effect only before torch is imported.
    """
    if "torch" not in sys.modules:
        os.environ.setdefault("OMP_WAIT_POLICY", "ACTIVE")


def _add_model_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None, help="GGUF file or HF directory (default: embedded SmolLM2-135M)")
    parser.add_argument("--dtype", default=None, choices=["auto", "fp32", "bf16", "int8", "int4"],
                        help="weight format (default auto: each tensor at least at the precision the file stores)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="metagen", description="Inference-time algorithms for language models.")
    commands = parser.add_subparsers(dest="command", required=True)

    gen = commands.add_parser("generate", help="generate text from a prompt")
    gen.add_argument("prompt", help="the prompt (wrapped in the chat template unless --no-chat)")
    gen.add_argument("--chat", action=argparse.BooleanOptionalAction, default=None, help="use the chat template")
    gen.add_argument("--system", default=None, help="system message (chat only)")
    for name, text in _FLOAT_PARAMS:
        gen.add_argument(f"--{name}", type=float, default=None, help=text)
    for name, text in _INT_PARAMS:
        gen.add_argument(f"--{name}", type=int, default=None, help=text)
    gen.add_argument("--stop", action="append", default=None, type=unescape,
                     help="stop string (repeatable); \\n, \\t, \\xHH, \\uHHHH... are interpreted")
    gen.add_argument("--stop-token-id", action="append", type=int, default=None, dest="stop_token_ids")
    gen.add_argument("--ignore-eos", action="store_true", default=None)
    gen.add_argument("--logit-bias", action="append", default=None, metavar="ID=BIAS", help="repeatable")
    gen.add_argument("--beam-width", type=int, default=None, help="beam search with this many beams")
    gen.add_argument("--length-penalty", type=float, default=None, help="beam search: α in logp/len^α (default 1)")
    gen.add_argument("--strategy", default=None, help="meta-generation strategy (see `metagen eval --help`); --n is its budget")
    gen.add_argument("--value", default=None,
                     help="value guiding tree search / controlled decoding: steps | judge | a value-head file")
    gen.add_argument("--step-delimiter", default="\n", type=unescape,
                     help="text that ends a reasoning step (default newline; escapes as in --stop)")
    gen.add_argument("--aggregation", default="best", choices=("best", "majority", "weighted"),
                     help="tree search: pick the leaf of best value, or vote over leaves' answers")
    gen.add_argument("--json", action="store_true", help="print one JSON object instead of streaming")
    spec = gen.add_argument_group("speculative decoding (same output distribution, fewer target steps)")
    spec.add_argument("--speculative", default=None, metavar="DRAFTER",
                      help="ngram | early-exit | quantized | model:PATH")
    spec.add_argument("--num-draft-tokens", type=int, default=None, help="draft tokens per step, γ (default 4)")
    spec.add_argument("--verify", choices=["token", "block"], default=None, help="verification rule (default token)")
    spec.add_argument("--adaptive-draft", action="store_true", default=None,
                      help="grow γ after fully accepted drafts, shrink it after rejections")
    spec.add_argument("--exit-layer", type=int, default=None, help="early-exit: layers the draft runs")
    spec.add_argument("--exit-adapter", default=None, help="early-exit: trained adapter file")
    spec.add_argument("--draft-dtype", default=None, choices=["fp32", "bf16", "int8", "int4"],
                      help="quantized / model:PATH drafter weights (default int4)")
    spec.add_argument("--draft-confidence", type=float, default=None,
                      help="model drafters: stop a draft after a token below this probability")
    _add_model_options(gen)

    evaluation = commands.add_parser("eval", help="accuracy vs compute of strategies on a task",
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     description=_strategy_help())
    source = evaluation.add_mutually_exclusive_group(required=True)
    source.add_argument("--data", default=None, help="JSONL with question (or prompt) and answer per line")
    source.add_argument("--task", choices=["arithmetic"], default=None, help="built-in task")
    evaluation.add_argument("--count", type=int, default=100, help="--task: number of problems (default 100)")
    evaluation.add_argument("--task-seed", type=int, default=0, help="--task: problem seed (default 0)")
    evaluation.add_argument("--max-number", type=int, default=9, help="--task arithmetic: largest operand")
    evaluation.add_argument("--limit", type=int, default=None, help="first N problems only")
    evaluation.add_argument("--strategy", required=True, help="comma-separated strategy names")
    evaluation.add_argument("--n", default="1,2,4,8,16", help="comma-separated budgets (default 1,2,4,8,16)")
    evaluation.add_argument("--out", default=None, help="directory for results.jsonl (resumable), summary and plots")
    evaluation.add_argument("--temperature", type=float, default=0.8, help="sampling temperature (default 0.8)")
    evaluation.add_argument("--top-p", type=float, default=None)
    evaluation.add_argument("--top-k", type=int, default=None)
    evaluation.add_argument("--min-p", type=float, default=None)
    evaluation.add_argument("--max-tokens", type=int, default=256, help="new tokens per sample (default 256)")
    evaluation.add_argument("--seed", type=int, default=0, help="seeds samples and subsets (default 0)")
    evaluation.add_argument("--subsets", type=int, default=16, help="random n-subsets of a pool per problem")
    evaluation.add_argument("--pattern", default=None, help="answer regex (default: boxed / 'answer is' / last number)")
    evaluation.add_argument("--no-math", action="store_true", help="compare answers as strings, not with math-verify")
    evaluation.add_argument("--prompt-suffix", default="", help="text appended to every question")
    evaluation.add_argument("--value", default=None,
                            help="value for tree search / controlled decoding: steps | judge | a value-head file")
    evaluation.add_argument("--step-delimiter", default="\n", type=unescape,
                            help="text that ends a reasoning step (default newline; \\n, \\t... interpreted)")
    evaluation.add_argument("--aggregation", default="best", choices=("best", "majority", "weighted"),
                            help="tree search: pick the leaf of best value, or vote over leaves' answers")
    evaluation.add_argument("--json", action="store_true", help='print {"results": [...]} on stdout')
    _add_model_options(evaluation)

    task = commands.add_parser("task", help="write a built-in task as JSONL")
    task.add_argument("name", choices=["arithmetic"])
    task.add_argument("--count", type=int, default=100)
    task.add_argument("--seed", type=int, default=0)
    task.add_argument("--max-number", type=int, default=9)

    adapter = commands.add_parser("train-exit-adapter", help="train an early-exit drafting adapter")
    _add_model_options(adapter)
    adapter.add_argument("--exit-layer", type=int, required=True, help="layers the draft runs")
    adapter.add_argument("--out", required=True, help="adapter file to write (safetensors)")
    adapter.add_argument("--tokens-per-prompt", type=int, default=256, help="sampled tokens per built-in prompt")
    adapter.add_argument("--steps", type=int, default=300, help="Adam steps (default 300)")
    adapter.add_argument("--rank", type=int, default=None, help="low-rank adapter (default: full rank)")
    adapter.add_argument("--seed", type=int, default=0)

    theory = commands.add_parser("theory", help="figures of the alignment theory (metagen.theory)")
    bon = theory.add_subparsers(dest="figure", required=True).add_parser(
        "bon", help="best-of-n win rate and reward vs KL, and the tilt path on the simplex (three PNGs)")
    bon.add_argument("--n-max", type=int, default=64, help="largest n (default 64)")
    bon.add_argument("--out", required=True, help="directory for the PNGs")
    bon.add_argument("--seed", type=int, default=0, help="seed of the reward–KL figure's rewards (default 0)")
    bon.add_argument("--json", action="store_true", help="print the numbers behind the figures")

    info = commands.add_parser("info", help="describe a model")
    _add_model_options(info)
    info.add_argument("--json", action="store_true")
    return parser


def _strategy_help() -> str:
    from metagen.strategies.registry import STRATEGIES

    lines = ["strategies (pooled ones are evaluated at every n from one pool of max(n) samples):"]
    for spec in STRATEGIES.values():
        budget = {"samples": "n samples", "rounds": "n rounds", "none": "n = 1"}[spec.budget]
        lines.append(f"  {spec.name:<18} {spec.description} [{budget}{', pooled' if spec.pooled else ''}]")
    return "\n".join(lines)


def _sampling_params(args: argparse.Namespace):
    from metagen.sampling import SamplingParams

    fields = {}
    for name, _ in _FLOAT_PARAMS + _INT_PARAMS:
        value = getattr(args, name.replace("-", "_"))
        if value is not None:
            fields[name.replace("-", "_")] = value
    if args.stop:
        fields["stop"] = tuple(args.stop)
    if args.stop_token_ids:
        fields["stop_token_ids"] = tuple(args.stop_token_ids)
    if args.ignore_eos:
        fields["ignore_eos"] = True
    if args.logit_bias:
        fields["logit_bias"] = parse_logit_bias(args.logit_bias)
    if args.temperature == 0:
        unread = [name for name in _SAMPLING_ONLY if name != "temperature" and getattr(args, name.replace("-", "_")) is not None]
        if unread:
            raise ValueError(f"--temperature 0 decodes greedily: {', '.join('--' + n for n in unread)} would have no effect")
    return SamplingParams(**fields)


def _load(args: argparse.Namespace):
    import torch

    from metagen.models import load

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    return load(args.model, args.dtype)


def _prompt(args: argparse.Namespace):
    if args.system is not None:
        if args.chat is False:
            raise ValueError("--system needs the chat template; drop --no-chat")
        return [{"role": "system", "content": args.system}, {"role": "user", "content": args.prompt}]
    return args.prompt


def _generate(args: argparse.Namespace) -> int:
    from metagen.decoding import BeamSearchConfig, GenerationResult, beam_search, stream

    params = _sampling_params(args)
    if args.length_penalty is not None and args.beam_width is None:
        raise ValueError("--length-penalty applies to beam search only: add --beam-width N")
    if args.beam_width is not None:
        # Beam search honours --max-tokens only; any other sampling option given would be ignored.
        options = [name for name, _ in _FLOAT_PARAMS + _INT_PARAMS if name != "max-tokens"]
        options += ["stop", "stop-token-id", "ignore-eos", "logit-bias"]
        ignored = [
            name for name in options if getattr(args, _DESTINATIONS.get(name, name.replace("-", "_"))) is not None
        ]
        if ignored:
            raise ValueError(f"--beam-width cannot be combined with {', '.join('--' + name for name in ignored)}")
        config = BeamSearchConfig(
            width=args.beam_width, length_penalty=1.0 if args.length_penalty is None else args.length_penalty, max_tokens=params.max_tokens, n_best=1
        )
    speculative = _speculative_options(args)
    if speculative is not None and args.beam_width is not None:
        raise ValueError("--speculative cannot be combined with --beam-width")
    if args.strategy is not None:
        return _generate_with_strategy(args, params, speculative)
    if args.logprobs is not None and not args.json:
        raise ValueError("--logprobs shows in the --json output only: add --json")
    if args.value is not None or args.step_delimiter != "\n" or args.aggregation != "best":
        raise ValueError("--value, --step-delimiter and --aggregation apply to --strategy (tree search, "
                         "controlled decoding)")
    start = time.perf_counter()
    model = _load(args)
    drafter = _drafter(speculative, model) if speculative is not None else None
    load_seconds = time.perf_counter() - start
    prompt = _prompt(args)
    if args.beam_width is not None:
        begin = time.perf_counter()
        result = beam_search(model, prompt, config, chat=args.chat)
        seconds = time.perf_counter() - begin
        best = result.hypotheses[0]
        if args.json:
            print(json.dumps({
                "text": best.text, "tokens": best.token_ids, "logprob": best.logprob, "score": best.score,
                "finish_reason": "stop" if best.finished else "length",
                "timing": {"load_seconds": load_seconds, "search_seconds": seconds, "model_calls": result.model_calls},
            }))
        else:
            print(best.text)
        return 0
    result = GenerationResult([], [])
    if drafter is None:
        events = stream(model, prompt, params, chat=args.chat, result=result)
    else:
        from metagen.speculative import speculative_stream

        events = speculative_stream(model, drafter, prompt, params, speculative["config"], chat=args.chat, result=result)
    if args.json:
        for _ in events:
            pass
    else:
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
        return 0
    completions = [
        {
            "text": c.text,
            "tokens": c.token_ids,
            "logprobs": c.logprobs,
            "top_logprobs": None if c.top_logprobs is None else [{str(k): v for k, v in d.items()} for d in c.top_logprobs],
            "finish_reason": c.finish_reason,
            "stop_reason": c.stop_reason,
        }
        for c in result.completions
    ]
    payload = dict(completions[0]) if len(completions) == 1 else {"completions": completions}
    payload["timing"] = {
        "load_seconds": round(load_seconds, 4),
        "prefill_seconds": round(result.prefill_seconds, 4),
        "decode_seconds": round(result.decode_seconds, 4),
        "prompt_tokens": len(result.prompt_token_ids),
        "generated_tokens": result.generated_tokens,
        "tokens_per_second": round(result.tokens_per_second, 2),
    }
    if drafter is not None:
        payload["speculative"] = _speculative_summary(speculative, result.cost)
    print(json.dumps(payload))
    return 0


def _speculative_options(args: argparse.Namespace) -> dict | None:
    """The speculative settings of `generate`, or None; options without --speculative raise."""
    names = ("num_draft_tokens", "verify", "adaptive_draft", "exit_layer", "exit_adapter", "draft_dtype",
             "draft_confidence")
    if args.speculative is None:
        given = [name for name in names if getattr(args, name) is not None]
        if given:
            raise ValueError(f"{', '.join('--' + n.replace('_', '-') for n in given)} only apply with --speculative DRAFTER")
        return None
    from metagen.speculative import SpeculativeConfig

    config = SpeculativeConfig(
        num_draft_tokens=4 if args.num_draft_tokens is None else args.num_draft_tokens,
        verify=args.verify or "token",
        adaptive=bool(args.adaptive_draft),
    )
    drafter_args = {"exit_layer": args.exit_layer, "exit_adapter": args.exit_adapter,
                    "confidence": args.draft_confidence}
    if args.draft_dtype is not None:
        drafter_args["draft_dtype"] = args.draft_dtype
    return {"kind": args.speculative, "config": config, "drafter_args": drafter_args}


def _drafter(speculative: dict, model):
    from metagen.speculative import make_drafter

    return make_drafter(speculative["kind"], model, **speculative["drafter_args"])


def _speculative_summary(speculative: dict, cost) -> dict:
    config = speculative["config"]
    return {
        "drafter": speculative["kind"],
        "num_draft_tokens": config.num_draft_tokens,
        "verify": config.verify,
        "adaptive": config.adaptive,
        "draft_tokens": cost.draft_tokens,
        "accepted_tokens": cost.accepted_tokens,
        "acceptance_rate": None if cost.acceptance_rate is None else round(cost.acceptance_rate, 4),
        "target_steps": cost.target_steps,
        "block_efficiency": None if cost.block_efficiency is None else round(cost.block_efficiency, 4),
    }


def _generate_with_strategy(args: argparse.Namespace, params, speculative: dict | None) -> int:
    from dataclasses import replace

    from metagen.decoding import LocalGenerator
    from metagen.strategies.registry import StrategyOptions, check_options, get_strategy

    spec = get_strategy(args.strategy)
    if args.beam_width is not None:
        raise ValueError("--strategy cannot be combined with --beam-width")
    if args.logprobs is not None:
        raise ValueError("--logprobs applies to plain generation: a strategy's output has no per-token log-probabilities")
    if not spec.samples:
        given = [name for name in _SAMPLING_ONLY if getattr(args, name.replace("-", "_")) is not None]
        if given:
            raise ValueError(f"strategy {spec.name!r} decodes greedily: {', '.join('--' + n for n in given)} "
                             "would have no effect")
    budget = params.n
    spec.check_n(budget)
    model = _load(args)
    rng = replace(params, n=1).make_generator()
    if speculative is None:
        generator = LocalGenerator(model, chat=args.chat)
    else:
        from metagen.speculative import SpeculativeGenerator

        generator = SpeculativeGenerator(model, _drafter(speculative, model), speculative["config"], chat=args.chat)
    options = StrategyOptions(value=args.value, step_delimiter=args.step_delimiter, aggregation=args.aggregation)
    check_options([spec.name], options)
    result = spec.run(generator, _prompt(args), budget, replace(params, n=1), options, rng)
    if not args.json:
        print(result.chosen.text)
        if result.chosen.answer is not None:
            print(f"answer: {result.chosen.answer}")
        return 0
    print(json.dumps({
        "strategy": spec.name,
        "n": budget,
        "chosen": {"text": result.chosen.text, "answer": result.chosen.answer, "score": result.chosen.score},
        "candidates": [
            {"text": c.text, "answer": c.answer, "score": c.score, "finish_reason": c.finish_reason,
             "tokens": len(c.token_ids), "chosen": c is result.chosen}
            for c in result.candidates
        ],
        "votes": result.votes,
        "cost": result.cost.to_dict(),
    }))
    return 0


def _progress(done: int, total: int, started: list[float]) -> None:
    if not sys.stderr.isatty():
        return
    elapsed = time.perf_counter() - started[0]
    width = 30
    filled = int(width * done / total)
    remaining = elapsed / done * (total - done) if done else 0.0
    sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} problems, "
                     f"{elapsed:.0f} s elapsed, ~{remaining:.0f} s left ")
    if done == total:
        sys.stderr.write("\n")
    sys.stderr.flush()


def _parse_list(text: str, name: str, convert):
    try:
        values = tuple(convert(item.strip()) for item in text.split(",") if item.strip())
    except ValueError:
        raise ValueError(f"--{name} {text!r} must be a comma-separated list") from None
    if not values:
        raise ValueError(f"--{name} is empty")
    return values


def _eval(args: argparse.Namespace) -> int:
    """Everything that can be checked without the model (problems, options, --out) is checked
    before loading it; results already in --out are checked against the loaded model's identity."""
    from metagen.decoding import LocalGenerator
    from metagen.eval import EvalConfig, arithmetic_problems, evaluate, format_table, load_jsonl
    from metagen.eval.fingerprint import model_identity
    from metagen.outputs import check_writable_directory
    from metagen.sampling import SamplingParams
    from metagen.strategies.registry import StrategyOptions

    if args.data is not None:
        problems = load_jsonl(args.data)
    else:
        problems = arithmetic_problems(args.count, args.task_seed, args.max_number)
    if args.limit is not None:
        if args.limit < 1:
            raise ValueError(f"--limit {args.limit} is out of range: must be >= 1")
        problems = problems[: args.limit]
    sampling = {"temperature": args.temperature, "max_tokens": args.max_tokens}
    for name in ("top_p", "top_k", "min_p"):
        if getattr(args, name) is not None:
            sampling[name] = getattr(args, name)
    config = EvalConfig(
        strategies=_parse_list(args.strategy, "strategy", str),
        ns=_parse_list(args.n, "n", int),
        params=SamplingParams(**sampling),
        seed=args.seed,
        subsets=args.subsets,
        options=StrategyOptions(args.pattern, not args.no_math, args.value, args.step_delimiter, args.aggregation),
        prompt_suffix=args.prompt_suffix,
    )
    if args.out is not None:
        check_writable_directory(args.out, "--out")
    model = _load(args)
    started = [time.perf_counter()]
    report = evaluate(LocalGenerator(model), problems, config, args.out, model=model_identity(model),
                      progress=lambda done, total: _progress(done, total, started))
    table = format_table(report)
    if args.out is not None:
        from pathlib import Path

        from metagen.eval.plots import plot_curves

        out = Path(args.out)
        (out / "summary.txt").write_text(table + "\n")
        (out / "summary.json").write_text(json.dumps(report.to_dict(), indent=1) + "\n")
        plot_curves(report, out, title=f"{model.config.name}, {len(problems)} problems")
    if args.json:
        print(json.dumps(report.to_dict()))
    else:
        print(table)
    return 0


def _task(args: argparse.Namespace) -> int:
    from metagen.eval import arithmetic_problems

    for problem in arithmetic_problems(args.count, args.seed, args.max_number):
        print(json.dumps({"id": problem.id, "question": problem.question, "answer": problem.answer}))
    return 0


def _info(args: argparse.Namespace) -> int:
    from metagen.models.loading import weight_formats

    model = _load(args)
    config = model.config
    facts = {
        "name": config.name,
        "source": model.source,
        "architecture": config.architecture,
        "parameters": config.num_parameters,
        "dtype": model.dtype,
        "context_length": config.max_position_embeddings,
        "layers": config.num_hidden_layers,
        "hidden_size": config.hidden_size,
        "attention_heads": config.num_attention_heads,
        "kv_heads": config.num_key_value_heads,
        "vocab_size": config.vocab_size,
        "tied_embeddings": config.tie_word_embeddings,
        "rope_theta": config.rope_theta,
        "eos_token_ids": sorted(model.eos_token_ids),
        "chat_template": model.tokenizer.chat_template is not None,
        "weights": weight_formats(model),
    }
    if args.json:
        print(json.dumps(facts))
    else:
        width = max(len(k) for k in facts)
        for key, value in facts.items():
            if key == "weights":  # one line per kind of linear: "int8 from Q5_0 ×12, ..."
                for name, counts in value.items():
                    text = ", ".join(f"{label} ×{count}" for label, count in counts.items())
                    print(f"{'weights.' + name:<{width}}  {text}")
                continue
            print(f"{key:<{width}}  {value:,}" if isinstance(value, int) and not isinstance(value, bool) else f"{key:<{width}}  {value}")
    return 0


def _train_exit_adapter(args: argparse.Namespace) -> int:
    from metagen.speculative import sample_training_data, train_exit_adapter

    if args.tokens_per_prompt < 2:
        raise ValueError(f"--tokens-per-prompt={args.tokens_per_prompt} must be >= 2")
    model = _load(args)
    data = sample_training_data(model, tokens_per_prompt=args.tokens_per_prompt, seed=args.seed)
    adapter, report = train_exit_adapter(model, args.exit_layer, data, rank=args.rank, steps=args.steps, seed=args.seed)
    adapter.save(args.out)
    print(f"exit layer {report.num_layers}: held-out top-1 agreement with the full model "
          f"{report.agreement_before:.3f} -> {report.agreement_after:.3f}, KL {report.kl_before:.2f} -> "
          f"{report.kl_after:.2f} nats ({report.train_tokens} training tokens, {report.parameters:,} parameters); "
          f"saved {args.out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    use_spinning_threads()
    try:
        check_threads(getattr(args, "threads", None))
        if args.command == "generate":
            return _generate(args)
        if args.command == "eval":
            return _eval(args)
        if args.command == "task":
            return _task(args)
        if args.command == "train-exit-adapter":
            return _train_exit_adapter(args)
        if args.command == "theory":
            from metagen.theory.cli import run as run_theory

            return run_theory(args)
        return _info(args)
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


if __name__ == "__main__":
    sys.exit(main())
