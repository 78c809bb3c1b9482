"""Token-level decoders next to their baseline, measured in the same run on the embedded model.

Four families, each a table with its baseline in the first row, on the same fixed prompts (half
plain-text continuations with `chat=False`, half chat prompts), the same `--tokens` budget and
fixed seeds, on the embedded SmolLM2-135M-Instruct with `--threads 2`:

1. repetition: greedy, momentum decoding (`momentum_ngram=5`), greedy with `no_repeat_ngram_size=4`,
   and AdaDec (greedy with a lookahead rerank of the top 3 tokens over 5 tokens where the entropy
   is above `--adadec-threshold` bits; its extra forwards show in the model calls);
2. two models: greedy, contrastive decoding (amateur = the model's first 8 layers, α = 0.1),
   DExperts (base = expert = the full model, anti-expert = its first 8 layers, α = 1), and
   entropy-adaptive decoding (the first 12 layers decode, the full model takes over while their
   rolling entropy is above each of `--ead-thresholds` bits);
3. sampling: T = 1, Mirostat 1 and Mirostat 2 (τ = `--tau` bits);
4. beam: beam search of width 4 and diverse beam search (2 and 4 groups, λ = 1), 4 hypotheses;
5. superposed: superposed decoding of k = 3 drafts (the model alone, λ = 1; and λ = 0.46 with the
   n-grams of the prompt, plus `--ngram-corpus FILE`'s when given) against 3 independent nucleus
   samples (p = 0.9, one batched forward of 3 rows per step) and greedy decoding (one output).

The second models are the model's own early exits (`DecoderModel.truncated`: the first k layers,
the final norm and the LM head, sharing the weights), not separately trained models.

Metrics, per prompt then averaged over prompts: rep-4 = 1 − distinct/total 4-grams of the output
(the share of 4-grams repeating an earlier one); distinct-2 = distinct/total bigrams; log-prob =
mean log p(token) of the output under the full model, one teacher-forced forward over prompt +
output (a fluency proxy, not a quality score); tok/s = generated tokens / decode seconds summed over
prompts; FLOPs/token = `result.cost.flops` / generated tokens (every model's forwards, prefill
included); surprise = mean −log2 p(token) of sampled tokens under the model's own distribution
(`Completion.logprobs`) and under the distribution drawn from (`sampling_logprobs`, what Mirostat
steers toward τ). Superposed family: distinct-2 over the bigrams of the k outputs pooled (how
different the drafts are), log-prob averaged over the outputs, tok/s = every output's tokens /
decode seconds, model calls and MFLOPs per generated token.

    PYTHONPATH=src .venv/bin/python benchmarks/decoders.py --markdown
    PYTHONPATH=src .venv/bin/python benchmarks/decoders.py --prompts 2 --tokens 16   # quick check
    PYTHONPATH=src .venv/bin/python benchmarks/decoders.py --families superposed --ngram-corpus FILE
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import subprocess
import sys
import time
from pathlib import Path

import torch

from metagen.decoding import (AdaDecConfig, BeamSearchConfig, ContrastiveConfig, DExpertsConfig, EntropyAdaptiveConfig,
                              SuperposedConfig, beam_search, generate, superposed_decode)
from metagen.models import load
from metagen.models.embedded import embedded_model_path
from metagen.sampling import SamplingParams
from metagen.tables import table

# (text, chat): four continuations, four chat prompts
PROMPTS = (
    ("The history of the printing press begins in", False),
    ("In the small village by the sea, every morning the fishermen", False),
    ("The main reasons why cities grow are", False),
    ("Photosynthesis is the process by which", False),
    ("Write a short story about a robot who learns to paint.", True),
    ("Explain why the sky is blue to a ten-year-old.", True),
    ("What are some good habits for staying healthy?", True),
    ("Describe your ideal weekend.", True),
)


def ngrams(ids: list[int], n: int) -> list[tuple[int, ...]]:
    return [tuple(ids[i:i + n]) for i in range(len(ids) - n + 1)]


def rep_n(ids: list[int], n: int = 4) -> float:
    """Share of the output's n-grams that repeat an earlier one: 1 − distinct / total (0 if none)."""
    grams = ngrams(ids, n)
    return 1.0 - len(set(grams)) / len(grams) if grams else 0.0


def distinct_n(ids: list[int], n: int = 2) -> float:
    """Distinct / total n-grams (1.0 when there are none)."""
    grams = ngrams(ids, n)
    return len(set(grams)) / len(grams) if grams else 1.0


