"""Speculative decoding on the embedded SmolLM2-135M: greedy output equals plain greedy output
token for token for every drafter, sampled output is reproducible and well-formed, the CLI
reports acceptance and block efficiency."""

from __future__ import annotations

import json

import pytest
import torch

from metagen.cli import main
from metagen.decoding import generate
from metagen.sampling import SamplingParams
from metagen.speculative import (
    ModelDrafter,
    NgramDrafter,
    SpeculativeConfig,
    SpeculativeGenerator,
    early_exit_model,
    make_drafter,
    speculative_generate,
)

pytestmark = pytest.mark.slow

PASSAGE = (
    "The lighthouse stood on a rock two miles from the harbour. Every night the keeper climbed "
    "one hundred and twelve steps to light the lamp, and every morning he wrote the weather in "
    "a small green book."
)
PROMPTS = {
    "grounded": [{"role": "user", "content": f"Repeat this passage word for word:\n\n{PASSAGE}"}],
    "open": [{"role": "user", "content": "Give me three tips for learning to play the guitar."}],
}


def first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def logit_gap(model, prompt_ids: list[int], tokens: list[int], position: int) -> str:
    """Top-2 margin of the target's logits at `position` (one full forward) for a failure message."""
    cache = model.new_cache(1)
    logits = model.forward(cache, [prompt_ids + tokens[:position]]).logits[0]
    top = torch.topk(logits, 2)
    return (f"at generated position {position}: top tokens {top.indices.tolist()} logits "
            f"{[round(v, 5) for v in top.values.tolist()]} (gap {float(top.values[0] - top.values[1]):.2e})")


def assert_same_greedy(model, drafter, prompt, config, max_tokens=48, bf16_ties=False):
    """Speculative greedy == plain greedy. With `bf16_ties`, a divergence is allowed only where
    plain decoding's top two logits are within one bf16 step of each other: bf16 / int8 / int4
    models compute the LM head in bf16, so their logits are rounded to 8 significant bits and
    a one-step gap can flip when the verification forward (several tokens at once) and the
    decode step (one token) differ in the last bits of the hidden state."""
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    plain = generate(model, prompt, params)
    spec = speculative_generate(model, drafter, prompt, params, config)
    expected, got = plain.completions[0].token_ids, spec.completions[0].token_ids
    position = first_difference(expected, got)
    if position is not None and bf16_ties and position < len(expected):
        cache = model.new_cache(1)
        logits = model.forward(cache, [plain.prompt_token_ids + expected[:position]]).logits[0]
        top = torch.topk(logits, 2).values
        step = float(torch.finfo(torch.bfloat16).eps) * 2 ** torch.floor(torch.log2(top[0].abs())).item()
        if float(top[0] - top[1]) <= step:
            print(f"bf16 tie flipped {logit_gap(model, plain.prompt_token_ids, expected, position)}")
            return spec
    assert position is None, (
        f"speculative greedy differs from plain greedy; {logit_gap(model, plain.prompt_token_ids, expected, position)}; "
        f"plain chose {expected[position] if position < len(expected) else None}, "
        f"speculative {got[position] if position < len(got) else None}"
    )
    assert spec.completions[0].text == plain.completions[0].text
    return spec


@pytest.mark.parametrize("prompt", sorted(PROMPTS))
@pytest.mark.parametrize("verify", ["token", "block"])
def test_ngram_greedy_equals_plain_greedy(model_fp32, prompt, verify):
    spec = assert_same_greedy(model_fp32, NgramDrafter(), PROMPTS[prompt], SpeculativeConfig(num_draft_tokens=5, verify=verify))
    if prompt == "grounded":  # copying the passage: prompt lookup proposes it
        assert spec.cost.acceptance_rate > 0.5 and spec.cost.block_efficiency > 2.0


@pytest.mark.parametrize("prompt", sorted(PROMPTS))
def test_early_exit_greedy_equals_plain_greedy(model_fp32, prompt):
    assert_same_greedy(model_fp32, ModelDrafter(early_exit_model(model_fp32, 20)), PROMPTS[prompt],
                       SpeculativeConfig(num_draft_tokens=3, adaptive=True))


