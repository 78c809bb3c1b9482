"""The mixture-of-experts MLP (models/moe.py): routing against a hand computation, tokens grouped
by expert (each chosen expert runs once per forward), several decoding rows routed to different
experts against transformers, transformers' stacked expert layout, GGUF experts quantized in the
file, int8 / int4 experts near fp32, and `metagen info`."""

import json
import math

import numpy as np
import pytest
import torch

from metagen.models import load
from metagen.models.linear import DenseLinear
from metagen.models.moe import moe_mlp, route
from tests.models.families.tiny_checkpoints import build_hf_model, save_hf, write_gguf

PROMPTS = [[17, 2048, 311, 9001, 42], [777, 15, 30000], [123, 4567, 89, 1000, 5, 6], [260, 1345]]


def test_route_takes_the_softmax_top_k_then_renormalises():
    # softmax of log(1..4) is (1, 2, 3, 4)/10: the top 2 are experts 3 and 2 with 0.4 and 0.3.
    logits = torch.log(torch.tensor([[1.0, 2.0, 3.0, 4.0], [4.0, 1.0, 3.0, 2.0]]))
    weights, experts = route(logits, 2, normalize=False)
    assert experts.tolist() == [[3, 2], [0, 2]]
    assert torch.allclose(weights, torch.tensor([[0.4, 0.3], [0.4, 0.3]]), atol=1e-7)
    weights, _ = route(logits, 2, normalize=True)  # 0.4/0.7, 0.3/0.7
    assert torch.allclose(weights, torch.tensor([[4 / 7, 3 / 7], [4 / 7, 3 / 7]]), atol=1e-7)
    weights, experts = route(logits, 1, normalize=True)  # top-1 renormalised is weight 1
    assert experts.tolist() == [[3], [0]] and weights.tolist() == [[1.0], [1.0]]


class _Counting:
    """A linear that records the number of tokens of every call."""

    def __init__(self, weight):
        self.linear, self.calls = DenseLinear(weight), []

    def __call__(self, x):
        self.calls.append(x.shape[0])
        return self.linear(x)


def test_the_mixture_equals_a_hand_computation_and_runs_each_chosen_expert_once():
    """H = 2, three experts of width I = 1 with gate = h_0, up = (e + 1)·h_1 for expert e,
    down = (1, 1)ᵀ; the router's logits are h·W_gᵀ. Per token:
    y = Σ_{e in top-2} w_e · (e + 1) · SiLU(h_0)·h_1 · (1, 1)."""
    router = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, -1.0]])
    layer = type("Layer", (), {})()
    layer.router = DenseLinear(router)
    layer.expert_gate_up = [_Counting(torch.tensor([[1.0, 0.0], [0.0, e + 1.0]])) for e in range(3)]
    layer.expert_down = [_Counting(torch.ones(2, 1)) for _ in range(3)]
    layer.gate_up = layer.down = None  # no shared expert
    h = torch.tensor([[[2.0, 1.0], [0.5, 3.0]], [[-1.0, -2.0], [1.0, 1.5]]])  # (B=2, T=2, H=2)
    out = moe_mlp(layer, h, top_k=2, normalize=True)
    assert out.shape == (2, 2, 2) and out.dtype == torch.float32
    for b in range(2):
        for t in range(2):
            x = h[b, t]
            p = torch.softmax(router @ x, dim=0).tolist()
            chosen = sorted(range(3), key=lambda e: -p[e])[:2]
            total = sum(p[e] for e in chosen)
            silu = x[0].item() / (1 + math.exp(-x[0].item()))
            expected = sum(p[e] / total * (e + 1) * silu * x[1].item() for e in chosen)
            assert out[b, t].tolist() == pytest.approx([expected, expected], rel=1e-6)
    # 4 tokens × 2 experts = 8 assignments; every expert that got any ran exactly once over all of them.
    calls = [expert.calls for expert in layer.expert_gate_up]
    assert all(len(c) <= 1 for c in calls) and sum(sum(c) for c in calls) == 8
    assert [expert.calls for expert in layer.expert_down] == calls


