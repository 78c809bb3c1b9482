"""A whole (tiny) model compressed through its own forward, saved and loaded back."""

import json

import pytest
import torch

from metagen.compress.calibrate import Recipe, compress_model, compress_weight, fused_parts
from metagen.models import load
from metagen.models.conversion_cache import save_model
from metagen.models.linear import DenseLinear, Int4Linear, Int8Linear

LINEAR_FIELDS = ("qkv", "o", "gate_up", "down")  # a dense layer's linears, in forward order


@pytest.fixture
def tiny(tiny_checkpoint):
    return load(tiny_checkpoint, "fp32", use_cache=False)


def _rows(seed: int = 0, count: int = 4, length: int = 48):
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 49152, (count, length), generator=generator).tolist()


def _logits(model, ids):
    cache = model.new_cache(1)
    return model.forward(cache, [ids], logits="all").logits[0]


def test_layer_by_layer_equals_the_forward(tiny):
    rows = _rows(1, count=2)
    cache = tiny.new_cache(2)
    for step in tiny.layer_by_layer(cache, rows):
        out = step(tiny.layers[step.index])
    expected, _, _, _ = tiny._run_layers(tiny.new_cache(2), rows)
    assert torch.allclose(out, expected, atol=1e-5)


def test_a_step_left_unrun_is_an_error(tiny):
    steps = tiny.layer_by_layer(tiny.new_cache(1), _rows(count=1))
    next(steps)
    with pytest.raises(RuntimeError, match="layer 0 was never run"):
        next(steps)


def test_gptq_int4_runs_on_the_int4_kernel_and_matches_its_dequantized_weights(tiny):
    calls = []
    model, facts = compress_model(tiny, Recipe("gptq", bits=4), _rows(), progress=lambda *a: calls.append(a))
    assert calls == [(1, 2), (2, 2)] and facts["calibration_tokens"] == 4 * 48
    assert model.dtype == "int4" and isinstance(model.lm_head, Int8Linear)
    assert all(isinstance(getattr(layer, name), Int4Linear) for layer in model.layers for name in LINEAR_FIELDS)
    # one layer by hand: (q − 8)·scale + zero from the stored codes equals what the kernel computes
    linear = model.layers[0].qkv
    x = torch.randn(3, linear.in_features).to(torch.bfloat16)
    weight = linear.dequantize()
    assert torch.allclose(linear(x).float(), x.float() @ weight.t(), atol=2e-2, rtol=2e-2)
    # the whole model against a reference whose linears are the dequantized weights in bf16
    reference = load(tiny.source, "bf16", use_cache=False)
    for ref_layer, layer in zip(reference.layers, model.layers):
        for name in LINEAR_FIELDS:
            setattr(ref_layer, name, DenseLinear(getattr(layer, name).dequantize().to(torch.bfloat16)))
    reference.lm_head = model.lm_head
    ids = _rows(5, count=1, length=20)[0]
    assert torch.allclose(_logits(model, ids), _logits(reference, ids), atol=5e-2)


def test_gptq_beats_rtn_on_the_model_layer_error(tiny):
    rows = _rows(2, count=8, length=64)
    ids = _rows(6, count=1, length=64)[0]
    dense = _logits(tiny, ids)
    gptq, _ = compress_model(tiny, Recipe("gptq", bits=3), rows)
    rtn, _ = compress_model(tiny, Recipe("rtn", bits=3))
    assert (_logits(gptq, ids) - dense).square().mean() < (_logits(rtn, ids) - dense).square().mean()


def test_sparse_models_are_dense_with_exact_zeros(tiny):
    model, _ = compress_model(tiny, Recipe("sparsegpt", n_m=(2, 4)), _rows())
    assert model.dtype == "fp32"
    for layer in model.layers:
        for name in LINEAR_FIELDS:
            weight = getattr(layer, name).weight
            assert ((weight != 0).view(weight.shape[0], -1, 4).sum(-1) == 2).all()
    half, _ = compress_model(tiny, Recipe("magnitude", sparsity=0.5, dtype="bf16"))
    assert half.dtype == "bf16" and float((half.layers[0].down.weight == 0).float().mean()) == 0.5
    structured, _ = compress_model(tiny, Recipe("magnitude", n_m=(2, 4)))
    weight = structured.layers[1].gate_up.weight
    assert ((weight != 0).view(weight.shape[0], -1, 4).sum(-1) == 2).all()


