"""Structured generation on the embedded model, in one run: what a constraint costs and how its
outputs compare with llama.cpp's own grammar sampling.

    .venv/bin/python benchmarks/structured.py --markdown     # full run, about 10 minutes on 2 busy cores
    .venv/bin/python benchmarks/structured.py --quick        # smoke check, about 2 minutes

Model: the embedded SmolLM2-135M-Instruct GGUF, metagen's default dtype (int4 on its Q4_1 blocks).
Schemas: `structured_engines.SCHEMAS`, six realistic extractions, each prompted as a chat (system:
"answer in JSON following this schema: ..."; user: the text), the ids computed once with
metagen's tokenizer and given as ids to every engine. Sections:

(a) Per-token overhead of a constraint against plain decoding of the same length. A constrained
    row ends only where its schema accepts, so EOS cannot be ignored; instead the two workloads
    are schemas no row can complete within `--tokens` tokens (an array of at least 500 records /
    of at least 500 strings): every constrained row then decodes exactly `--tokens` tokens, the
    constraint live at every step (keys, enums, bounded numbers / free text), like the plain run
    with ignore_eos and the same max_tokens, prompt, batch and temperature (greedy at 1 row;
    temperature 1 at 16 rows, n=16). Per-step time = decode_seconds / tokens, best of
    `--repeats` runs after a warm-up, the two arms interleaved. Also the component estimate: the
    `StructuredProcessor` alone (masks + kernel + accept) replayed along the constrained run's
    own tokens, divided by the plain step: the same quantity without the model's noise.
    Jump-forward is turned off here when the build has it (forced tokens would change the count).
(b) Compile time per schema: the check `SamplingParams` runs on a byte vocabulary, the first
    use on the model's vocabulary (metagen's matcher cache emptied first; grammar + matcher +
    first mask), and a cached use (cache hit + the per-request deep copy). Best of `--repeats`.
(c) Jump-forward: each schema at T=0 with `generate(..., jump_forward=False)` and `True`:
    forwards, forced tokens, decode time. Runs when the build has the keyword and
    `GenerationResult.forced_tokens`; otherwise the section says so.
(d) llguidance against xgrammar (`structured_engines.py`): compile, per-mask time, special
    tokens allowed inside a JSON string and anywhere before the value is complete.
(e) llama.cpp's own JSON-schema sampling (llama-cpp-python in process, `n_batch=1` as this build
    needs, `LlamaGrammar.from_json_schema`, which is also what its `response_format` uses) against
    metagen, same prompts and weights file, at T=0 and at T=1 with `--seeds` seeds, batch 1:
    validity (json.loads + `jsonschema.validate`) with each failure named (cut at max_tokens,
    invalid JSON, violated bound, violated <keyword>), and decode tokens/s. Both engines sample
    from the full distribution (llama.cpp's top-k 40 / top-p 0.95 / min-p 0.05 defaults are
    turned off). Tokens/s: metagen's `tokens / decode_seconds` (its loop from the first choice:
    n choices, n - 1 forwards); llama.cpp's `(n - 1) / (time of the last token - time of the
    first)`, the first token's choice going with its prefill. The end token counts as a token.

OpenMP keeps its default wait policy, as in decode.py.
"""

from __future__ import annotations

import os
import argparse
import inspect
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from metagen.decoding import generate
from metagen.decoding.result import GenerationResult
from metagen.models import embedded_model_path, load
from metagen.sampling import SamplingParams
from metagen.tables import table
from structured_engines import SCHEMAS, Llguidance, Xgrammar, measure_engine, special_tokens_before_complete, \
    special_tokens_in_strings

