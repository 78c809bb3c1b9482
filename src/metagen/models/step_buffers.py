"""Reused intermediates of a decode step: one buffer per name and step size, per thread.

A decode step of N queries writes every layer's q, attention output, each linear's output and
the normalised stream into the same memory, so the layer loop allocates nothing after the first
step of that size (`FusedOps` asks for them by name).
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import torch


class StepBuffers:
    """The intermediates of a decode step of N queries (a linear's output, q, attention, the
    normalised stream), one reused buffer per name: a step writes each layer's into the same
    memory, so the layer loop allocates nothing after the first step of that size. A buffer is
    overwritten by the next layer (or step) that uses its name; only the residual stream and the
    logits, which a step returns, are fresh tensors."""

    def __init__(self) -> None:
        self._buffers: dict[str, torch.Tensor] = {}

    def get(self, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        buffer = self._buffers.get(name)
        if buffer is None or buffer.shape != shape or buffer.dtype != dtype:
            buffer = self._buffers[name] = torch.empty(shape, dtype=dtype)
        return buffer


class StepBufferSets(threading.local):
    """A model's `StepBuffers` per step size N, per thread (two threads decoding on one model
    must not share buffers); the MAX_SIZES most recently used sizes are kept."""

    MAX_SIZES = 8

    def __init__(self) -> None:
        self.sets: OrderedDict[int, StepBuffers] = OrderedDict()

    def get(self, queries: int) -> StepBuffers:
        buffers = self.sets.pop(queries, None) or StepBuffers()
        self.sets[queries] = buffers  # most recent last
        while len(self.sets) > self.MAX_SIZES:
            self.sets.popitem(last=False)
        return buffers