def test_unstructured_pruning_thresholds_each_fused_projection_as_a_separate_linear():
    generator = torch.Generator().manual_seed(0)
    # q rows 10x larger than k and v: one threshold over the fused rows prunes k and v almost whole
    weight = torch.randn(64, 32, generator=generator) * torch.cat([torch.full((32, 1), 10.0), torch.ones(32, 1)])
    mix = torch.randn(32, 32, generator=generator)
    x = mix @ torch.randn(32, 256, generator=generator)  # correlated inputs (K, tokens)
    hessian = 2 * x @ x.t()
    parts = (32, 16, 16)
    for recipe in (Recipe("magnitude", sparsity=0.5), Recipe("sparsegpt", sparsity=0.5),
                   Recipe("sparsegpt", sparsity=0.5, bits=4)):
        result = compress_weight(weight, hessian, recipe, parts)
        expected = [compress_weight(piece, hessian, recipe) for piece in weight.split(parts)]
        assert torch.equal(result.weight, torch.cat([e.weight for e in expected]))
        assert [float(m.float().mean()) for m in result.mask.split(parts)] == [0.5, 0.5, 0.5]
        if recipe.bits:
            assert torch.equal(result.grid.scale, torch.cat([e.grid.scale for e in expected]))
            assert torch.equal(result.grid.zero, torch.cat([e.grid.zero for e in expected]))
        fused = compress_weight(weight, hessian, recipe)
        assert float(fused.mask[32:].float().mean()) > 0.8  # what one threshold over q, k, v does
    # row-separable methods: the parts on their own give the whole linear's result
    for recipe in (Recipe("gptq", bits=4), Recipe("magnitude", n_m=(2, 4)), Recipe("rtn", bits=3, clip=True)):
        whole = compress_weight(weight, hessian, recipe, parts).weight
        pieces = torch.cat([compress_weight(piece, hessian, recipe).weight for piece in weight.split(parts)])
        assert torch.allclose(whole, pieces, atol=1e-5)
    with pytest.raises(ValueError, match=r"parts=\(32, 16\) do not sum to the weight's 64 rows"):
        compress_weight(weight, hessian, Recipe("magnitude", sparsity=0.5), (32, 16))


def test_a_whole_model_prunes_q_k_v_and_gate_up_each_to_the_sparsity(tiny):
    assert fused_parts(tiny.config, "qkv", 64) == (32, 16, 16)  # 4 heads, 2 kv heads of 8
    assert fused_parts(tiny.config, "gate_up", 128) == (64, 64) and fused_parts(tiny.config, "o", 32) is None
    for model in (compress_model(tiny, Recipe("magnitude", sparsity=0.5))[0],
                  compress_model(tiny, Recipe("sparsegpt", sparsity=0.5), _rows())[0]):
        for layer in model.layers:
            for name, parts in (("qkv", (32, 16, 16)), ("gate_up", (64, 64)), ("o", (32,)), ("down", (32,))):
                zeros = (getattr(layer, name).weight == 0).split(list(parts))
                assert [float(z.float().mean()) for z in zeros] == [0.5] * len(parts), name


def test_int8_and_int3_formats(tiny):
    int8, _ = compress_model(tiny, Recipe("gptq", bits=8), _rows())
    assert isinstance(int8.layers[0].o, Int8Linear) and int8.dtype == "int8"
    int3, _ = compress_model(tiny, Recipe("rtn", bits=3, clip=True))
    codes = int3.layers[0].o  # 3-bit codes in the int4 layout
    assert isinstance(codes, Int4Linear)


def test_saved_model_loads_back_identically(tiny, tmp_path):
    model, facts = compress_model(tiny, Recipe("gptq", bits=4), _rows())
    out = tmp_path / "gptq"
    save_model(model, out, {"recipe": Recipe("gptq", bits=4).to_dict(), **facts})
    recipe = json.loads((out / "recipe.json").read_text())
    assert recipe["recipe"]["method"] == "gptq" and recipe["dtype"] == "int4"
    loaded = load(out)
    ids = _rows(3, count=1, length=16)[0]
    assert torch.equal(_logits(loaded, ids), _logits(model, ids))
    with pytest.raises(ValueError, match="dtype='fp32' cannot be applied to the saved model"):
        load(out, "fp32")
    (out / "weights.safetensors").write_bytes(b"damaged")
    with pytest.raises(ValueError, match="is damaged"):
        load(out)