# (a): schemas that no row completes within the measured length, so both arms decode every step
OVERHEAD_WORKLOADS = {
    "records": ({"type": "object", "properties": {"people": {"type": "array", "minItems": 500, "items": {
        "type": "object", "properties": {
            "name": {"type": "string", "maxLength": 40},
            "born": {"type": "integer", "minimum": 1500, "maximum": 2025},
            "field": {"enum": ["physics", "chemistry", "biology", "mathematics", "medicine"]}},
        "required": ["name", "born", "field"], "additionalProperties": False}}},
        "required": ["people"], "additionalProperties": False},
        "List famous scientists with their birth year and field."),
    "free text": ({"type": "object", "properties": {"notes": {"type": "array", "minItems": 500,
                                                              "items": {"type": "string"}}},
                   "required": ["notes"], "additionalProperties": False},
                  "Write notes on the history of Rome, one sentence each."),
}
BOUND_KEYWORDS = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minLength", "maxLength",
                  "minItems", "maxItems"}


def chat_ids(tokenizer, schema: dict, text: str) -> list[int]:
    messages = [{"role": "system", "content": "You answer in JSON following this JSON schema: " + json.dumps(schema)},
                {"role": "user", "content": text}]
    return tokenizer.encode_chat(messages, add_generation_prompt=True)


def jump_forward_available() -> bool:
    """True when `generate` takes `jump_forward` and results count `forced_tokens`."""
    return "jump_forward" in inspect.signature(generate).parameters and hasattr(GenerationResult([], []),
                                                                                 "forced_tokens")


def verdict(text: str, cut: bool, schema: dict) -> tuple[str, str]:
    """(kind, detail): kind "valid" or the failure, cut at max_tokens / invalid JSON / violated bound
    / violated <keyword>; detail says where (the JSON path and jsonschema's message, or the text's end)."""
    import jsonschema

    if cut:
        return "cut at max_tokens", "ends with " + repr(text[-40:])
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        return "invalid JSON", f"{error.msg} at character {error.pos} of {text[:80]!r}"
    error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(schema).iter_errors(value))
    if error is None:
        return "valid", ""
    kind = "violated bound" if error.validator in BOUND_KEYWORDS else f"violated {error.validator}"
    return kind, f"{'/'.join(map(str, error.absolute_path)) or '(root)'}: {error.message}"


# ------------------------------------------------------------------ (a) overhead
def measure_overhead(model, args, extra) -> list[list[str]]:
    from metagen.sampling.constraint import StructuredProcessor
    from metagen.structured.spec import StructuredOutputs

    rows = [["workload", "rows", "sampling", "steps", "plain ms/step", "constrained ms/step", "overhead",
             "processor ms/step (replay)", "overhead (replay)"]]
    for name, (schema, text) in OVERHEAD_WORKLOADS.items():
        prompt = chat_ids(model.tokenizer, schema, text)
        for batch in (1, args.batch):
            temperature = 0.0 if batch == 1 else 1.0
            common = dict(temperature=temperature, max_tokens=args.tokens, n=batch, seed=0)
            plain = SamplingParams(ignore_eos=True, **common)
            constrained = SamplingParams(structured_outputs={"json": schema}, **common)
            times = {"plain": [], "constrained": []}
            tokens = None
            for attempt in range(args.repeats + 1):  # the first pair is the warm-up
                for arm, params in (("plain", plain), ("constrained", constrained)):
                    result = generate(model, prompt, params, **(extra if arm == "constrained" else {}))
                    lengths = {len(c.token_ids) for c in result.completions}
                    if lengths != {args.tokens}:
                        raise RuntimeError(f"{name} {arm} B={batch}: rows of {sorted(lengths)} tokens, "
                                           f"expected all {args.tokens}")
                    if attempt:
                        times[arm].append(result.decode_seconds / args.tokens)
                    if arm == "constrained":
                        tokens = torch.tensor([c.token_ids for c in result.completions])  # (B, T)
            replay = float("inf")
            logits = torch.randn(batch, model.vocab_size, generator=torch.Generator().manual_seed(0))
            for _ in range(args.repeats):
                processor = StructuredProcessor(StructuredOutputs(json=schema), model.tokenizer, batch)
                start = time.perf_counter()
                for step in range(args.tokens):
                    processor.apply(logits)
                    processor.accept(tokens[:, step])
                replay = min(replay, (time.perf_counter() - start) / args.tokens)
            plain_step, constrained_step = min(times["plain"]), min(times["constrained"])
            rows.append([name, str(batch), "greedy" if batch == 1 else "T=1", str(args.tokens),
                         f"{plain_step * 1e3:.2f}", f"{constrained_step * 1e3:.2f}",
                         f"{100 * (constrained_step / plain_step - 1):+.1f}%", f"{replay * 1e3:.3f}",
                         f"{100 * replay / plain_step:.1f}%"])
            progress(f"(a) {name} B={batch}: {rows[-1][4]} vs {rows[-1][5]} ms/step")
    return rows


