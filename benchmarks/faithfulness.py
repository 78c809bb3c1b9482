"""How far each compute dtype's logits are from the fp32 dequantized checkpoint.

For a few chat prompts (teacher-forced over prompt + a greedy fp32 continuation), reports per
dtype: max |Δlogit|, mean KL(fp32 ‖ dtype) per position, and top-1 agreement with fp32.
Usage: python benchmarks/faithfulness.py [--model PATH] [--dtypes auto,bf16,int8,int4] [--markdown]
"""

from __future__ import annotations

import argparse

import torch

from metagen.decoding import generate
from metagen.models import load
from metagen.sampling import SamplingParams

PROMPTS = [
    "What is the capital of France?",
    "Write a short poem about the sea.",
    "Explain what a hash table is to a beginner.",
    "Solve: 12 * 7 + 5 = ?",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default=None)
    parser.add_argument("--dtypes", default="auto,bf16,int8,int4", help="formats compared with fp32")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(2)
    reference = load(args.model, "fp32")
    sequences = []
    for prompt in PROMPTS:
        result = generate(reference, prompt, SamplingParams(temperature=0, max_tokens=48))
        sequences.append(result.prompt_token_ids + result.completions[0].token_ids)
    ref_logits = [reference.forward(reference.new_cache(1), [ids], logits="all").logits[0] for ids in sequences]
    rows = []
    for dtype in args.dtypes.split(","):
        model = load(args.model, dtype)
        max_diff, kls, agree, count = 0.0, 0.0, 0, 0
        for ids, ref in zip(sequences, ref_logits):
            logits = model.forward(model.new_cache(1), [ids], logits="all").logits[0]
            max_diff = max(max_diff, (logits - ref).abs().max().item())
            p, q = torch.log_softmax(ref, -1), torch.log_softmax(logits, -1)
            kls += (p.exp() * (p - q)).sum(-1).sum().item()
            agree += (ref.argmax(-1) == logits.argmax(-1)).sum().item()
            count += len(ids)
        rows.append((dtype, max_diff, kls / count, agree / count))
    if args.markdown:
        print("| dtype | max abs Δlogit | mean KL(fp32 ‖ dtype) | top-1 agreement |")
        print("|---|---|---|---|")
        for dtype, diff, kl, agreement in rows:
            print(f"| {dtype} | {diff:.3f} | {kl:.5f} | {agreement:.2%} |")
    else:
        for dtype, diff, kl, agreement in rows:
            print(f"{dtype:>5}: max|Δlogit| {diff:.3f}  mean KL {kl:.5f}  top-1 agreement {agreement:.2%}")
    print(f"({sum(len(s) for s in sequences)} positions over {len(PROMPTS)} prompts)")


if __name__ == "__main__":
    main()
