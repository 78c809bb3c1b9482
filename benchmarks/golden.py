"""Seeded outputs of the decoding loops, recorded once and compared after a change.

    PYTHONPATH=src .venv/bin/python benchmarks/golden.py --record before.json
    PYTHONPATH=src .venv/bin/python benchmarks/golden.py --compare before.json

A fixed set of calls on the embedded model — the sampling loop (greedy, seeded sampling, n > 1
rows ending on stop strings, EOS and max_tokens, a regex constraint, jump-forward on a JSON
schema on and off), beam search (deterministic and stochastic), speculative decoding (the n-gram
drafter and an early-exit model drafter; token and block verification, greedy and sampled),
two strategies (best_of_n, self_consistency) and a batch of requests through the serving
engine (in process, all admitted in its first step) — each reduced to plain values: token ids,
texts, log-probs rounded to 1e-4, finish and stop reasons, completeness and the `Cost` fields
that do not measure time. `--compare` runs the same calls and lists every value that differs
(exit status 1 when any does); a value recorded as None (a Cost a loop did not report then) or a
key not recorded, now present, is listed as added, not as a difference. Numerics are the machine's: compare on the machine that
recorded. Runs in about a minute on two threads.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from dataclasses import fields

import torch

ROUND = 4  # log-probs to 1e-4
TIMED = {"wall_seconds"}  # Cost fields that measure time, not work


def _logprobs(values) -> list[float]:
    return [round(float(v), ROUND) for v in values]


def _cost(cost) -> dict | None:
    if cost is None:
        return None
    out = {}
    for f in fields(cost):
        if f.name in TIMED:
            continue
        value = getattr(cost, f.name)
        out[f.name] = round(value, -3) if isinstance(value, float) and value > 1e6 else value
    return out


def _completion(c) -> dict:
    return {"token_ids": c.token_ids, "text": c.text, "logprobs": _logprobs(c.logprobs),
            "sampling_logprobs": _logprobs(c.sampling_logprobs),
            "top_logprobs": None if c.top_logprobs is None else
            [{str(k): round(v, ROUND) for k, v in top.items()} for top in c.top_logprobs],
            "finish_reason": c.finish_reason, "stop_reason": c.stop_reason, "complete": c.complete}


def _result(result) -> dict:
    return {"completions": [_completion(c) for c in result.completions], "prompt_token_ids": result.prompt_token_ids,
            "model_calls": result.cost.model_calls, "forced_tokens": result.forced_tokens,
            "healed_text": result.healed_text, "cost": _cost(result.cost)}


def _beam(result) -> dict:
    return {"model_calls": result.cost.model_calls, "cost": _cost(result.cost), "hypotheses": [
        {"token_ids": h.token_ids, "text": h.text, "logprob": round(h.cumulative_logprob, ROUND),
         "score": round(h.score, ROUND), "finished": h.finish_reason == "stop", "finish_reason": h.finish_reason,
         "complete": h.complete, "logprobs": _logprobs(h.logprobs)} for h in result.completions]}


def _strategy(result) -> dict:
    return {"chosen": result.chosen.text, "votes": {k: round(v, ROUND) for k, v in result.votes.items()},
            "cost": _cost(result.cost), "candidates": [
                {"text": c.text, "token_ids": c.token_ids, "logprobs": _logprobs(c.logprobs),
                 "finish_reason": c.finish_reason, "answer": c.answer, "complete": c.complete,
                 "score": None if c.score is None else round(c.score, ROUND)} for c in result.completions]}


SCHEMA = {"type": "object", "properties": {"order_has_already_been_paid_in_full": {"type": "boolean"},
                                           "customer_name": {"type": "string", "maxLength": 12}},
          "required": ["order_has_already_been_paid_in_full", "customer_name"], "additionalProperties": False}
STORY = "Once upon a time"
QUESTION = "What is the capital of France?"
PASSAGE = [{"role": "user", "content": "Repeat this passage word for word:\n\nThe lighthouse stood on a rock two "
            "miles from the harbour. Every night the keeper climbed one hundred and twelve steps to light the lamp."}]


def sampling_cases(model) -> dict:
    from metagen.decoding import generate
    from metagen.sampling import SamplingParams as P

    jf_params = P(temperature=0, max_tokens=40, structured_outputs={"json": SCHEMA})
    return {
        "greedy": _result(generate(model, QUESTION, P(temperature=0, max_tokens=24, logprobs=3))),
        "sampled_seed": _result(generate(model, STORY, P(temperature=0.9, top_k=40, seed=1, max_tokens=24),
                                         chat=False)),
        "sampled_penalties": _result(generate(model, "def add(a, b):", P(
            temperature=0.7, repetition_penalty=1.2, no_repeat_ngram_size=3, seed=9, max_tokens=30, stop=["\n\n"]),
            chat=False)),
        "n_rows_stops": _result(generate(model, "1, 2, 3,", P(
            temperature=1.0, min_p=0.1, seed=2, max_tokens=20, n=4, stop=[" 7", "\n"], logprobs=2), chat=False)),
        "n_rows_eos_mix": _result(generate(model, "Name a colour.", P(temperature=1.2, seed=5, max_tokens=12, n=4))),
        "n_rows_finish_apart": _result(generate(model, STORY, P(temperature=1.3, seed=21, max_tokens=14, n=5,
                                                                stop=[",", "."]), chat=False)),
        "generator_arg": _result(generate(model, STORY, P(temperature=1.0, max_tokens=16, n=2), chat=False,
                                          generator=torch.Generator().manual_seed(7))),
        "regex": _result(generate(model, "The url is http:", P(temperature=0.8, seed=4, max_tokens=16, n=2,
                                                                structured_outputs={"regex": "//[a-z]+\\.com"}),
                                  chat=False)),
        "regex_healing": _result(generate(model, "The url is http:", P(
            temperature=0, max_tokens=16, token_healing=True, structured_outputs={"regex": "://[a-z]+\\.com"}),
            chat=False)),
        "choice": _result(generate(model, "My favourite colour is", P(
            temperature=0, max_tokens=12, logprobs=2, structured_outputs={"choice": ["red", "green", "blue"]}),
            chat=False)),
        "jump_forward_json": _result(generate(model, "Has the order been paid? Answer in JSON.", jf_params)),
        "jump_forward_off_json": _result(generate(model, "Has the order been paid? Answer in JSON.", jf_params,
                                                  jump_forward=False)),
        "jump_forward_json_sampled": _result(generate(model, "Has the order been paid? Answer in JSON.", P(
            temperature=0.8, seed=3, n=3, max_tokens=40, logprobs=1, structured_outputs={"json": SCHEMA}))),
        "jump_forward_json_cut": _result(generate(model, "Has the order been paid? Answer in JSON.", P(
            temperature=0.8, seed=8, n=2, max_tokens=9, structured_outputs={"json": SCHEMA}))),
    }


def beam_cases(model) -> dict:
    from metagen.decoding import BeamSearchConfig, beam_search

    return {
        "beam": _beam(beam_search(model, QUESTION, BeamSearchConfig(width=3, max_tokens=16, n_best=3))),
        "beam_stochastic": _beam(beam_search(model, STORY, BeamSearchConfig(
            width=3, max_tokens=12, stochastic=True, temperature=0.8, n_best=2), chat=False,
            generator=torch.Generator().manual_seed(11))),
    }


def speculative_cases(model) -> dict:
    from metagen.sampling import SamplingParams as P
    from metagen.speculative import (ModelDrafter, NgramDrafter, SpeculativeConfig, early_exit_model,
                                     speculative_generate)

    def early_exit():
        return ModelDrafter(early_exit_model(model, 10), name="early-exit", share_prompt_cache=True)

    out = {}
    for name, make in (("ngram", NgramDrafter), ("early_exit", early_exit)):
        out[f"{name}_greedy"] = _result(speculative_generate(model, make(), PASSAGE, P(temperature=0, max_tokens=40)))
        for verify in ("token", "block"):
            out[f"{name}_{verify}_sampled"] = _result(speculative_generate(
                model, make(), PASSAGE, P(temperature=0.8, seed=6, n=2, max_tokens=30, logprobs=1, stop=["steps"]),
                SpeculativeConfig(num_draft_tokens=4, verify=verify)))
    out["ngram_adaptive_json"] = _result(speculative_generate(
        model, NgramDrafter(), "Has the order been paid? Answer in JSON.",
        P(temperature=0.7, seed=2, max_tokens=40, structured_outputs={"json": SCHEMA}),
        SpeculativeConfig(num_draft_tokens=2, adaptive=True, max_draft_tokens=6)))
    out["ngram_penalties"] = _result(speculative_generate(
        model, NgramDrafter(), PASSAGE, P(temperature=0.9, seed=12, max_tokens=30, repetition_penalty=1.1,
                                          no_repeat_ngram_size=4)))
    return out


def strategy_cases(model) -> dict:
    from metagen.decoding import LocalGenerator
    from metagen.sampling import SamplingParams as P
    from metagen.strategies.best_of_n import BestOfNConfig, best_of_n
    from metagen.strategies.self_consistency import SelfConsistencyConfig, self_consistency

    local = LocalGenerator(model)
    return {
        "best_of_n": _strategy(best_of_n(local, QUESTION, BestOfNConfig(n=3, params=P(temperature=0.8, max_tokens=16)),
                                         rng=torch.Generator().manual_seed(1))),
        "self_consistency": _strategy(self_consistency(
            local, "What is 7 + 5? Answer with a number.",
            SelfConsistencyConfig(n=3, params=P(temperature=0.8, max_tokens=20)), rng=torch.Generator().manual_seed(2))),
    }


def engine_cases(model) -> dict:
    from metagen.decoding.prompts import encode_prompt
    from metagen.sampling import SamplingParams as P
    from metagen.serve.engine import DoneEvent, Engine, ServeRequest, TokenEvent
    from metagen.serve.engine_generator import EngineGenerator
    from metagen.strategies.best_of_n import BestOfNConfig, best_of_n

    cases = [
        ("The capital of France is", P(temperature=0, max_tokens=30)),
        (STORY, P(temperature=0.9, top_k=40, seed=1, n=2, max_tokens=25)),
        ("My favourite colour is", P(temperature=0, max_tokens=12, logprobs=2,
                                     structured_outputs={"choice": ["red", "green", "blue"]})),
        ("def add(a, b):", P(temperature=0.7, repetition_penalty=1.2, no_repeat_ngram_size=3, seed=9, max_tokens=30,
                             stop=["\n\n"])),
        ("1, 2, 3,", P(temperature=1.0, min_p=0.1, seed=2, max_tokens=20, n=3, stop=[" 7"])),
        (STORY, P(temperature=1.3, seed=21, max_tokens=14, n=4, stop=[",", "."])),
        ("Has the order been paid? Answer in JSON.", P(temperature=0.8, seed=3, max_tokens=20,
                                                       structured_outputs={"json": SCHEMA})),
    ]
    engine = Engine(model, max_rows=12, max_queue=8)
    requests, events, done = [], [], []
    for prompt, params in cases:  # all queued before the thread starts: admitted in its first step
        got, finished = [], threading.Event()

        def emit(event, got=got, finished=finished):
            got.append(event)
            if isinstance(event, DoneEvent):
                finished.set()

        request = ServeRequest(encode_prompt(model.tokenizer, prompt, chat=False), params, emit)
        engine.submit(request)
        requests.append(request)
        events.append(got)
        done.append(finished)
    engine.start()
    try:
        for finished in done:
            if not finished.wait(600):
                raise RuntimeError("an engine request did not finish within 600 s")
        strategy = best_of_n(EngineGenerator(engine, model, chat=False), STORY,
                             BestOfNConfig(n=3, params=P(temperature=1.0, max_tokens=10, seed=4)))
        stats = {name: getattr(engine.stats, name) for name in ("requests_finished", "prompt_tokens",
                                                                "generated_tokens", "steps", "step_rows",
                                                                "max_batch_rows")}
    finally:
        engine.stop()
    out = {"stats": stats, "best_of_n": _strategy(strategy)}
    for number, (request, got) in enumerate(zip(requests, events)):
        out[f"request_{number}"] = {
            "completions": [_completion(c) for c in request.completions],
            "events": [[e.index, e.text, e.token_id, e.finish_reason] if isinstance(e, TokenEvent)
                       else ["done", e.error] for e in got]}
    return out


GROUPS = {"sampling": sampling_cases, "beam": beam_cases, "speculative": speculative_cases,
          "strategies": strategy_cases, "engine": engine_cases}


def run(groups: list[str]) -> dict:
    from metagen.models import load

    model = load()
    return {group: GROUPS[group](model) for group in groups}


def differences(before, after, path: str = "", added: list[str] | None = None) -> list[str]:
    """Every leaf that differs between two recorded trees, as 'path: before -> after'. A value
    recorded as None (not reported then, as a Cost) or a key not recorded, now present, is not
    a difference: it goes to `added` when given."""
    if isinstance(before, dict) and isinstance(after, dict):
        out = []
        for key in sorted(set(before) | set(after), key=str):
            if key not in after:
                out.append(f"{path}/{key}: missing after")
            elif key not in before:
                if added is not None:
                    added.append(f"{path}/{key}")
            else:
                out += differences(before[key], after[key], f"{path}/{key}", added)
        return out
    if before is None and after is not None:
        if added is not None:
            added.append(path)
        return []
    if isinstance(before, list) and isinstance(after, list):
        if len(before) != len(after):
            return [f"{path}: {len(before)} items -> {len(after)} items: {before!r:.200} -> {after!r:.200}"]
        out = []
        for index, (a, b) in enumerate(zip(before, after)):
            out += differences(a, b, f"{path}[{index}]", added)
        return out
    return [] if before == after else [f"{path}: {before!r:.200} -> {after!r:.200}"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--record", metavar="FILE", help="write the outputs to FILE (JSON)")
    action.add_argument("--compare", metavar="FILE", help="run again and list every difference from FILE")
    parser.add_argument("--groups", default=",".join(GROUPS),
                        help=f"comma-separated subset of {', '.join(GROUPS)} (default: all)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2; keep it equal between runs)")
    args = parser.parse_args(argv)
    groups = [g for g in args.groups.split(",") if g]
    unknown = [g for g in groups if g not in GROUPS]
    if unknown:
        parser.error(f"--groups: {', '.join(unknown)} unknown; choose from {', '.join(GROUPS)}")
    torch.set_num_threads(args.threads)
    outputs = run(groups)
    if args.record:
        with open(args.record, "w") as file:
            json.dump({"threads": args.threads, "outputs": outputs}, file, indent=1, sort_keys=True)
        print(f"recorded {sum(len(v) for v in outputs.values())} cases in {len(groups)} groups to {args.record}")
        return 0
    with open(args.compare) as file:
        recorded = json.load(file)
    if recorded["threads"] != args.threads:
        print(f"note: recorded with {recorded['threads']} threads, run with {args.threads}")
    before = {group: recorded["outputs"].get(group) for group in groups}
    added: list[str] = []
    found = differences(json.loads(json.dumps(before)), json.loads(json.dumps(outputs, sort_keys=True)), added=added)
    for line in found:
        print(line)
    if added:
        print(f"{len(added)} values reported now and not when recorded (not differences): {', '.join(added[:8])}"
              + (" ..." if len(added) > 8 else ""))
    print(f"{len(found)} differences in {sum(len(v) for v in outputs.values())} cases ({', '.join(groups)})")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