# ------------------------------------------------------------------ (b) compile
def measure_compile(tokenizer, cases, repeats) -> list[list[str]]:
    from metagen.structured import compile as compile_module
    from metagen.structured.spec import StructuredOutputs

    rows = [["schema", "params check ms (byte vocabulary)", "first use ms (model vocabulary)", "cached use us"]]
    for name, case in cases.items():
        checks, firsts = [], []
        for _ in range(repeats):
            compile_module._check.cache_clear()
            start = time.perf_counter()
            SamplingParams(structured_outputs={"json": case.schema})
            checks.append(time.perf_counter() - start)
            compile_module._CACHES.pop(tokenizer, None)
            spec = StructuredOutputs(json=case.schema)
            start = time.perf_counter()
            compile_module.compiled_matcher(spec, tokenizer).deep_copy()
            firsts.append(time.perf_counter() - start)
        count = 1000
        start = time.perf_counter()
        for _ in range(count):
            compile_module.compiled_matcher(spec, tokenizer).deep_copy()
        cached = (time.perf_counter() - start) / count
        rows.append([name, f"{min(checks) * 1e3:.2f}", f"{min(firsts) * 1e3:.2f}", f"{cached * 1e6:.1f}"])
    return rows


# ------------------------------------------------------------------ (c) jump-forward
def measure_jump_forward(model, cases, args) -> list[list[str]] | None:
    if not jump_forward_available():
        return None
    rows = [["schema", "tokens", "forced", "forwards off", "forwards on", "forwards saved", "decode s off",
             "decode s on", "time saved", "same text"]]
    for name, case in cases.items():
        prompt = chat_ids(model.tokenizer, case.schema, case.prompt)
        params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, structured_outputs={"json": case.schema})
        runs = {}
        for flag in (False, True):
            generate(model, prompt, params, jump_forward=flag)  # warm-up
            results = [generate(model, prompt, params, jump_forward=flag) for _ in range(max(args.repeats, 1))]
            runs[flag] = (results[0], min(r.decode_seconds for r in results))
        (off, off_seconds), (on, on_seconds) = runs[False], runs[True]
        forwards_off, forwards_on = off.cost.model_calls - 1, on.cost.model_calls - 1  # the prefill is not a decode forward
        rows.append([name, str(on.generated_tokens), str(on.forced_tokens), str(forwards_off), str(forwards_on),
                     f"{100 * (1 - forwards_on / max(forwards_off, 1)):.0f}%", f"{off_seconds:.2f}",
                     f"{on_seconds:.2f}", f"{100 * (1 - on_seconds / off_seconds):.0f}%",
                     "yes" if on.text == off.text else "no"])
        progress(f"(c) {name}: forwards {forwards_off} -> {forwards_on}")
    return rows


