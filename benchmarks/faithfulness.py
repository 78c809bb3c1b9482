"""How far each compute dtype's logits are from the fp32 dequantized checkpoint.

For a few chat prompts (teacher-forced over prompt + a greedy fp32 continuation), reports per
dtype: max |Δlogit|, mean KL(fp32 ‖ dtype) per position, and top-1 agreement with fp32.
Usage: python benchmarks/faithfulness.py [--model PATH] [--dtypes auto,bf16,int8,int4] [--activations int8]
[--markdown]

Per GGUF file type, next to llama.cpp (`--quantize LLAMA_QUANTIZE`): the model is written once as
an F32 GGUF (`llama-quantize --allow-requantize MODEL ref.gguf F32`: the dequantized weights) and
quantized from it to each of `--types` (Q4_K_M, Q5_K_M, Q6_K, Q8_0 by default) by llama.cpp's own
quantizer. The reference is metagen's fp32 forward of ref.gguf; each quantized file is then run by
metagen with its default dtype ("auto") and by llama.cpp (llama-cpp-python, same threads) on the
same token sequences, and both are compared with the reference. llama.cpp's own run of ref.gguf
is the floor (what two fp32 implementations disagree by).

    python benchmarks/faithfulness.py --quantize PATH/llama-quantize [--model PATH] [--types ...]
                                      [--workdir DIR] [--markdown]
"""

from __future__ import annotations

import argparse
from pathlib import Path

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
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--dtypes", default="auto,bf16,int8,int4", help="formats compared with fp32")
    parser.add_argument("--quantize", default=None, help="llama.cpp's llama-quantize: compare per file type")
    parser.add_argument("--types", default="Q4_K_M,Q5_K_M,Q6_K,Q8_0", help="file types (with --quantize)")
    parser.add_argument("--workdir", default="faithfulness-files", help="where the quantized files go")
    parser.add_argument("--activations", default=None, choices=["int16", "int8"],
                        help="metagen kernels' activation codes (load's activations=; default int16)")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(2)
    if args.quantize:
        return per_file_type(args)
    reference = load(args.model, "fp32")
    sequences = reference_sequences(reference)
    ref_logits = [reference.forward(reference.new_cache(1), [ids], logits="all").logits[0] for ids in sequences]
    rows = []
    for dtype in args.dtypes.split(","):
        model = load(args.model, dtype, activations=args.activations)
        logits = [model.forward(model.new_cache(1), [ids], logits="all").logits[0] for ids in sequences]
        rows.append((dtype, *compare(ref_logits, logits)))
    if args.markdown:
        print("| dtype | max abs Δlogit | mean KL(fp32 ‖ dtype) | top-1 agreement |")
        print("|---|---|---|---|")
        for dtype, diff, kl, agreement in rows:
            print(f"| {dtype} | {diff:.3f} | {kl:.5f} | {agreement:.2%} |")
    else:
        for dtype, diff, kl, agreement in rows:
            print(f"{dtype:>5}: max|Δlogit| {diff:.3f}  mean KL {kl:.5f}  top-1 agreement {agreement:.2%}")
    print(f"({sum(len(s) for s in sequences)} positions over {len(PROMPTS)} prompts)")


def reference_sequences(reference) -> list[list[int]]:
    """Prompt + greedy fp32 continuation of each prompt: the positions every format is scored on."""
    sequences = []
    for prompt in PROMPTS:
        result = generate(reference, prompt, SamplingParams(temperature=0, max_tokens=48))
        sequences.append(result.prompt_token_ids + result.completions[0].token_ids)
    return sequences


def compare(ref_logits: list[torch.Tensor], logits: list[torch.Tensor]) -> tuple[float, float, float]:
    """max |Δlogit|, mean KL(ref ‖ other) per position and top-1 agreement over all positions."""
    max_diff, kls, agree, count = 0.0, 0.0, 0, 0
    for ref, other in zip(ref_logits, logits):
        max_diff = max(max_diff, (other - ref).abs().max().item())
        p, q = torch.log_softmax(ref, -1), torch.log_softmax(other, -1)
        kls += (p.exp() * (p - q)).sum(-1).sum().item()
        agree += (ref.argmax(-1) == other.argmax(-1)).sum().item()
        count += ref.shape[0]
    return max_diff, kls / count, agree / count


def llama_cpp_logits(path: Path, sequences: list[list[int]]) -> list[torch.Tensor]:
    """llama.cpp's logits at every position of each sequence (llama-cpp-python, 2 threads)."""
    from llama_cpp import Llama

    engine = Llama(str(path), n_ctx=max(len(ids) for ids in sequences) + 8, n_threads=2, n_threads_batch=2,
                   logits_all=True, verbose=False)
    out = []
    for ids in sequences:
        engine.reset()
        engine.eval(ids)
        out.append(torch.from_numpy(engine.scores[:len(ids)].copy()).float())
    engine.close()
    return out


def per_file_type(args) -> None:
    """The per-file-type table (see the module docstring)."""
    import subprocess
    from metagen.models.embedded import embedded_model_path

    source = Path(args.model) if args.model else embedded_model_path()
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    stem = source.name.removesuffix(".gguf")

    def quantize(inp: Path, out: Path, kind: str, *extra: str) -> Path:
        if not out.exists():
            subprocess.run([args.quantize, *extra, str(inp), str(out), kind], check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return out

    ref_path = quantize(source, workdir / f"{stem}.F32.gguf", "F32", "--allow-requantize")
    reference = load(ref_path, "fp32")
    sequences = reference_sequences(reference)
    ref_logits = [reference.forward(reference.new_cache(1), [ids], logits="all").logits[0] for ids in sequences]
    del reference
    rows = [("F32", "llama.cpp", *compare(ref_logits, llama_cpp_logits(ref_path, sequences)), "")]
    for kind in args.types.split(","):
        path = quantize(ref_path, workdir / f"{stem}.{kind}.gguf", kind)
        model = load(path)  # the default dtype
        formats = describe_formats(model)
        logits = [model.forward(model.new_cache(1), [ids], logits="all").logits[0] for ids in sequences]
        del model
        rows.append((kind, "metagen auto", *compare(ref_logits, logits), formats))
        rows.append((kind, "llama.cpp", *compare(ref_logits, llama_cpp_logits(path, sequences)), ""))
    print(f"{source.name}: each file quantized by llama-quantize from the F32 dequantization; reference: "
          "metagen fp32 on the F32 file")
    if args.markdown:
        print("| file type | engine | max abs Δlogit | mean KL(fp32 ‖ engine) | top-1 agreement | metagen runs it as |")
        print("|---|---|---|---|---|---|")
        for kind, engine, diff, kl, agreement, formats in rows:
            print(f"| {kind} | {engine} | {diff:.3f} | {kl:.5f} | {agreement:.2%} | {formats} |")
    else:
        for kind, engine, diff, kl, agreement, formats in rows:
            print(f"{kind:>7} {engine:>13}: max|Δlogit| {diff:.3f}  mean KL {kl:.5f}  top-1 {agreement:.2%}  {formats}")
    print(f"({sum(len(s) for s in sequences)} positions over {len(PROMPTS)} prompts)")


def describe_formats(model) -> str:
    """What the model's linears run in, summed over layers: "int4 ×84, int8 ×36, head int8"."""
    from metagen.models.loading import weight_formats

    counts: dict[str, int] = {}
    for kinds in weight_formats(model).values():
        for kind, number in kinds.items():
            counts[kind] = counts.get(kind, 0) + number
    return ", ".join(f"{kind} ×{number}" for kind, number in sorted(counts.items()))


if __name__ == "__main__":
    main()