@pytest.mark.parametrize("prompt", sorted(PROMPTS))
def test_int4_greedy_equals_plain_greedy_up_to_bf16_ties(model, prompt):
    assert_same_greedy(model, ModelDrafter(early_exit_model(model, 20)), PROMPTS[prompt],
                       SpeculativeConfig(num_draft_tokens=3, adaptive=True), bf16_ties=True)
    assert_same_greedy(model, NgramDrafter(), PROMPTS[prompt], SpeculativeConfig(num_draft_tokens=4), bf16_ties=True)


def test_quantized_draft_greedy_equals_fp32_greedy(model_fp32, model):
    # the int4 model is the quantized self-draft of the fp32 target (same checkpoint)
    spec = assert_same_greedy(model_fp32, ModelDrafter(model), PROMPTS["open"], SpeculativeConfig(num_draft_tokens=4))
    assert spec.cost.acceptance_rate > 0.5


def test_batched_sampling_is_reproducible_and_well_formed(model):
    params = SamplingParams(n=3, max_tokens=32, seed=7, top_p=0.9, stop=["\n\n"])
    config = SpeculativeConfig(num_draft_tokens=3, verify="block")
    first = speculative_generate(model, ModelDrafter(early_exit_model(model, 20)), PROMPTS["open"], params, config)
    again = speculative_generate(model, ModelDrafter(early_exit_model(model, 20)), PROMPTS["open"], params, config)
    assert [c.token_ids for c in first.completions] == [c.token_ids for c in again.completions]
    for completion in first.completions:
        assert 1 <= len(completion.token_ids) <= 32
        assert "\n\n" not in completion.text
        assert completion.finish_reason in ("stop", "length")
        assert len(completion.logprobs) == len(completion.token_ids) == len(completion.certainties)
        assert all(lp <= 0 for lp in completion.logprobs)


def test_generator_interface_reports_acceptance(model):
    generator = SpeculativeGenerator(model, NgramDrafter(), SpeculativeConfig(num_draft_tokens=4))
    result = generator.generate(PROMPTS["grounded"], SamplingParams(temperature=0, max_tokens=24))
    assert result.cost.generated_tokens == len(result.completions[0].token_ids)
    assert result.cost.block_efficiency > 1.0
    assert result.cost.target_steps < result.cost.generated_tokens


def test_make_drafter_names_and_errors(model):
    assert isinstance(make_drafter("ngram", model), NgramDrafter)
    assert make_drafter("early-exit", model, exit_layer=12).model.config.num_hidden_layers == 12
    with pytest.raises(ValueError, match="unknown"):
        make_drafter("medusa", model)
    with pytest.raises(ValueError, match="num_layers"):
        make_drafter("early-exit", model, exit_layer=30)
    with pytest.raises(ValueError, match="not cheaper"):
        make_drafter("quantized", model, draft_dtype="int8")  # 8-bit layers cannot draft for an int4 target


def test_cli_json_reports_acceptance_and_block_efficiency(model, capsys):
    argv = ["generate", f"Repeat this passage word for word:\n\n{PASSAGE}", "--temperature", "0",
            "--max-tokens", "24", "--speculative", "ngram", "--num-draft-tokens", "5", "--json"]
    assert main(argv) == 0
    payload = json.loads(capsys.readouterr().out)
    plain = generate(model, [{"role": "user", "content": argv[1]}], SamplingParams(temperature=0, max_tokens=24))
    assert payload["tokens"] == plain.completions[0].token_ids
    info = payload["speculative"]
    assert info["drafter"] == "ngram" and info["num_draft_tokens"] == 5 and info["verify"] == "token"
    assert info["block_efficiency"] == pytest.approx(len(payload["tokens"]) / info["target_steps"], abs=1e-3)
    assert 0 <= info["acceptance_rate"] <= 1


def test_cli_draw_verification_gives_plain_decodings_seeded_tokens_with_mirostat(model, capsys):
    """--verify draw draws each token as plain decoding does: Mirostat is accepted, and one seeded
    row gets plain decoding's tokens while the n-gram drafts save target steps."""
    argv = ["generate", f"Repeat this passage word for word:\n\n{PASSAGE}", "--mirostat-tau", "3", "--seed", "5",
            "--max-tokens", "24", "--speculative", "ngram", "--verify", "draw", "--json"]
    assert main(argv) == 0
    payload = json.loads(capsys.readouterr().out)
    plain = generate(model, [{"role": "user", "content": argv[1]}],
                     SamplingParams(mirostat_tau=3.0, seed=5, max_tokens=24))
    assert payload["tokens"] == plain.completions[0].token_ids
    info = payload["speculative"]
    assert info["verify"] == "draw" and info["accepted_tokens"] > 0
    assert info["target_steps"] < len(payload["tokens"])