# ------------------------------------------------------------------ (d) engines
def measure_engines(tokenizer, cases, repeats) -> tuple[list[list[str]], list[str]]:
    engines = [Llguidance(tokenizer)]
    notes = []
    try:
        engines.append(Xgrammar(tokenizer))
    except ImportError:
        notes.append("xgrammar is not installed: only llguidance is measured")
    results = {engine.name: measure_engine(engine, tokenizer, repeats, cases) for engine in engines}
    rows = [["schema", "tokens"] + [f"{e.name} {what}" for e in engines for what in ("compile ms", "mask us/token")]]
    for name in cases:
        cells = [f"{results[e.name][name][key]:.2f}" if key == "compile_ms" else f"{results[e.name][name][key]:.1f}"
                 for e in engines for key in ("compile_ms", "mask_us")]
        rows.append([name, str(results[engines[0].name][name]["tokens"])] + cells)
    total = len(tokenizer.special_token_ids)
    for engine in engines:
        inside = special_tokens_in_strings(engine, tokenizer)
        anywhere = special_tokens_before_complete(engine, tokenizer, cases)
        shown = ", ".join(tokenizer.id_to_token(token) for token in inside[:4]) + (", ..." if len(inside) > 4 else "")
        notes.append(f"{engine.name}: {len(inside)} of the {total} special tokens allowed inside a JSON string, "
                     f"{len(anywhere)} at some step before the value is complete" + (f" ({shown})" if inside else ""))
    return rows, notes


# ------------------------------------------------------------------ (e) llama.cpp vs metagen
def run_metagen(model, prompt, case, temperature, seed, args, extra):
    params = SamplingParams(temperature=temperature, max_tokens=args.max_tokens, seed=seed,
                            structured_outputs={"json": case.schema})
    result = generate(model, prompt, params, **extra)
    completion = result.completions[0]
    tokens = len(completion.token_ids)
    return verdict(completion.text, completion.finish_reason == "length", case.schema), tokens, \
        tokens / result.decode_seconds, completion.text


def run_llama(llm, grammar, prompt, eos, temperature, seed, args):
    llm.set_seed(seed)
    tokens, stamps = [], []
    for token in llm.generate(prompt, top_k=0, top_p=1.0, min_p=0.0, typical_p=1.0, temp=temperature,
                              repeat_penalty=1.0, grammar=grammar):
        stamps.append(time.perf_counter())
        tokens.append(token)
        if token in eos or len(tokens) >= args.max_tokens:
            break
    cut = tokens[-1] not in eos
    text = llm.detokenize([t for t in tokens if t not in eos]).decode("utf-8", errors="replace")
    rate = (len(tokens) - 1) / (stamps[-1] - stamps[0]) if len(tokens) > 1 else float("nan")
    return text, cut, len(tokens), rate


def llama_grammar_problem(llm, grammar) -> str:
    """"" when llama.cpp parses the grammar, else its first error line. llama-cpp-python adds a
    grammar that failed to parse as a null sampler and crashes, so the parse is tried here first
    (llama.cpp prints the error on stderr: fd 2 is captured for the call)."""
    import tempfile

    import llama_cpp

    with tempfile.TemporaryFile() as capture:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(capture.fileno(), 2)
        try:
            sampler = llama_cpp.llama_sampler_init_grammar(llm._model.vocab, grammar._grammar.encode(),
                                                           grammar._root.encode())
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        capture.seek(0)
        message = capture.read().decode("utf-8", errors="replace").strip().splitlines()
    if sampler:
        llama_cpp.llama_sampler_free(sampler)
        return ""
    return message[0] if message else "llama.cpp did not parse the grammar"