def mean_logprob(model, prompt_ids: list[int], output: list[int]) -> float:
    """Mean log p(output token | prefix) under `model`: one forward over prompt + output, O((P + T)·model)."""
    if not output:
        return float("nan")
    with torch.inference_mode():
        out = model.forward(model.new_cache(1), [list(prompt_ids) + list(output)], logits="all")
    logp = torch.log_softmax(out.logits[0].float(), dim=-1)
    positions = torch.arange(len(prompt_ids) - 1, len(prompt_ids) + len(output) - 1)
    return logp[positions, torch.tensor(output)].mean().item()


def run_generate(model, scorer, params, *, generate_model=None, combiner=None, rerank=None) -> dict:
    """Every prompt once with `params` (seed = prompt index); metrics averaged over prompts."""
    rows = []
    tokens = seconds = calls = 0
    flops = 0.0
    model_tokens: dict[str, int] = {}
    for index, (text, chat) in enumerate(PROMPTS):
        seeded = dataclasses.replace(params, seed=index)
        result = generate(generate_model or model, text, seeded, chat=chat, combiner=combiner, rerank=rerank)
        completion = result.completions[0]
        ids = completion.token_ids
        tokens += len(ids)
        seconds += result.decode_seconds
        calls += result.cost.model_calls
        flops = flops + result.cost.flops if result.cost.flops is not None and flops is not None else None
        for role, count in result.model_tokens.items():
            model_tokens[role] = model_tokens.get(role, 0) + count
        rows.append({
            "rep4": rep_n(ids), "distinct2": distinct_n(ids),
            "logprob": mean_logprob(scorer, result.prompt_token_ids, ids),
            "surprise": -sum(completion.logprobs) / len(ids) / math.log(2) if ids else float("nan"),
            "drawn_surprise": -sum(completion.sampling_logprobs) / len(ids) / math.log(2) if ids else float("nan"),
        })
    mean = {key: sum(r[key] for r in rows) / len(rows) for key in rows[0]}
    return {**mean, "tokens": tokens, "tok_s": tokens / seconds, "calls": calls,
            "flops_per_token": flops / tokens if flops else None, "model_tokens": model_tokens}


def run_beam(model, config: BeamSearchConfig) -> dict:
    """Every prompt once; distinct-2 over the bigrams of all returned hypotheses pooled."""
    distinct, scores = [], []
    calls = tokens = 0
    seconds = 0.0
    for text, chat in PROMPTS:
        start = time.perf_counter()
        result = beam_search(model, text, config, chat=chat)
        seconds += time.perf_counter() - start
        grams = [g for c in result.completions for g in ngrams(c.token_ids, 2)]
        distinct.append(len(set(grams)) / len(grams) if grams else 1.0)
        scores.append(result.completions[0].score)
        calls += result.cost.model_calls
        tokens += sum(len(c.token_ids) for c in result.completions)
    return {"distinct2": sum(distinct) / len(distinct), "score": sum(scores) / len(scores), "calls": calls,
            "seconds": seconds, "hypotheses": len(result.completions)}


def run_outputs(model, decode) -> dict:
    """`decode(text, chat, index)` (a `GenerationResult` of one or more outputs) on every prompt:
    distinct-2 over the outputs' bigrams pooled and the mean log-prob per prompt, then averaged;
    tokens / decode seconds, model calls and FLOPs per token summed over prompts."""
    distinct, logprobs = [], []
    tokens = calls = outputs = 0
    seconds = flops = 0.0
    for index, (text, chat) in enumerate(PROMPTS):
        result = decode(text, chat, index)
        ids = [c.token_ids for c in result.completions]
        grams = [g for one in ids for g in ngrams(one, 2)]
        distinct.append(len(set(grams)) / len(grams) if grams else 1.0)
        scored = [mean_logprob(model, result.prompt_token_ids, one) for one in ids if one]
        logprobs.append(sum(scored) / len(scored))
        tokens += sum(len(one) for one in ids)
        seconds += result.decode_seconds
        calls += result.cost.model_calls
        flops += result.cost.flops
        outputs = len(ids)
    return {"distinct2": sum(distinct) / len(distinct), "logprob": sum(logprobs) / len(logprobs), "tokens": tokens,
            "tok_s": tokens / seconds, "calls": calls, "flops_per_token": flops / tokens, "outputs": outputs}