def test_a_shared_expert_adds_its_sigmoid_gated_output_on_every_token():
    """Qwen2-MoE: y += σ(h·w_s) · Down_s(SiLU(Gate_s h) ⊙ Up_s h); with one routed expert that
    outputs zero, y is the shared term alone: σ(h_0 − h_1) · SiLU(h_0)·h_1 · (1, 1)."""
    layer = type("Layer", (), {})()
    layer.router = DenseLinear(torch.zeros(1, 2))
    layer.expert_gate_up, layer.expert_down = [DenseLinear(torch.eye(2))], [DenseLinear(torch.zeros(2, 1))]
    layer.gate_up, layer.down = DenseLinear(torch.eye(2)), DenseLinear(torch.ones(2, 1))
    layer.shared_expert_gate = DenseLinear(torch.tensor([[1.0, -1.0]]))
    h = torch.tensor([[2.0, 1.0], [0.5, 3.0], [-1.0, -2.0]])
    out = moe_mlp(layer, h, top_k=1, normalize=False)
    for x, y in zip(h.tolist(), out.tolist()):
        silu = x[0] / (1 + math.exp(-x[0]))
        expected = silu * x[1] / (1 + math.exp(-(x[0] - x[1])))
        assert y == pytest.approx([expected, expected], rel=1e-6)


@pytest.fixture(scope="module")
def qwen3_moe(tmp_path_factory):
    hf = build_hf_model("qwen3_moe")
    return hf, save_hf(hf, tmp_path_factory.mktemp("qwen3_moe"))


def reference(hf, ids):
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0, -1].float()


@pytest.mark.slow
def test_rows_routed_to_different_experts_decode_like_transformers(qwen3_moe):
    """Four rows of different prompts, a ragged prefill then three decode steps, both paths: each
    row's logits equal transformers' alone (1e-4), while the rows choose different experts."""
    hf, directory = qwen3_moe
    references = {}

    def reference_of(row):
        if tuple(row) not in references:
            references[tuple(row)] = reference(hf, row)
        return references[tuple(row)]

    model = load(directory, dtype="fp32", use_cache=False)
    router = model.layers[1].router
    chosen = []
    model.layers[1].router = lambda x: (chosen.append(route(router(x), 2, True)[1]), router(x))[1]
    for fused in [False, True] if model.kernels is not None else [False]:
        model.use_fused = fused
        cache = model.new_cache(len(PROMPTS))
        rows = [list(prompt) for prompt in PROMPTS]
        out = model.forward(cache, rows)
        for step in range(3):
            for b, row in enumerate(rows):
                assert (out.logits[b] - reference_of(row)).abs().max().item() < 1e-4, (fused, step, b)
            next_tokens = [[int(out.logits[b].argmax())] for b in range(len(rows))]
            for row, token in zip(rows, next_tokens):
                row.extend(token)
            chosen.clear()
            out = model.forward(cache, next_tokens)
            decode_experts = {tuple(sorted(row.tolist())) for row in chosen[0]}
            assert len(decode_experts) > 1  # the rows of one decode step go to different experts


@pytest.mark.slow
def test_parameters_count_every_expert_and_flops_only_the_chosen_ones(qwen3_moe):
    hf, directory = qwen3_moe
    config = load(directory, dtype="fp32", use_cache=False).config
    assert config.num_parameters == sum(p.numel() for p in hf.parameters())
    idle_experts = config.num_hidden_layers * (8 - 2) * 3 * 64 * 32  # (E − k)·3·H·I per layer
    matmuls = config.num_parameters - config.vocab_size * 64  # the embedding is a lookup
    assert config.flops_per_token(0) == 2.0 * (matmuls - idle_experts)


@pytest.mark.slow
def test_transformers_stacked_expert_tensors_load_like_per_expert_ones(qwen3_moe, tmp_path):
    """transformers >= 5 holds a layer's experts as gate_up_proj (E, 2I, H) and down_proj
    (E, H, I); a checkpoint saved with those names loads to the same weights."""
    from safetensors.torch import save_file

    hf, directory = qwen3_moe
    state = {name: tensor.contiguous() for name, tensor in hf.state_dict().items()}
    assert "model.layers.0.mlp.experts.gate_up_proj" in state
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        if (directory / name).exists():
            (tmp_path / name).write_bytes((directory / name).read_bytes())
    save_file(state, str(tmp_path / "model.safetensors"))
    stacked, per_expert = (load(d, dtype="fp32", use_cache=False) for d in (tmp_path, directory))
    for a, b in zip(stacked.linears(), per_expert.linears()):
        assert a[0] == b[0] and torch.equal(a[1].weight, b[1].weight)