def measure_vs_llama_cpp(model, path, cases, args, extra) -> tuple[list[list[str]], list[list[str]], list[str]]:
    notes = []
    try:
        from llama_cpp import Llama, LlamaGrammar
    except ImportError:
        return [], [], ["llama-cpp-python is not installed: section (e) skipped"]
    llm = Llama(str(path), n_ctx=2048, n_batch=1, n_threads=args.threads, n_threads_batch=args.threads,
                verbose=False)
    eos = model.tokenizer.eos_token_ids
    settings = [(0.0, 0)] + [(1.0, seed) for seed in range(args.seeds)]
    detail = [["schema", "T", "seed", "metagen", "metagen tokens", "metagen tok/s", "llama.cpp", "llama.cpp tokens",
               "llama.cpp tok/s"]]
    tally = {}  # (engine, T) -> verdicts, rates, tokens
    examples = {}  # (engine, failure kind) -> its first occurrence, described
    outputs = []
    for name, case in cases.items():
        prompt = chat_ids(model.tokenizer, case.schema, case.prompt)
        try:
            grammar = LlamaGrammar.from_json_schema(json.dumps(case.schema), verbose=False)
            problem = llama_grammar_problem(llm, grammar)
        except Exception as error:  # the converter refuses a keyword: every llama.cpp run of it fails
            problem = f"{type(error).__name__}: {error}"
        if problem:
            grammar = None
            notes.append(f"llama.cpp has no grammar for {name}: {problem[:160]}")
        run_metagen(model, prompt, case, 0.0, 0, args, extra)  # warm-up (compile, caches)
        for temperature, seed in settings:
            mine = run_metagen(model, prompt, case, temperature, seed, args, extra)
            if grammar is not None:
                text, cut, count, rate = run_llama(llm, grammar, prompt, eos, temperature, seed, args)
                theirs = (verdict(text, cut, case.schema), count, rate, text)
            else:
                theirs = (("grammar not parsed", problem[:80]), 0, float("nan"), "")
            for engine, ((result, why), count, rate, _) in (("metagen", mine), ("llama.cpp", theirs)):
                entry = tally.setdefault((engine, temperature), {"verdicts": [], "rates": [], "tokens": []})
                entry["verdicts"].append(result)
                if result != "valid":
                    examples.setdefault((engine, result), f"{engine}, {result}: {name} T={temperature:g} seed {seed}, "
                                                          f"{why}")
                entry["tokens"].append(count)
                if rate == rate:
                    entry["rates"].append(rate)
            detail.append([name, f"{temperature:g}", str(seed), mine[0][0], str(mine[1]), f"{mine[2]:.1f}",
                           theirs[0][0], str(theirs[1]), f"{theirs[2]:.1f}"])
            outputs.append({"schema": name, "temperature": temperature, "seed": seed, "metagen": mine[3],
                            "llama.cpp": theirs[3]})
            progress(f"(e) {name} T={temperature:g} seed {seed}: metagen {mine[0][0]} {mine[2]:.1f} tok/s, "
                     f"llama.cpp {theirs[0][0]} {theirs[2]:.1f} tok/s")
    llm.close()
    summary = [["engine", "T", "valid", "failures", "mean tokens", "median decode tok/s", "vs llama.cpp"]]
    for temperature in sorted({t for _, t in tally}):
        peer = statistics.median(tally[("llama.cpp", temperature)]["rates"] or [float("nan")])
        for engine in ("metagen", "llama.cpp"):
            entry = tally[(engine, temperature)]
            failures = {}
            for result in entry["verdicts"]:
                if result != "valid":
                    failures[result] = failures.get(result, 0) + 1
            rate = statistics.median(entry["rates"]) if entry["rates"] else float("nan")
            summary.append([engine, f"{temperature:g}", f"{entry['verdicts'].count('valid')}/{len(entry['verdicts'])}",
                            ", ".join(f"{kind} {count}" for kind, count in sorted(failures.items())) or "none",
                            f"{statistics.mean(entry['tokens']):.1f}", f"{rate:.1f}", f"{rate / peer:.2f}×"])
    notes += ["First of each failure:"] + [f"- {examples[key]}" for key in sorted(examples)] if examples else []
    if args.outputs is not None:
        args.outputs.write_text(json.dumps(outputs, indent=1, ensure_ascii=False))
    return summary, detail, notes


