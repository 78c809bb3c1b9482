"""Decode tokens/s of the transformers adapter next to the native backend, both fp32.

Rows of different prompt lengths (one prompt cut at `rows` different places) are prefilled in
one ragged forward, then every row decodes `steps` greedy tokens, one forward per step for all
rows. Prints tokens/s of the decode steps (prefill excluded) for each backend and their ratio.

    python benchmarks/transformers_adapter.py --rows 8 --steps 64
"""

from __future__ import annotations

import argparse
import time

import torch


def decode_rate(model, prompts: list[list[int]], steps: int) -> float:
    """Greedy-decode `steps` tokens in every row after one ragged prefill; decode tokens/s."""
    cache = model.new_cache(len(prompts))
    logits = model.forward(cache, prompts).logits  # (B, V)
    start = time.perf_counter()
    for _ in range(steps):
        next_ids = logits.argmax(-1)  # (B,)
        logits = model.forward(cache, next_ids[:, None]).logits
    return len(prompts) * steps / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    import transformers

    from metagen.models import TransformersModel, embedded_model_path, load

    transformers.logging.set_verbosity_error()
    path = embedded_model_path()
    native = load(dtype="fp32")
    adapter = TransformersModel.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    text = ("The history of mathematics spans thousands of years, from counting marks on bones to modern "
            "proofs checked by computers. Early civilizations in Mesopotamia and Egypt used arithmetic.")
    ids = native.tokenizer.encode(text)
    prompts = [ids[: 12 + 3 * row] for row in range(args.rows)]
    rates = {}
    for name, model in (("native fp32", native), ("transformers adapter fp32", adapter)):
        decode_rate(model, prompts, 4)  # warm-up
        rates[name] = decode_rate(model, prompts, args.steps)
        print(f"{name:28s} {args.rows} rows x {args.steps} steps: {rates[name]:8.1f} tok/s")
    print(f"adapter / native: {rates['transformers adapter fp32'] / rates['native fp32']:.2f}")


if __name__ == "__main__":
    main()