@pytest.mark.slow
def test_int8_and_int4_experts_stay_near_fp32(qwen3_moe):
    """Quantized experts run the same routing (the router stays float32). Relative L2 error of
    the logits against fp32 over 11 positions, measured on this tiny model (random N(0, 0.1²)
    weights, where round-to-nearest costs what it costs on the dense families): int8 0.018,
    int4 0.26 (dense Qwen3 of the same shape: 0.023 / 0.21). Bounds: 0.05 and 0.4."""
    _, directory = qwen3_moe
    prompt = PROMPTS[0] + PROMPTS[2]
    exact = load(directory, dtype="fp32", use_cache=False)
    expected = exact.forward(exact.new_cache(1), [prompt], logits="all").logits[0]
    for dtype, bound in (("int8", 0.05), ("int4", 0.4)):
        model = load(directory, dtype=dtype, use_cache=False)
        assert {linear.kind for name, linear in model.linears() if name.startswith("expert")} == {dtype}
        assert model.layers[0].router.kind == "dense" and model.layers[0].router.weight.dtype == torch.float32
        logits = model.forward(model.new_cache(1), [prompt], logits="all").logits[0]
        error = ((logits - expected).norm() / expected.norm()).item()
        assert error < bound, (dtype, error)


@pytest.mark.slow
def test_gguf_experts_quantized_in_the_file_keep_their_blocks(tmp_path):
    """Stacked Q4_0 / Q8_0 expert tensors are split per expert: under auto the Q4_0 experts run as
    the file's own int4 codes (weights = the file's dequantized blocks up to the kernel's bf16
    scales) and Q8_0 as int8; the logits stay as near transformers' as int4 allows (relative L2
    error measured 0.063, bound 0.4 as for int4 re-quantization)."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize, quantize

    from metagen.models.loading import weight_formats

    types = {"ffn_gate_exps": GGMLQuantizationType.Q4_0, "ffn_up_exps": GGMLQuantizationType.Q4_0,
             "ffn_down_exps": GGMLQuantizationType.Q8_0}
    hf = build_hf_model("mixtral")
    model = load(write_gguf(hf, tmp_path / "quantized.gguf", "llama", types), use_cache=False)  # dtype auto
    formats = weight_formats(model)
    assert formats["expert_gate_up"] == {"int4 from Q4_0": 16} and formats["expert_down"] == {"int8g32 from Q8_0": 16}
    assert formats["router"] == {"dense from dense": 2}
    gate_up = hf.model.layers[1].mlp.experts.gate_up_proj.detach().numpy()  # (E, 2I, H)
    for e in (0, 5):
        blocks = dequantize(quantize(np.ascontiguousarray(gate_up[e]), GGMLQuantizationType.Q4_0),
                            GGMLQuantizationType.Q4_0)
        weight = model.layers[1].expert_gate_up[e].dequantize()
        assert torch.allclose(weight, torch.from_numpy(blocks), rtol=1e-2, atol=1e-3)
    prompt = PROMPTS[0] + PROMPTS[2]
    logits = model.forward(model.new_cache(1), [prompt], logits="all").logits[0]
    with torch.no_grad():
        expected = hf(torch.tensor([prompt])).logits[0]
    assert ((logits - expected).norm() / expected.norm()).item() < 0.4


@pytest.mark.slow
def test_info_shows_the_experts(qwen3_moe, capsys, temp_cache):
    from metagen.cli import main

    _, directory = qwen3_moe
    assert main(["info", "--model", str(directory), "--dtype", "int8", "--json"]) == 0
    facts = json.loads(capsys.readouterr().out)
    assert facts["architecture"] == "qwen3_moe"
    assert (facts["experts"], facts["experts_per_token"], facts["expert_intermediate_size"]) == (8, 2, 32)
    assert facts["renormalized_top_k"] is True and facts["shared_expert_intermediate_size"] == 0
    assert facts["weights"]["expert_gate_up"] == {"int8 from dense": 16} and facts["weights"]["router"] == {
        "dense from dense": 2}
