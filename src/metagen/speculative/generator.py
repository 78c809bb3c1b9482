"""Speculative decoding behind the `Generator` interface.

    generator = SpeculativeGenerator.by_name(model, "ngram")    # a drafter of registry.DRAFTERS
    generator = SpeculativeGenerator(model, NgramDrafter(max_ngram=4), SpeculativeConfig(verify="block"))
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
from metagen.speculative.drafters import Drafter
from metagen.speculative.loop import SpeculativeConfig, speculative_generate
from metagen.speculative.registry import DrafterOptions, check_speculative, make_drafter


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

    @classmethod
    def by_name(cls, model, drafter: str, config: SpeculativeConfig | None = None, chat: bool | None = None,
                **options) -> SpeculativeGenerator:
        """With the drafter registered as `drafter` ("ngram", "early-exit", "model:PATH", "tree",
        "stand", "medusa:PATH", ...; `registry.DRAFTERS`) and its `options` (exit_layer,
        exit_adapter, draft_dtype, confidence, tree_widths, tree_nodes, draft_corpus, stop_head,
        stop_threshold: those its entry reads; a tree option makes it draft token trees),
        drafting for `model`; `config` None: the defaults with the rule
        `registry.check_speculative` picks (the entry's own; multi-draft for trees from a chain
        drafter). A chain-only rule in `config` with tree drafts is refused before any model loads."""
        _, verify = check_speculative(drafter, DrafterOptions(**options), None if config is None else config.verify)
        if config is None:
            config = SpeculativeConfig(verify=verify)
        return cls(model, make_drafter(drafter, model, **options), config, chat)

    def generate(
        self, prompt: Prompt, params: SamplingParams, *, generator: torch.Generator | None = None
    ) -> GenerationResult:
        return speculative_generate(self.model, self.drafter, prompt, params, self.config,
                                    chat=self.chat, generator=generator)
