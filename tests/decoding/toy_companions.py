"""Companion toys for the several-model step: the enumerable toy chain (`toy_model`) with its
logits transformed, their own (made-up) FLOPs, and cache bytes when asked."""

from __future__ import annotations

import torch

from tests.decoding.toy_model import ToyModel, next_logits


class TransformedToy(ToyModel):
    """The toy chain with logits z · scale + bias; FLOPs `base_flops` + context length per token."""

    def __init__(self, name: str, scale: float, bias: list[float], base_flops: float = 10.0,
                 kv_bytes: int = 0) -> None:
        super().__init__()
        self.name, self.scale, self.bias = name, scale, torch.tensor(bias)
        self._base_flops, self._kv_bytes = base_flops, kv_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        return self._kv_bytes

    def flops_per_token(self, context_length: int) -> float:
        return self._base_flops + context_length

    def logits_after(self, context: list[int]) -> torch.Tensor:
        """Its logits (V,) after `context`, float64: the hand reference."""
        return next_logits(context).double() * self.scale + self.bias.double()

    def forward(self, cache, tokens, *, logits="last", hidden=False):
        out = super().forward(cache, tokens, logits=logits, hidden=hidden)
        if out.logits is not None:
            out.logits = out.logits * self.scale + self.bias
        return out
