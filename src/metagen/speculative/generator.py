"""Speculative decoding behind the `Generator` interface, and drafters built from a name.

    generator = SpeculativeGenerator(model, make_drafter("ngram", model))
    result = generator.generate(prompt, params)   # same completions' law as LocalGenerator
    result.cost.acceptance_rate, result.cost.block_efficiency

Any meta-generation strategy that takes a `Generator` runs on it unchanged.
"""

from __future__ import annotations

import torch

from metagen.decoding import capabilities as caps
from metagen.decoding.generator import LocalGenerator
from metagen.decoding.prompts import Prompt
from metagen.decoding.result import GenerationResult
from metagen.sampling import SamplingParams
from metagen.speculative.drafters import Drafter, ModelDrafter
from metagen.speculative.ngram import NgramDrafter
from metagen.speculative.self_draft import early_exit_model, quantized_model
from metagen.speculative.loop import SpeculativeConfig, speculative_generate

DRAFTER_KINDS = ("ngram", "early-exit", "quantized", "model:PATH")


class SpeculativeGenerator(LocalGenerator):
    """A `LocalGenerator` that decodes with `drafter` + `config` (see `metagen.speculative.loop`).

    Its completions carry what plain decoding's do (token ids, logprobs, top logprobs, every
    next-token distribution's certainty; stop strings end rows), but it does not hand its model
    out: searches decode their own steps (no LOCAL_CACHE), and value heads, which read the
    model's hidden states, and prompt scoring go through the model, not through `generate`.
    """

    capabilities = LocalGenerator.capabilities - {caps.LOCAL_CACHE, caps.HIDDEN_STATES, caps.PROMPT_SCORING}

    def __init__(self, model, drafter: Drafter, config: SpeculativeConfig | None = None,
                 chat: bool | None = None) -> None:
        super().__init__(model, chat, prompt_cache=False)  # its loop prefills the target and the drafter
        self.drafter = drafter
        self.config = config or SpeculativeConfig()

    def generate(
        self, prompt: Prompt, params: SamplingParams, *, generator: torch.Generator | None = None
    ) -> GenerationResult:
        return speculative_generate(self.model, self.drafter, prompt, params, self.config,
                                    chat=self.chat, generator=generator)


def default_exit_layer(target) -> int:
    """Exit layer used when none is given: two thirds of the depth (20 of SmolLM2's 30)."""
    return max(1, (2 * target.config.num_hidden_layers) // 3)


def make_drafter(
    kind: str,
    target,
    *,
    exit_layer: int | None = None,
    exit_adapter: str | None = None,
    draft_dtype: str = "int4",
    confidence: float | None = None,
) -> Drafter:
    """A drafter from its CLI name: "ngram", "early-exit", "quantized" or "model:PATH".

    exit_layer / exit_adapter: early-exit depth and an optional trained adapter file (its layer
    count wins when given). draft_dtype: weights of "quantized" and "model:PATH" drafters (their
    caches take the target's kv_dtype).
    confidence: model drafters stop a row's draft after a token below this probability.
    """
    if kind == "ngram":
        for name, value in (("exit_layer", exit_layer), ("exit_adapter", exit_adapter), ("confidence", confidence)):
            if value is not None:
                raise ValueError(f"{name}={value!r} does not apply to the ngram drafter")
        return NgramDrafter()
    if kind != "early-exit" and (exit_layer is not None or exit_adapter is not None):
        raise ValueError(f"exit_layer / exit_adapter apply to the early-exit drafter only, not {kind!r}")
    if kind == "early-exit":
        if exit_adapter is not None:
            from metagen.speculative.adapter import AdaptedExitModel, ExitAdapter

            adapter = ExitAdapter.load(exit_adapter, target)
            if exit_layer is not None and exit_layer != adapter.num_layers:
                raise ValueError(f"exit_layer={exit_layer} differs from the adapter's {adapter.num_layers} layers")
            return ModelDrafter(AdaptedExitModel(target, adapter), confidence=confidence, name="early-exit",
                                share_prompt_cache=True)
        layers = default_exit_layer(target) if exit_layer is None else exit_layer
        return ModelDrafter(early_exit_model(target, layers), confidence=confidence, name="early-exit",
                            share_prompt_cache=True)
    if kind == "quantized":  # the target's prompt keys / values serve the copy too (same layout)
        return ModelDrafter(quantized_model(target, draft_dtype), confidence=confidence, name="quantized",
                            share_prompt_cache=True)
    if kind.startswith("model:") and len(kind) > len("model:"):
        from metagen.models import load

        draft = load(kind[len("model:"):], draft_dtype, kv_dtype=target.kv_dtype)
        return ModelDrafter(draft, confidence=confidence, name="model")
    raise ValueError(f"speculative drafter {kind!r} is unknown: choose one of {', '.join(DRAFTER_KINDS)}")