# ------------------------------------------------------------------ main
def progress(text: str) -> None:
    print(f"  {text}", file=sys.stderr, flush=True)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=None, help="GGUF file (default: the embedded SmolLM2-135M)")
    parser.add_argument("--dtype", default=None, help="metagen weights (default: metagen's default)")
    parser.add_argument("--tokens", type=int, default=64, help="(a) tokens per row (default 64)")
    parser.add_argument("--batch", type=int, default=16, help="(a) rows of the batched run (default 16)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs after a warm-up (default 3)")
    parser.add_argument("--max-tokens", type=int, default=160, help="(c, e) budget per output (default 160)")
    parser.add_argument("--seeds", type=int, default=3, help="(e) seeds at T=1 (default 3)")
    parser.add_argument("--threads", type=int, default=2, help="CPU threads for every engine (default 2)")
    parser.add_argument("--outputs", type=Path, default=None, help="(e) write every generated text here as JSON")
    parser.add_argument("--sections", default="abcde", help="which sections to run (default abcde)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke check: 2 schemas, 8 tokens, 4 rows, 1 repeat, 1 seed, 48-token budget")
    parser.add_argument("--markdown", nargs="?", const="-", default=None, metavar="PATH",
                        help="write Markdown tables for BENCHMARKS.md to PATH (no PATH: print them)")
    args = parser.parse_args(argv)
    if args.quick:
        args.tokens, args.batch, args.repeats, args.seeds, args.max_tokens = 8, 4, 1, 1, 48
    unknown = sorted(set(args.sections) - set("abcde"))
    if unknown or not args.sections:
        parser.error(f"--sections={args.sections!r}: letters from abcde, got {''.join(unknown) or 'none'}")
    for name in ("tokens", "batch", "repeats", "max_tokens", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.seeds < 0:
        parser.error(f"--seeds must be >= 0, got {args.seeds}")
    return args


def versions() -> str:
    from importlib.metadata import PackageNotFoundError, version

    found = []
    for package in ("torch", "llguidance", "xgrammar", "llama-cpp-python"):
        try:
            found.append(f"{package} {version(package)}")
        except PackageNotFoundError:
            pass
    return ", ".join(found)


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    path = Path(args.model) if args.model is not None else embedded_model_path()
    model = load(path, dtype=args.dtype)
    cases = {name: SCHEMAS[name] for name in (("taylor_swift", "weather") if args.quick else SCHEMAS)}
    jump_forward = jump_forward_available()
    print(f"model {path.name} ({model.dtype}: {model.layers[0].qkv.kind} linears), {args.threads} threads, "
          f"jump-forward {'available' if jump_forward else 'absent'}; {versions()}", file=sys.stderr)
    plain_run = {"jump_forward": False} if jump_forward else {}

    sections = []
    if "a" in args.sections:
        sections.append(("(a) Per-token overhead of the constraint", measure_overhead(model, args, plain_run), []))
    if "b" in args.sections:
        rows = measure_compile(model.tokenizer, cases, max(args.repeats, 3))
        sections.append(("(b) Compile time per schema", rows, []))
        progress("(b) done")
    if "c" in args.sections:
        jump = measure_jump_forward(model, cases, args)
        sections.append(("(c) Jump-forward", jump, [] if jump else ["n/a (no jump-forward in this build)"]))
    if "d" in args.sections:
        engines, notes = measure_engines(model.tokenizer, cases, max(args.repeats, 2))
        sections.append(("(d) llguidance vs xgrammar", engines, notes))
        progress("(d) done")
    if "e" in args.sections:
        summary, detail, notes = measure_vs_llama_cpp(model, path, cases, args, {})
        sections.append(("(e) metagen vs llama.cpp: validity and decode speed", summary or None, notes))
        sections.append(("(e) every run", detail or None, []))

    lines = [f"Structured generation, {path.name}, metagen {model.dtype}, {args.threads} threads; {versions()}."]
    for title, rows, notes in sections:
        lines += ["", f"{'### ' if args.markdown is not None else ''}{title}", ""]
        if rows:
            lines.append(table(rows[0], rows[1:], markdown=args.markdown is not None))
        lines += ([""] if rows and notes else []) + notes
    text = "\n".join(lines) + "\n"
    if args.markdown not in (None, "-"):
        Path(args.markdown).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