@pytest.mark.parametrize(
    "argv, named",
    [
        (["--verify", "block"], "--verify"),
        (["--speculative", "ngram", "--exit-layer", "4"], "exit_layer"),
        (["--speculative", "ngram", "--num-draft-tokens", "0"], "num_draft_tokens"),
        (["--speculative", "ngram", "--mirostat-tau", "3"], "mirostat_tau"),
        (["--speculative", "ngram", "--beam-width", "2"], "--beam-width"),
    ],
)
def test_cli_rejects_bad_speculative_options(capsys, argv, named):
    assert main(["generate", "Hi", *argv]) == 2
    assert named in capsys.readouterr().err


def test_cli_trains_an_exit_adapter_that_make_drafter_loads(model, tmp_path, capsys):
    out = tmp_path / "adapter.safetensors"
    argv = ["train-exit-adapter", "--exit-layer", "12", "--out", str(out), "--tokens-per-prompt", "6", "--steps", "3"]
    assert main(argv) == 0
    assert "exit layer 12" in capsys.readouterr().out
    drafter = make_drafter("early-exit", model, exit_adapter=str(out))
    assert drafter.model.adapter.num_layers == 12
    with pytest.raises(ValueError, match="differs"):
        make_drafter("early-exit", model, exit_adapter=str(out), exit_layer=10)
    assert_same_greedy(model, drafter, PROMPTS["grounded"], SpeculativeConfig(num_draft_tokens=3), max_tokens=16,
                       bf16_ties=True)


@pytest.mark.parametrize("tree", [[], ["--tree-widths", "2,2"]], ids=["chain", "tree"])
def test_cli_strategy_runs_on_the_speculative_generator(capsys, tree):
    argv = ["generate", "What is 2 + 3? Answer with a number.", "--strategy", "self_consistency", "--n", "2",
            "--speculative", "ngram", *tree, "--max-tokens", "16", "--seed", "0", "--json"]
    assert main(argv) == 0
    payload = json.loads(capsys.readouterr().out)
    cost = payload["cost"]
    assert len(payload["candidates"]) == 2
    assert cost["target_steps"] > 0 and cost["draft_tokens"] >= cost["accepted_tokens"] >= 0
    # each step emits τ + 1 tokens, fewer when a row stops inside an accepted draft (EOS, stop string)
    assert cost["target_steps"] <= cost["generated_tokens"] <= cost["accepted_tokens"] + cost["target_steps"]


def test_shared_prompt_cache_gives_an_early_exit_draft_its_own_prefill_would(model):
    prompt = [{"role": "user", "content": f"Summarize:\n\n{PASSAGE}"}]
    params = SamplingParams(temperature=0, max_tokens=24)
    config = SpeculativeConfig(num_draft_tokens=3)
    own = ModelDrafter(early_exit_model(model, 12))
    shared = ModelDrafter(early_exit_model(model, 12), share_prompt_cache=True)
    first = speculative_generate(model, own, prompt, params, config)
    second = speculative_generate(model, shared, prompt, params, config)
    assert second.completions[0].token_ids == first.completions[0].token_ids
    assert (second.cost.draft_tokens, second.cost.accepted_tokens) == (first.cost.draft_tokens, first.cost.accepted_tokens)
    assert second.cost.flops < first.cost.flops  # no draft prefill
    with pytest.raises(ValueError, match="share_prompt_cache"):  # a target cache of another kind
        ModelDrafter(early_exit_model(model, 12), share_prompt_cache=True).start([1, 2, 3], 1, target_cache=object())
    alone = ModelDrafter(early_exit_model(model, 12), share_prompt_cache=True)
    alone.start([1, 2, 3], 1, target_cache=None)  # none given (a served request's copy): it prefills the prompt
    assert alone.prefill_flops > 0 and alone.cache.lengths == [2]