def test_save_refuses_a_foreign_directory(tiny, tmp_path):
    (tmp_path / "mine.txt").write_text("keep me")
    model, _ = compress_model(tiny, Recipe("rtn", bits=4))
    with pytest.raises(ValueError, match="not a saved model"):
        save_model(model, tmp_path, {})
    assert (tmp_path / "mine.txt").read_text() == "keep me"


@pytest.mark.parametrize("kwargs,message", [
    ({"method": "gptq"}, "give bits"),
    ({"method": "gptq", "bits": 4, "sparsity": 0.5}, "does not prune"),
    ({"method": "sparsegpt"}, "give sparsity"),
    ({"method": "obc", "bits": 4, "sparsity": 0.5}, "not both"),
    ({"method": "rtn", "bits": 5}, "bits=5"),
    ({"method": "magnitude", "sparsity": 0.5, "n_m": (2, 4)}, "either sparsity or n_m"),
    ({"method": "pca"}, "method='pca'"),
    ({"method": "magnitude", "sparsity": 0.5, "clip": True}, "clip"),
])
def test_recipe_refusals(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Recipe(**kwargs)


def test_calibration_is_required_exactly_when_used(tiny):
    with pytest.raises(ValueError, match="needs calibration"):
        compress_model(tiny, Recipe("gptq", bits=4))
    with pytest.raises(ValueError, match="data-free"):
        compress_model(tiny, Recipe("rtn", bits=4), _rows())


def test_obc_prunes_and_quantizes_whole_models(tiny):
    pruned, _ = compress_model(tiny, Recipe("obc", sparsity=0.25), _rows())
    for layer in pruned.layers:
        for name in LINEAR_FIELDS:
            weight = getattr(layer, name).weight
            assert ((weight == 0).sum(1) == weight.shape[1] // 4).all()  # OBC prunes per row
    quantized, _ = compress_model(tiny, Recipe("obc", bits=4), _rows())
    assert isinstance(quantized.layers[1].down, Int4Linear)


class _Passthrough:
    """A linear that keeps every input it sees, then runs the real one."""

    def __init__(self, linear) -> None:
        self.linear, self.inputs = linear, []

    def __getattr__(self, name):
        return getattr(self.linear, name)

    def __call__(self, x, out=None):
        self.inputs.append(x.detach().reshape(-1, x.shape[-1]).double())
        return self.linear(x, out)


def test_layer_hessians_are_2xxt_of_each_linears_inputs_in_the_dense_forward(tiny):
    from dataclasses import replace

    from metagen.compress.calibrate import layer_hessians
    from metagen.models.decoder import DecoderModel

    rows = _rows(3, count=2, length=40)
    hessians = layer_hessians(tiny, rows, 1)
    assert set(hessians) == set(LINEAR_FIELDS)
    layers = list(tiny.layers)
    spies = {name: _Passthrough(getattr(layers[1], name)) for name in LINEAR_FIELDS}
    layers[1] = replace(layers[1], **spies)
    spied = DecoderModel(tiny.config, layers, tiny.embed, tiny.norm, tiny.lm_head, tiny.tokenizer, "fp32",
                         tiny.freq_factors, source=tiny.source)
    spied.use_fused = False  # the general path, as calibration runs
    spied.forward(spied.new_cache(2), rows, logits="last")
    for name, spy in spies.items():
        x = torch.cat(spy.inputs)
        assert x.shape[0] == 2 * 40
        assert torch.allclose(hessians[name], 2.0 * x.t() @ x / x.shape[0], rtol=1e-5, atol=1e-7), name
    # layer 0's differ (other inputs), and a bad index is refused by name
    assert not torch.allclose(layer_hessians(tiny, rows, 0)["qkv"], hessians["qkv"])
    with pytest.raises(ValueError, match="index=2 is out of range"):
        layer_hessians(tiny, rows, 2)
