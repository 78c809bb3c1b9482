"""The sequence-level `Generator` interface that meta-generation strategies talk to.

    generator.generate(prompt, params) -> GenerationResult   # params.n completions + Cost

A strategy never touches a model or a cache: the local backend (`LocalGenerator`) prefills the
prompt once, forks the cache into n rows and decodes them as one batch;
`metagen.remote.OpenAIGenerator` implements the same method over OpenAI-compatible servers
(completions with token ids where known, logprobs, finish reasons, and a Cost built from the
server's usage counts).
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod

import torch

from metagen.decoding.cost import Cost, forward_flops
from metagen.decoding.prompts import Prompt
from metagen.decoding.sample_loop import GenerationResult, generate
from metagen.sampling import SamplingParams


class Generator(ABC):
    """prompt + SamplingParams -> `params.n` completions with a `Cost`."""

    @abstractmethod
    def generate(
        self, prompt: Prompt, params: SamplingParams, *, generator: torch.Generator | None = None
    ) -> GenerationResult:
        """Completions of `prompt`; `result.cost` counts what producing them spent."""

    def decode(self, token_ids: list[int]) -> str:
        """The text of token ids (used by judges reading top logprobs); backends that know
        their tokenizer override it."""
        raise NotImplementedError(f"{type(self).__name__} cannot decode token ids")


class LocalGenerator(Generator):
    """A `Generator` over a local `LanguageModel` (one prefill, n forked rows, one batch).

    chat: wrap text prompts in the model's chat template (None: when the model has one).
    """

    def __init__(self, model, chat: bool | None = None) -> None:
        self.model = model
        self.chat = chat

    def decode(self, token_ids: list[int]) -> str:
        return self.model.tokenizer.decode(list(token_ids))

    def generate(
        self, prompt: Prompt, params: SamplingParams, *, generator: torch.Generator | None = None
    ) -> GenerationResult:
        start = time.perf_counter()
        result = generate(self.model, prompt, params, chat=self.chat, generator=generator)
        prompt_length = len(result.prompt_token_ids)
        flops = forward_flops(self.model, 0, prompt_length)
        for completion in result.completions:
            # every sampled token but the last is fed back through the model
            flops += forward_flops(self.model, prompt_length, max(len(completion.token_ids) - 1, 0))
        result.cost = Cost(
            model_calls=result.model_calls,
            prompt_tokens_computed=prompt_length,
            prompt_tokens_reused=prompt_length * (len(result.completions) - 1),
            generated_tokens=result.generated_tokens,
            flops=flops,
            wall_seconds=time.perf_counter() - start,
            target_steps=result.generated_tokens,  # one target forward per token and row
        )
        return result
