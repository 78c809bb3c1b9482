"""Speculative decoding against plain decoding, and against transformers and llama.cpp, in one run.

Every configuration decodes the same prompts (chat template, EOS ends a row, `--tokens` at most)
at temperature 0 (greedy) and 1 (plain sampling, seeded). Three prompt kinds (`--kinds`):

- grounded: summarise / extract / correct a passage given in the prompt (the answer reuses its
  words: where prompt lookup shines);
- open: chat questions with nothing to copy;
- code: short Python functions and a class to write.

metagen configurations, each against plain decoding of the same target: the drafters of
metagen's registry (`--drafters NAME[,NAME...]`; default every registered drafter that runs on
the target without extra inputs: `model:PATH` with `--draft-model PATH`, `medusa:PATH` with
`--medusa-heads PATH`, `quantized` on a target above its draft's precision, `rasd` reading `--draft-corpus` when given), each under the
rule it verifies with (`--verify RULE[,RULE...]` for others) and with `--tree-widths` /
`--tree-nodes` (any drafter reading them then drafts token trees); targets `--targets
int4,bf16,fp32`, each with the activation codes of `--activations int16,int8`; with
`--adaptive` also adaptive γ for the chain drafters. Every combination is checked by the
registry (`check_speculative`) before any model loads: a bad one is refused by name
(`speculative_plan.py`). With `--qwen-dir DIR`: Qwen2.5-Coder-1.5B in the default format as
the target, on `--qwen-kinds` (default code and grounded prompts), with the drafters of
`--qwen-drafters` (default: every registered one that runs on it, Qwen2.5-Coder-0.5B as
`model:PATH` included, drafting in int4 unless `--draft-dtype` says otherwise).

Peers on the same weights (transformers loads the GGUF dequantized to fp32): plain `generate`,
prompt lookup decoding (`prompt_lookup_num_tokens`) and self-speculative early exit
(`assistant_early_exit`, temperature 0 only: it runs at ~2 tok/s here); llama.cpp (if
installed) plain and with `LlamaPromptLookupDecoding`.

Measured per (target, activations, drafter, rule, temperature, prompt kind), summed over
prompts, hardware-independent figures first: tokens per target forward (block efficiency, the
prefill counted as a forward), target forwards per generated token, acceptance rate (accepted /
proposed draft tokens); then generated tokens / wall seconds of the whole call (prefill
included, the same for every engine; metagen rows also give decode-only tokens/s, the call
minus its prefill) and speedup = tokens/s over the same engine's plain tokens/s with the same
weights and activation codes at the same temperature on the same prompts. Each configuration
runs once as warm-up on a separate prompt first.

Run:  PYTHONPATH=src .venv/bin/python benchmarks/speculative.py --out spec.json --markdown
      PYTHONPATH=src .venv/bin/python benchmarks/speculative.py --targets int4 --drafters ngram,recycling \\
          --temperatures 0 --skip transformers,llama.cpp,qwen --activations int16,int8
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import platform
import time
from dataclasses import asdict
from pathlib import Path

import torch
from speculative_plan import ACTIVATIONS, TARGETS, Row, add_speedups, plan_runs, split_list, table

from metagen.decoding import generate
from metagen.models import embedded_model_path, load
from metagen.sampling import SamplingParams
from metagen.speculative import SpeculativeConfig, make_drafter, speculative_generate
from metagen.tables import table as render

PASSAGES = [
    "The Harwick Bridge was opened on 14 March 1889 after six years of work. It is 412 metres long "
    "and carried horse-drawn carts until 1923, when the council replaced the wooden deck with "
    "steel. In 1967 a lorry weighing 38 tonnes cracked two of the main girders, and the bridge "
    "was closed for eleven months. Today about 9,000 vehicles cross it every day, and a museum "
    "at the north end tells the story of the 214 workers who built it.",
    "Maria Lopez started the Green Valley bakery in 2004 with one oven and a loan of 15,000 "
    "dollars. By 2010 the bakery employed 23 people and sold bread to four supermarkets. In 2016 "
    "Maria opened a second shop in Riverside, run by her brother Daniel. The bakery is known "
    "for its sourdough, which rises for 36 hours, and for its apple cake, made from a recipe "
    "that belonged to Maria's grandmother.",
    "Teh new library will be open from Monday to Saturday, from nine in the morning untill six in "
    "the evening. Members can borrow up to ten books at a time for three weeks. Children under "
    "twelve need a parent to sign there membership form. The library also has a cafe, a quiet "
    "study room, and twenty computers that anyone can use for free for one hour each day.",
]
GROUNDED = [
    f"Summarize this passage in two sentences, reusing its words:\n\n{PASSAGES[0]}",
    f"List every person, place and number mentioned in this passage, with what it refers to:\n\n{PASSAGES[1]}",
    f"Correct the spelling mistakes in this passage and write it out in full:\n\n{PASSAGES[2]}",
]
OPEN = [
    "Give me three tips for learning to play the guitar.",
    "Why do cats purr? Explain briefly.",
    "Write a short poem about the sea at night.",
]
WARMUP = "Describe a cup of coffee in two sentences."
CODE = [
    "Write a Python function that returns the n-th Fibonacci number iteratively, with a docstring.",
    "Write a Python class Stack with push, pop, peek and is_empty methods.",
    "Write a Python function that tells whether a string is a palindrome, ignoring case and spaces.",
]
KINDS = {"grounded": GROUNDED, "open": OPEN, "code": CODE}
QWEN_TARGET = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
QWEN_DRAFT = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"


def chat(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def params_for(temperature: float, tokens: int, seed: int) -> SamplingParams:
    return SamplingParams(temperature=temperature, max_tokens=tokens, seed=seed)


# ----------------------------------------------------------------------------- metagen
def run_metagen(rows: list[Row], target, target_name: str, method: str, make, verify: str, temperature: float,
                kinds: dict[str, list[str]], args, adaptive: bool = False) -> None:
    """One configuration over every prompt kind; `make` builds a fresh drafter per prompt (outside
    the timed call), None means plain decoding."""
    config = SpeculativeConfig(num_draft_tokens=args.gamma, verify=verify, adaptive=adaptive)

    def once(prompt: str, seed: int):
        params = params_for(temperature, args.tokens, seed)
        drafter = None if make is None else make()
        start = time.perf_counter()
        if drafter is None:
            result = generate(target, chat(prompt), params)
        else:
            result = speculative_generate(target, drafter, chat(prompt), params, config)
        return result, time.perf_counter() - start

    once(WARMUP, 0)
    activations = getattr(target, "activations", None) or "—"
    for kind, prompts in kinds.items():
        row = Row("metagen", target_name, activations, method, verify if make else "—", temperature, kind)
        for index, prompt in enumerate(prompts):
            result, seconds = once(prompt, args.seed + index)
            tokens = result.generated_tokens
            row.tokens += tokens
            row.seconds += seconds
            row.decode_seconds += seconds - result.prefill_seconds
            cost = result.cost
            row.draft_tokens += cost.draft_tokens
            row.accepted_tokens += cost.accepted_tokens
            row.target_steps += cost.target_steps
            row.runs.append({"prompt": index, "tokens": tokens, "seconds": seconds, "target_steps": cost.target_steps,
                             "token_ids": result.completions[0].token_ids})
        rows.append(row)
        print(f"  {row.engine} {row.target} {row.activations} {row.method} {row.verify} T={temperature} {kind}: "
              f"{row.block_efficiency} tokens / target forward, acceptance {row.acceptance_rate}, "
              f"{row.tokens_per_second:.1f} tok/s", flush=True)


def plan_suite(rows: list[Row], target, name: str, plan: list, kinds, args) -> None:
    """One loaded target at each temperature: plain decoding, then every planned run."""
    for temperature in args.temperatures:
        print(f"metagen {name} ({target.activations} activations), temperature {temperature}", flush=True)
        run_metagen(rows, target, name, "plain", None, "token", temperature, kinds, args)
        for run in plan:
            options = run.options.given()
            run_metagen(rows, target, name, run.label,
                        lambda run=run, options=options: make_drafter(run.drafter, target, **options),
                        run.verify, temperature, kinds, args, adaptive=run.adaptive)


def metagen_suite(rows: list[Row], kinds, plans: dict, args) -> None:
    """The embedded model in each target dtype and activation setting (`plan_suite`)."""
    for name in args.targets:
        for activations in args.activations:
            plan_suite(rows, load(dtype=name, activations=activations), name, plans[name], kinds, args)


def qwen_suite(rows: list[Row], kinds, plan: list, args) -> None:
    """Qwen2.5-Coder-1.5B in the default format (each tensor as the file stores it) with each
    activation setting (`plan_suite`; the 0.5B file is `model:PATH`)."""
    for activations in args.activations:
        target = load(Path(args.qwen_dir) / QWEN_TARGET, activations=activations)
        plan_suite(rows, target, "qwen-1.5b auto", plan, kinds, args)


# ------------------------------------------------------------------------ transformers
def transformers_suite(rows: list[Row], kinds, args) -> None:
    import transformers
    from transformers import AutoModelForCausalLM

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    path = embedded_model_path()
    tokenizer = load(dtype="int4").tokenizer  # the same token ids for every engine
    with contextlib.redirect_stderr(io.StringIO()):
        model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    model.eval()
    eos = model.generation_config.eos_token_id
    eos = eos[0] if isinstance(eos, list) else eos
    exit_layer = args.exit_layer or 20  # the registry's default for this 30-layer model
    methods = {
        "plain": {},
        "prompt lookup": {"prompt_lookup_num_tokens": args.gamma},
        f"early exit L={exit_layer}": {"assistant_early_exit": exit_layer, "num_assistant_tokens": args.gamma,
                                             "num_assistant_tokens_schedule": "constant"},
    }

    def once(prompt: str, temperature: float, seed: int, extra: dict):
        ids = torch.tensor([tokenizer_ids(tokenizer, prompt)])
        sampling = dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0) if temperature else dict(do_sample=False)
        torch.manual_seed(seed)
        start = time.perf_counter()
        with torch.inference_mode():
            output = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.tokens,
                                    pad_token_id=eos, **sampling, **extra)
        return output[0, ids.shape[1]:].tolist(), time.perf_counter() - start

    for temperature in args.temperatures:
        print(f"transformers fp32, temperature {temperature}", flush=True)
        for method, extra in methods.items():
            if "assistant_early_exit" in extra and temperature != 0:
                continue  # ~2 tok/s at temperature 0 on this model: measured there only, to bound the run
            once(WARMUP, temperature, 0, extra)
            for kind, prompts in kinds.items():
                row = Row("transformers", "fp32", "—", method, "token" if extra else "—", temperature, kind)
                for index, prompt in enumerate(prompts):
                    tokens, seconds = once(prompt, temperature, args.seed + index, extra)
                    if eos in tokens:
                        tokens = tokens[: tokens.index(eos) + 1]
                    row.tokens += len(tokens)
                    row.seconds += seconds
                    row.runs.append({"prompt": index, "tokens": len(tokens), "seconds": seconds, "token_ids": tokens})
                rows.append(row)
                print(f"  transformers {method} T={temperature} {kind}: {row.tokens_per_second:.1f} tok/s", flush=True)


def tokenizer_ids(tokenizer, prompt: str) -> list[int]:
    from metagen.decoding.prompts import encode_prompt

    return encode_prompt(tokenizer, chat(prompt), None)


# --------------------------------------------------------------------------- llama.cpp
def llama_cpp_suite(rows: list[Row], kinds, args) -> None:
    try:
        from llama_cpp import Llama
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding
    except ImportError:
        print("llama.cpp: llama-cpp-python is not installed, skipped", flush=True)
        return
    tokenizer = load(dtype="int4").tokenizer
    engines = {
        "plain": lambda: Llama(str(embedded_model_path()), n_ctx=2048, n_threads=torch.get_num_threads(), verbose=False),
        "prompt lookup": lambda: Llama(str(embedded_model_path()), n_ctx=2048, n_threads=torch.get_num_threads(),
                                       verbose=False, draft_model=LlamaPromptLookupDecoding(num_pred_tokens=args.gamma)),
    }
    for method, make in engines.items():
        llm = make()
        for temperature in args.temperatures:
            def once(prompt: str, seed: int):
                ids = tokenizer_ids(tokenizer, prompt)
                llm.reset()
                start = time.perf_counter()
                out = llm.create_completion(ids, max_tokens=args.tokens, temperature=temperature, top_k=0, top_p=1.0,
                                            min_p=0.0, repeat_penalty=1.0, seed=seed)
                return out["usage"]["completion_tokens"], time.perf_counter() - start

            once(WARMUP, 0)
            for kind, prompts in kinds.items():
                row = Row("llama.cpp", "Q4_1", "—", method, "token" if method != "plain" else "—", temperature, kind)
                for index, prompt in enumerate(prompts):
                    tokens, seconds = once(prompt, args.seed + index)
                    row.tokens += tokens
                    row.seconds += seconds
                    row.runs.append({"prompt": index, "tokens": tokens, "seconds": seconds})
                rows.append(row)
                print(f"  llama.cpp {method} T={temperature} {kind}: {row.tokens_per_second:.1f} tok/s", flush=True)
        llm.close()


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, dict]:
    """The options, and the planned runs per target (`speculative_plan.plan_runs`): an unknown
    drafter, rule, target or activation setting, an option a named drafter does not read or a
    tree draft with a chain rule is a usage error naming it, before any model loads."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=128, help="new tokens at most per prompt (default 128)")
    parser.add_argument("--gamma", type=int, default=4, help="draft tokens per step (default 4)")
    parser.add_argument("--drafters", default=None, metavar="NAME[,NAME...]",
                        help="registered drafters (default: every one that runs on the target without extra inputs)")
    parser.add_argument("--verify", default=None, metavar="RULE[,RULE...]",
                        help="verification rules (default: the one each drafter verifies with)")
    parser.add_argument("--adaptive", action="store_true", help="also run the chain drafters with adaptive γ")
    parser.add_argument("--exit-layer", type=int, default=None, help="early-exit depth (default 20 of 30)")
    parser.add_argument("--exit-adapter", default=None, help="trained ExitAdapter file for the early-exit drafters")
    parser.add_argument("--draft-model", default=None, metavar="PATH", help="adds the drafter model:PATH")
    parser.add_argument("--medusa-heads", default=None, metavar="PATH",
                        help="adds the drafter medusa:PATH (metagen train-medusa; trained on the target's dtype)")
    parser.add_argument("--draft-dtype", default=None, help="quantized / model:PATH draft weights (default int4)")
    parser.add_argument("--draft-corpus", default=None, metavar="PATH", help="text file the rasd drafters retrieve from")
    parser.add_argument("--tree-widths", default=None, metavar="K1,K2,...", help="children per node at each depth")
    parser.add_argument("--tree-nodes", type=int, default=None, help="tree nodes per step")
    parser.add_argument("--temperatures", default="0,1", help="comma-separated (default 0,1)")
    parser.add_argument("--prompts", type=int, default=None, help="prompts per kind (default all three)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--qwen-dir", default=None, help="directory with the two Qwen2.5-Coder GGUF files")
    parser.add_argument("--qwen-drafters", default=None, metavar="NAME[,NAME...]",
                        help="drafters for the Qwen 1.5B target (default: every registered one running on it, "
                             "model:<the 0.5B file> included)")
    parser.add_argument("--kinds", default="grounded,open,code", help="prompt kinds of the embedded model "
                        "(grounded, open, code; default all)")
    parser.add_argument("--qwen-kinds", default="code,grounded", help="prompt kinds of the Qwen pair (default code,grounded)")
    parser.add_argument("--targets", default="int4,bf16,fp32", help="metagen target dtypes (default all three)")
    parser.add_argument("--activations", default="int16", help="activation codes of the targets: int16, int8 or both")
    parser.add_argument("--skip", default="", help="comma-separated: metagen,transformers,llama.cpp,qwen")
    parser.add_argument("--out", default=None, help="write every measurement as JSON here")
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    args = parser.parse_args(argv)
    try:
        args.temperatures = [float(t) for t in split_list(args.temperatures, "--temperatures")]
        args.targets = split_list(args.targets, "--targets", TARGETS)
        args.activations = split_list(args.activations, "--activations", ACTIVATIONS)
        widths = split_list(args.tree_widths, "--tree-widths")
        if widths is not None and not all(k.isdigit() for k in widths):
            raise ValueError(f"--tree-widths {args.tree_widths!r}: give comma-separated ints >= 1 (e.g. 2,2,1)")
        widths = None if widths is None else tuple(int(k) for k in widths)
        common = {"exit_layer": args.exit_layer, "exit_adapter": args.exit_adapter, "draft_dtype": args.draft_dtype,
                  "draft_corpus": args.draft_corpus}
        plans = {}
        for target in args.targets:
            plans[target], notes = plan_runs(
                target, split_list(args.drafters, "--drafters"), split_list(args.verify, "--verify"), common=common,
                tree={"tree_widths": widths, "tree_nodes": args.tree_nodes}, adaptive=args.adaptive,
                draft_model=args.draft_model, medusa_heads=args.medusa_heads)
            for note in notes:
                print(note, flush=True)
        if args.qwen_dir:
            plans["qwen"], notes = plan_runs(
                "int4", split_list(args.qwen_drafters, "--qwen-drafters"), split_list(args.verify, "--verify"),
                common=common, tree={"tree_widths": widths, "tree_nodes": args.tree_nodes}, adaptive=args.adaptive,
                draft_model=str(Path(args.qwen_dir) / QWEN_DRAFT))
            for note in notes:
                print(note.replace("int4:", "qwen:", 1), flush=True)
        args.kinds = split_list(args.kinds, "--kinds", tuple(KINDS))
        args.qwen_kinds = split_list(args.qwen_kinds, "--qwen-kinds", tuple(KINDS))
        if args.prompts is not None and args.prompts < 1:
            raise ValueError(f"--prompts {args.prompts} must be >= 1")
    except ValueError as error:
        parser.error(str(error))
    return args, plans


def main() -> None:
    args, plans = parse_args()
    skip = set(filter(None, args.skip.split(",")))
    torch.set_num_threads(args.threads)
    kinds = {kind: KINDS[kind][:args.prompts] for kind in args.kinds}
    rows: list[Row] = []
    if "metagen" not in skip:
        metagen_suite(rows, kinds, plans, args)
    if args.qwen_dir and "qwen" not in skip:
        qwen_suite(rows, {kind: KINDS[kind][:args.prompts] for kind in args.qwen_kinds}, plans["qwen"], args)
    if "transformers" not in skip:
        transformers_suite(rows, kinds, args)
    if "llama.cpp" not in skip:
        llama_cpp_suite(rows, kinds, args)
    add_speedups(rows)
    rendered = table(rows)
    print(render(rendered[0], rendered[1:], markdown=args.markdown))
    if args.out:
        payload = {
            "settings": {k: v for k, v in vars(args).items()},
            "environment": {"python": platform.python_version(), "torch": torch.__version__,
                            "threads": torch.get_num_threads()},
            "rows": [asdict(r) | r.summary() for r in rows],
        }
        Path(args.out).write_text(json.dumps(payload, indent=1))


if __name__ == "__main__":
    main()
