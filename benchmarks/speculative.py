"""Speculative decoding against plain decoding, and against transformers and llama.cpp, in one run.

Every configuration decodes the same prompts (chat template, EOS ends a row, `--tokens` at most)
at temperature 0 (greedy) and 1 (plain sampling, seeded). Two prompt kinds:

- grounded: summarise / extract / correct a passage given in the prompt (the answer reuses its
  words: where prompt lookup shines);
- open: chat questions with nothing to copy.

metagen configurations, each against plain decoding of the same weights:
- int4 target: n-gram drafter (prompt lookup + past outputs; fixed and adaptive γ), early-exit
  self-draft (first L layers; with `--exit-adapter FILE` also the trained adapter);
- bf16 target: n-gram, and the int4 copy of the same checkpoint as quantized self-draft;
- fp32 target: the int4 copy as quantized self-draft;
- token and block verification at temperature 1 (temperature 0 verifies greedily);
- with `--qwen-dir DIR`: Qwen2.5-Coder-1.5B drafted by Qwen2.5-Coder-0.5B, both in the default format.

Peers on the same weights (transformers loads the GGUF dequantized to fp32): plain `generate`,
prompt lookup decoding (`prompt_lookup_num_tokens`) and self-speculative early exit
(`assistant_early_exit`, temperature 0 only: it runs at ~2 tok/s here); llama.cpp (if
installed) plain and with `LlamaPromptLookupDecoding`.

Measured per (configuration, temperature, prompt kind), summed over prompts: generated tokens /
wall seconds of the whole call (prefill included, the same for every engine; metagen rows also
give decode-only tokens/s, the call minus its prefill), acceptance rate
(accepted / proposed draft tokens), block efficiency (tokens per target step, prefill counted as
a step) and speedup = tokens/s over the same engine's plain tokens/s at the same temperature on
the same prompts. Each configuration runs once as warm-up on a separate prompt first.

Run:  .venv/bin/python benchmarks/speculative.py --out spec.json --markdown
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "ACTIVE")  # before torch is imported

import argparse
import contextlib
import io
import json
import platform
import time
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path

import torch

from metagen.decoding import generate
from metagen.models import embedded_model_path, load
from metagen.sampling import SamplingParams
from metagen.speculative import (
    ModelDrafter,
    NgramDrafter,
    SpeculativeConfig,
    early_exit_model,
    speculative_generate,
)

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
QWEN_PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number iteratively, with a docstring.",
    "Write a Python class Stack with push, pop, peek and is_empty methods.",
]


@dataclass
class Row:
    engine: str
    target: str
    method: str
    verify: str
    temperature: float
    kind: str
    tokens: int = 0
    seconds: float = 0.0
    decode_seconds: float = 0.0  # metagen only: the call minus its prefill
    draft_tokens: int = 0
    accepted_tokens: int = 0
    target_steps: int = 0
    runs: list[dict] = field(default_factory=list)
    speedup: float | None = None
    decode_speedup: float | None = None

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    @property
    def decode_tokens_per_second(self) -> float | None:
        return self.tokens / self.decode_seconds if self.decode_seconds else None

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else None

    @property
    def block_efficiency(self) -> float | None:
        return self.tokens / self.target_steps if self.target_steps else None


def chat(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def params_for(temperature: float, tokens: int, seed: int) -> SamplingParams:
    return SamplingParams(temperature=temperature, max_tokens=tokens, seed=seed)


# ----------------------------------------------------------------------------- metagen
def run_metagen(rows: list[Row], target, target_name: str, method: str, make_drafter, verify: str,
                temperature: float, kinds: dict[str, list[str]], args, adaptive: bool = False) -> None:
    """One configuration over every prompt kind; `make_drafter` None means plain decoding."""
    config = SpeculativeConfig(num_draft_tokens=args.gamma, verify=verify, adaptive=adaptive)

    def once(prompt: str, seed: int):
        params = params_for(temperature, args.tokens, seed)
        start = time.perf_counter()
        if make_drafter is None:
            result = generate(target, chat(prompt), params)
        else:
            result = speculative_generate(target, make_drafter(), chat(prompt), params, config)
        return result, time.perf_counter() - start

    once(WARMUP, 0)
    for kind, prompts in kinds.items():
        row = Row("metagen", target_name, method, verify if make_drafter else "—", temperature, kind)
        for index, prompt in enumerate(prompts):
            result, seconds = once(prompt, args.seed + index)
            tokens = result.generated_tokens
            row.tokens += tokens
            row.seconds += seconds
            row.decode_seconds += seconds - result.prefill_seconds
            cost = result.cost
            if make_drafter is not None:
                row.draft_tokens += cost.draft_tokens
                row.accepted_tokens += cost.accepted_tokens
                row.target_steps += cost.target_steps
            else:
                row.target_steps += tokens
            row.runs.append({"prompt": index, "tokens": tokens, "seconds": seconds,
                             "token_ids": result.completions[0].token_ids})
        rows.append(row)
        print(f"  {row.engine} {row.target} {row.method} {row.verify} T={temperature} {kind}: "
              f"{row.tokens_per_second:.1f} tok/s, acceptance {row.acceptance_rate}, "
              f"block efficiency {row.block_efficiency}", flush=True)


def metagen_suite(rows: list[Row], kinds, args) -> None:
    """int4 target: n-gram (fixed and adaptive γ) and early-exit drafters; bf16 and fp32 targets:
    the int4 copy as quantized self-draft, and n-gram."""
    int4 = load(dtype="int4")
    targets = {name: int4 if name == "int4" else load(dtype=name) for name in args.targets}
    exit_layer = args.exit_layer
    draft = partial(ModelDrafter, share_prompt_cache=True)  # as make_drafter builds self-drafts
    adapter = None
    if args.exit_adapter:
        from metagen.speculative.adapter import AdaptedExitModel, ExitAdapter

        adapter = ExitAdapter.load(args.exit_adapter, int4)
    for temperature in args.temperatures:
        verifies = ["token"] if temperature == 0 else ["token", "block"]
        for name, target in targets.items():
            print(f"metagen {name}, temperature {temperature}", flush=True)
            run_metagen(rows, target, name, "plain", None, "token", temperature, kinds, args)
            for verify in verifies:
                if name != "fp32":
                    run_metagen(rows, target, name, "ngram", NgramDrafter, verify, temperature, kinds, args)
                    run_metagen(rows, target, name, "ngram, adaptive γ", NgramDrafter, verify, temperature, kinds,
                                args, adaptive=True)
                if name == "int4":
                    run_metagen(rows, target, name, f"early-exit L={exit_layer}",
                                lambda: draft(early_exit_model(int4, exit_layer)), verify, temperature,
                                kinds, args)
                    if adapter is not None:
                        run_metagen(rows, target, name, f"early-exit L={adapter.num_layers} + adapter",
                                    lambda: draft(AdaptedExitModel(int4, adapter)), verify, temperature,
                                    kinds, args)
                else:
                    run_metagen(rows, target, name, "quantized (int4 draft)", lambda: draft(int4), verify,
                                temperature, kinds, args)


def qwen_suite(rows: list[Row], args) -> None:
    directory = Path(args.qwen_dir)
    # both in metagen's default format: each tensor as the file stores it
    target = load(directory / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")
    draft = load(directory / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")
    kinds = {"code": QWEN_PROMPTS}
    for temperature in args.temperatures:
        verifies = ["token"] if temperature == 0 else ["token", "block"]
        print(f"Qwen2.5-Coder 1.5B <- 0.5B, temperature {temperature}", flush=True)
        run_metagen(rows, target, "qwen-1.5b auto", "plain", None, "token", temperature, kinds, args)
        for verify in verifies:
            run_metagen(rows, target, "qwen-1.5b auto", "model: qwen-0.5b auto", lambda: ModelDrafter(draft),
                        verify, temperature, kinds, args)
            run_metagen(rows, target, "qwen-1.5b auto", "ngram", NgramDrafter, verify, temperature, kinds, args)


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
    methods = {
        "plain": {},
        "prompt lookup": {"prompt_lookup_num_tokens": args.gamma},
        f"early exit L={args.exit_layer}": {"assistant_early_exit": args.exit_layer, "num_assistant_tokens": args.gamma,
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
                row = Row("transformers", "fp32", method, "token" if extra else "—", temperature, kind)
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
                row = Row("llama.cpp", "Q4_1", method, "token" if method != "plain" else "—", temperature, kind)
                for index, prompt in enumerate(prompts):
                    tokens, seconds = once(prompt, args.seed + index)
                    row.tokens += tokens
                    row.seconds += seconds
                    row.runs.append({"prompt": index, "tokens": tokens, "seconds": seconds})
                rows.append(row)
                print(f"  llama.cpp {method} T={temperature} {kind}: {row.tokens_per_second:.1f} tok/s", flush=True)
        llm.close()


# --------------------------------------------------------------------------- reporting
def add_speedups(rows: list[Row]) -> None:
    plain = {(r.engine, r.target, r.temperature, r.kind): r for r in rows if r.method == "plain"}
    for row in rows:
        base = plain.get((row.engine, row.target, row.temperature, row.kind))
        if base is not None and base.tokens_per_second:
            row.speedup = row.tokens_per_second / base.tokens_per_second
        if base is not None and base.decode_tokens_per_second and row.decode_tokens_per_second:
            row.decode_speedup = row.decode_tokens_per_second / base.decode_tokens_per_second


def table(rows: list[Row]) -> list[list[str]]:
    out = [["engine", "target", "drafter", "verify", "T", "prompts", "tok/s", "speedup", "decode tok/s",
            "decode speedup", "acceptance", "block eff."]]
    for r in rows:
        decode = r.decode_tokens_per_second
        out.append([
            r.engine, r.target, r.method, r.verify, f"{r.temperature:g}", r.kind, f"{r.tokens_per_second:.1f}",
            "—" if r.speedup is None else f"{r.speedup:.2f}×",
            "—" if decode is None else f"{decode:.1f}",
            "—" if r.decode_speedup is None else f"{r.decode_speedup:.2f}×",
            "—" if r.acceptance_rate is None else f"{r.acceptance_rate:.2f}",
            "—" if r.block_efficiency is None else f"{r.block_efficiency:.2f}",
        ])
    return out


def markdown(rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(row) + " |" for row in rows]
    lines.insert(1, "|" + "|".join("---" for _ in rows[0]) + "|")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=128, help="new tokens at most per prompt (default 128)")
    parser.add_argument("--gamma", type=int, default=4, help="draft tokens per step (default 4)")
    parser.add_argument("--exit-layer", type=int, default=20, help="early-exit depth (default 20 of 30)")
    parser.add_argument("--exit-adapter", default=None, help="trained ExitAdapter file for the int4 model")
    parser.add_argument("--temperatures", default="0,1", help="comma-separated (default 0,1)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--qwen-dir", default=None, help="directory with the two Qwen2.5-Coder GGUF files")
    parser.add_argument("--targets", default="int4,bf16,fp32", help="metagen target dtypes (default all three)")
    parser.add_argument("--skip", default="", help="comma-separated: metagen,transformers,llama.cpp,qwen")
    parser.add_argument("--out", default=None, help="write every measurement as JSON here")
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    args = parser.parse_args()
    args.temperatures = [float(t) for t in args.temperatures.split(",")]
    args.targets = [t for t in args.targets.split(",") if t]
    unknown = sorted(set(args.targets) - {"int4", "bf16", "fp32"})
    if unknown:
        parser.error(f"--targets {','.join(unknown)}: choose from int4, bf16, fp32")
    skip = set(filter(None, args.skip.split(",")))
    torch.set_num_threads(args.threads)
    kinds = {"grounded": GROUNDED, "open": OPEN}
    rows: list[Row] = []
    if "metagen" not in skip:
        metagen_suite(rows, kinds, args)
    if args.qwen_dir and "qwen" not in skip:
        qwen_suite(rows, args)
    if "transformers" not in skip:
        transformers_suite(rows, kinds, args)
    if "llama.cpp" not in skip:
        llama_cpp_suite(rows, kinds, args)
    add_speedups(rows)
    rendered = table(rows)
    print(markdown(rendered) if args.markdown else "\n".join("  ".join(r) for r in rendered))
    if args.out:
        payload = {
            "settings": {k: v for k, v in vars(args).items()},
            "environment": {"python": platform.python_version(), "torch": torch.__version__,
                            "threads": torch.get_num_threads()},
            "rows": [asdict(r) | {"tokens_per_second": r.tokens_per_second, "acceptance_rate": r.acceptance_rate,
                                  "block_efficiency": r.block_efficiency,
                                  "decode_tokens_per_second": r.decode_tokens_per_second} for r in rows],
        }
        Path(args.out).write_text(json.dumps(payload, indent=1))


if __name__ == "__main__":
    main()
