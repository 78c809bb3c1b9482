"""`StopRules`: what ends the rows of one request — stop token ids (EOS unless `ignore_eos`), stop
strings (OpenAI `stop`) and the most tokens a row may hold (max_tokens, bounded by the context left
after the prompt). Built once per request; `rows.Row.push` applies them token by token."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from metagen.sampling import SamplingParams


@dataclass(frozen=True)
class StopRules:
    """What ends a row of one request: stop token ids (EOS included unless ignored), stop strings,
    and the most tokens a row may hold (max_tokens, bounded by the context left after the prompt)."""

    stop_token_ids: frozenset[int]
    stop_strings: tuple[str, ...]
    max_new_tokens: int

    @classmethod
    def create(cls, model, prompt_length: int, *, max_tokens: int, stop: Sequence[str] = (),
               stop_token_ids: Sequence[int] = (), ignore_eos: bool = False) -> StopRules:
        """Rules for a prompt of `prompt_length` tokens. ValueError when the prompt leaves no room
        in the model's context, or for a stop token id outside the vocabulary (it could never stop
        anything)."""
        if prompt_length >= model.max_context:
            raise ValueError(f"prompt has {prompt_length} tokens, the model's context is {model.max_context}: "
                             "no room to generate")
        for token_id in stop_token_ids:
            if token_id >= model.vocab_size:
                raise ValueError(f"stop_token_ids entry {token_id} is out of range for vocab size {model.vocab_size}")
        ids = frozenset(stop_token_ids) | (frozenset() if ignore_eos else frozenset(model.eos_token_ids))
        return cls(ids, tuple(stop), min(max_tokens, model.max_context - prompt_length))

    @classmethod
    def from_params(cls, params: SamplingParams, model, prompt_length: int) -> StopRules:
        return cls.create(model, prompt_length, max_tokens=params.max_tokens, stop=params.stop,
                          stop_token_ids=params.stop_token_ids, ignore_eos=params.ignore_eos)