def main() -> None:
    global PROMPTS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=len(PROMPTS), help="first N of the fixed prompts")
    parser.add_argument("--tokens", type=int, default=64, help="new tokens at most per output")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--amateur-layers", type=int, default=8)
    parser.add_argument("--small-layers", type=int, default=12, help="layers of entropy-adaptive decoding's small model")
    parser.add_argument("--ead-thresholds", default="1,1.5,2", help="entropy-adaptive thresholds, bits, comma-separated")
    parser.add_argument("--tau", type=float, default=3.0, help="Mirostat target surprise, bits")
    parser.add_argument("--adadec-threshold", type=float, default=2.0, help="AdaDec's entropy threshold τ, bits")
    parser.add_argument("--families", default="repetition,two-model,sampling,beam,superposed")
    parser.add_argument("--ngram-corpus", default=None, help="superposed: a text file whose n-grams (one document "
                                                             "per line) join the prompt's")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    PROMPTS = PROMPTS[:args.prompts]
    model = load(embedded_model_path())
    amateur, small = model.truncated(args.amateur_layers), model.truncated(args.small_layers)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    print(f"commit {commit}, {model.config.name}, {len(PROMPTS)} prompts "
          f"({sum(not c for _, c in PROMPTS)} continuations, {sum(c for _, c in PROMPTS)} chat), "
          f"≤ {args.tokens} new tokens, {args.threads} threads, seeds = prompt index", file=sys.stderr)
    for text, chat in PROMPTS:  # warm-up: every prompt's shapes once, untimed
        generate(model, text, SamplingParams(temperature=0, max_tokens=8), chat=chat)
    families = args.families.split(",")
    greedy = SamplingParams(temperature=0, max_tokens=args.tokens)
    g = run_generate(model, model, greedy) if {"repetition", "two-model"} & set(families) else None

    if "repetition" in families:
        runs = [("greedy", g),
                ("momentum (momentum_ngram=5)", run_generate(model, model, SamplingParams(
                    temperature=0, momentum_ngram=5, max_tokens=args.tokens))),
                ("greedy, no_repeat_ngram_size=4", run_generate(model, model, SamplingParams(
                    temperature=0, no_repeat_ngram_size=4, max_tokens=args.tokens))),
                (f"AdaDec (τ {args.adadec_threshold:g} bits, B 3, L 5)", run_generate(
                    model, model, greedy, rerank=AdaDecConfig(args.adadec_threshold, candidates=3, lookahead=5)))]
        lines = [[name, str(r["tokens"]), f"{r['rep4']:.3f}", f"{r['distinct2']:.3f}", f"{r['logprob']:.3f}",
                  f"{r['tok_s']:.1f}", str(r["calls"])] for name, r in runs]
        print("\nRepetition\n" + table(["decoder", "tokens", "rep-4", "distinct-2", "log-prob", "tok/s", "model calls"],
                                       lines, args.markdown), flush=True)

    if "two-model" in families:
        runs = [("greedy", g, None),
                (f"contrastive (amateur {args.amateur_layers} layers, α 0.1)", run_generate(
                    model, model, greedy, combiner=ContrastiveConfig(amateur, alpha=0.1)), None),
                (f"DExperts (base = expert = full, anti {args.amateur_layers} layers, α 1)", run_generate(
                    model, model, greedy, combiner=DExpertsConfig(model, amateur, alpha=1.0)), None),
                *[(f"entropy-adaptive ({args.small_layers} layers + full, τ {threshold:g} bits)", run_generate(
                    model, model, greedy, generate_model=small,
                    combiner=EntropyAdaptiveConfig(model, threshold=threshold)), "ead")
                  for threshold in map(float, args.ead_thresholds.split(","))],
                (f"greedy, {args.small_layers} layers alone", run_generate(model, model, greedy,
                                                                            generate_model=small), None)]
        lines = []
        for name, r, _ in runs:
            shares = r["model_tokens"]
            total = sum(shares.values())
            mix = ", ".join(f"{role} {count / total:.0%}" for role, count in sorted(shares.items())) if total else ""
            lines.append([name, str(r["tokens"]), f"{r['rep4']:.3f}", f"{r['distinct2']:.3f}", f"{r['logprob']:.3f}",
                          f"{r['tok_s']:.1f}", f"{r['flops_per_token'] / 1e6:.0f}" if r["flops_per_token"] else "?",
                          mix])
        print("\nTwo models\n" + table(["decoder", "tokens", "rep-4", "distinct-2", "log-prob (full model)", "tok/s",
                                        "MFLOPs / token", "tokens by model"], lines, args.markdown), flush=True)

    if "sampling" in families:
        runs = [("sampling, T = 1", run_generate(model, model, SamplingParams(temperature=1.0, max_tokens=args.tokens))),
                (f"Mirostat 1, τ {args.tau:g}", run_generate(model, model, SamplingParams(
                    temperature=1.0, mirostat_tau=args.tau, mirostat_mode=1, max_tokens=args.tokens))),
                (f"Mirostat 2, τ {args.tau:g}", run_generate(model, model, SamplingParams(
                    temperature=1.0, mirostat_tau=args.tau, mirostat_mode=2, max_tokens=args.tokens)))]
        lines = [[name, str(r["tokens"]), f"{r['surprise']:.2f}", f"{r['drawn_surprise']:.2f}", f"{r['distinct2']:.3f}",
                  f"{r['logprob']:.3f}", f"{r['tok_s']:.1f}"] for name, r in runs]
        print("\nSampling\n" + table(["decoder", "tokens", "surprise, model (bits)", "surprise, drawn (bits)",
                                      "distinct-2", "log-prob", "tok/s"], lines, args.markdown), flush=True)

    if "beam" in families:
        base = dict(width=4, n_best=4, max_tokens=args.tokens, length_penalty=1.0)
        beam_search(model, PROMPTS[0][0], BeamSearchConfig(width=4, max_tokens=4), chat=PROMPTS[0][1])  # warm-up
        runs = [("beam search, width 4", run_beam(model, BeamSearchConfig(**base))),
                ("diverse beam search, 2 groups, λ 1", run_beam(model, BeamSearchConfig(
                    **base, groups=2, diversity_penalty=1.0))),
                ("diverse beam search, 4 groups, λ 1", run_beam(model, BeamSearchConfig(
                    **base, groups=4, diversity_penalty=1.0)))]
        lines = [[name, f"{r['distinct2']:.3f}", f"{r['score']:.3f}", str(r["calls"]), f"{r['seconds']:.1f}"]
                 for name, r in runs]
        print("\nBeam\n" + table(["decoder", "distinct-2 over 4 hypotheses", "best score (logp / len)",
                                  "model calls", "wall s"], lines, args.markdown), flush=True)

    if "superposed" in families:
        corpus = None if args.ngram_corpus is None else Path(args.ngram_corpus)
        source = "prompt" + (f" + {corpus.name}" if corpus else "")
        plain = SuperposedConfig(lm_weight=1.0, max_tokens=args.tokens)
        mixed = SuperposedConfig(max_tokens=args.tokens)
        nucleus = SamplingParams(temperature=1.0, top_p=0.9, n=3, max_tokens=args.tokens)
        superposed_decode(model, PROMPTS[0][0], 3, chat=PROMPTS[0][1], config=SuperposedConfig(max_tokens=4))  # warm-up
        runs = [("greedy", run_outputs(model, lambda text, chat, i: generate(model, text, greedy, chat=chat))),
                ("3 samples, top-p 0.9 (batched)", run_outputs(model, lambda text, chat, i: generate(
                    model, text, dataclasses.replace(nucleus, seed=i), chat=chat))),
                ("superposed k 3, λ 1 (model alone)", run_outputs(model, lambda text, chat, i: superposed_decode(
                    model, text, 3, chat=chat, config=plain))),
                (f"superposed k 3, λ 0.46, n-grams of {source}", run_outputs(
                    model, lambda text, chat, i: superposed_decode(model, text, 3, corpus=corpus, chat=chat,
                                                                   config=mixed)))]
        lines = [[name, str(r["outputs"]), str(r["tokens"]), f"{r['distinct2']:.3f}", f"{r['logprob']:.3f}",
                  f"{r['tok_s']:.1f}", str(r["calls"]), f"{r['flops_per_token'] / 1e6:.0f}"] for name, r in runs]
        print("\nSuperposed\n" + table(["decoder", "outputs", "tokens", "distinct-2 over the outputs",
                                         "log-prob (model)", "tok/s (all outputs)", "model calls",
                                         "MFLOPs / token"], lines, args.markdown), flush=True)


if __name__ == "__main__":
    main()