TREE_DRAFTERS = {  # every drafter drafting trees: the tree entry, or tree options on the others
    "tree": {"exit_layer": 20},
    "early-exit+adapter": {"exit_layer": 12, "tree_widths": (3, 1, 1)},
    "quantized": {"draft_dtype": "int8", "tree_widths": (2, 2, 1)},
    "model": {"draft_dtype": "int4", "tree_nodes": 8},
    "ngram": {"tree_widths": (3, 2, 1)},
}


@pytest.mark.parametrize("name", list(TREE_DRAFTERS))
def test_every_tree_drafter_s_greedy_equals_plain_greedy(model_fp32, tmp_path, name):
    """Each drafter given tree options (by `SpeculativeGenerator.by_name`, which then picks the
    multi-draft rule) verified in one target forward with tree attention per step; the early-exit
    draft through an (untrained) exit adapter's tree forward."""
    from metagen.speculative.adapter import ExitAdapter, model_identity

    options = dict(TREE_DRAFTERS[name])
    drafter = name
    if name == "early-exit+adapter":
        drafter, path = "early-exit", tmp_path / "adapter.safetensors"
        ExitAdapter(12, model_identity(model_fp32)).save(path)
        options["exit_adapter"] = str(path)
    elif name == "model":
        drafter = f"model:{model_fp32.source}"
    generator = SpeculativeGenerator.by_name(model_fp32, drafter, **options)
    assert generator.drafter.proposes_trees and generator.config.verify == "multi-draft"
    spec = assert_same_greedy(model_fp32, generator.drafter, PROMPTS["grounded"], generator.config, max_tokens=32)
    cost = spec.cost
    assert cost.block_efficiency > 1.0 and cost.accepted_tokens > 0
    assert cost.draft_tokens > 4 * (cost.target_steps - 1)  # trees: more nodes than a chain of γ = 4 per step


def test_generator_by_name_verifies_the_tree_drafter_with_the_tree_rule(model):
    generator = SpeculativeGenerator.by_name(model, "tree", exit_layer=6, tree_widths=(2, 1), tree_nodes=4)
    assert generator.config.verify == "multi-draft" and generator.drafter.widths == (2, 1)
    result = generator.generate("Count: one two three", SamplingParams(temperature=0, max_tokens=6))
    plain = generate(model, "Count: one two three", SamplingParams(temperature=0, max_tokens=6))
    assert result.completions[0].token_ids == plain.completions[0].token_ids
    assert result.cost.draft_tokens > 0


def test_dyspec_greedy_equals_plain_greedy(model_fp32):
    """The registered DySpec drafter (a dynamic tree from the early-exit draft) under the
    multi-draft rule: plain greedy's tokens, more than one token per target forward."""
    drafter = make_drafter("dyspec", model_fp32, exit_layer=20, tree_nodes=12)
    spec = assert_same_greedy(model_fp32, drafter, PROMPTS["grounded"], SpeculativeConfig(num_draft_tokens=5,
                                                                                         verify="multi-draft"),
                              max_tokens=32)
    assert spec.cost.block_efficiency > 1.0 and spec.cost.accepted_tokens > 0


def test_generator_by_name_runs_spectr_and_dyspec_with_their_rules(model):
    """By name, each tree drafter gets its rule: spectr's i.i.d. tree the spectr rule (sampled
    here, so the rule itself runs on the real model), dyspec the multi-draft rule."""
    spectr = SpeculativeGenerator.by_name(model, "spectr", exit_layer=6, tree_widths=(2, 1), tree_nodes=4)
    assert spectr.config.verify == "spectr" and spectr.drafter.iid_siblings
    sampled = spectr.generate("Count: one two three", SamplingParams(n=2, temperature=1.0, max_tokens=8, seed=0))
    assert all(len(c.token_ids) == 8 or c.finish_reason == "stop" for c in sampled.completions)
    assert sampled.cost.draft_tokens > 0
    dyspec = SpeculativeGenerator.by_name(model, "dyspec", exit_layer=6, tree_nodes=6)
    assert dyspec.config.verify == "multi-draft"
    result = dyspec.generate("Count: one two three", SamplingParams(temperature=0, max_tokens=6))
    plain = generate(model, "Count: one two three", SamplingParams(temperature=0, max_tokens=6))
    assert result.completions[0].token_ids == plain.completions[0].token_ids
