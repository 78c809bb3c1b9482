"""RoPE frequencies (Su et al. 2021) with the checkpoint's scaling; unsupported scalings refused.

Scaling kinds: "linear" (Chen et al. 2023, position interpolation) divides every frequency by
`factor`; "llama3" (Llama 3.1) divides low frequencies by `factor`, keeps high ones and
interpolates the band between; GGUF's `rope_freqs` tensor gives per-frequency divisors directly.
Other kinds (yarn, longrope, dynamic NTK, ...) change the attention temperature or depend on the
sequence length; they are refused by name when the checkpoint is read (`check_rope_scaling`).
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch

SUPPORTED_ROPE_SCALING = ("default", "linear", "llama3")


def rope_scaling_kind(scaling: dict | None) -> str:
    scaling = scaling or {}
    return scaling.get("rope_type", scaling.get("type")) or "default"


def check_rope_scaling(scaling: dict | None, where: str) -> None:
    """NotImplementedError naming the rope scaling kind when the backend does not implement it."""
    kind = rope_scaling_kind(scaling)
    if kind not in SUPPORTED_ROPE_SCALING:
        raise NotImplementedError(
            f"{where}: rope_scaling type {kind!r} is not supported by the native backend (supported: "
            f"{', '.join(SUPPORTED_ROPE_SCALING)}); load it with metagen.models.TransformersModel instead"
        )


def rope_frequencies(config, freq_factors: torch.Tensor | None = None) -> torch.Tensor:
    """Inverse frequencies θ^(−2i/D), i < D/2, with the checkpoint's scaling. Returns (D/2,)."""
    dim = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    if freq_factors is not None:
        return (inv_freq / freq_factors.double()).float()
    scaling = config.rope_scaling or {}
    kind = rope_scaling_kind(scaling)
    check_rope_scaling(scaling, config.name or config.architecture)
    if kind == "linear":
        inv_freq = inv_freq / scaling["factor"]
    elif kind == "llama3":
        factor = scaling["factor"]
        low, high = scaling.get("low_freq_factor", 1.0), scaling.get("high_freq_factor", 4.0)
        original = scaling["original_max_position_embeddings"]
        wavelength = 2 * math.pi / inv_freq
        smooth = (original / wavelength - low) / (high - low)
        scaled = torch.where(wavelength > original / low, inv_freq / factor, inv_freq)
        middle = (wavelength <= original / low) & (wavelength >= original / high)
        inv_freq = torch.where(middle, (1 - smooth) * inv_freq / factor + smooth * inv_freq, scaled)
    return inv_freq.float()


def rope_tables(inv_freq: torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """e^{i·pos·θ} for pos < length: (T, D/2) complex64, and its cos and sin (T, D/2) float32."""
    angles = torch.outer(torch.arange(length, dtype=torch.float64), inv_freq.double())
    rotation = torch.polar(torch.ones_like(angles), angles).to(torch.complex64)
    return rotation, rotation.real.contiguous(), rotation.imag.contiguous()


class RopeTables:
    """A model's RoPE tables for positions < `length`, grown on demand (doubling): `rotation`
    (T, D/2) complex64 for the general path and its `cos` / `sin` (T, D/2) float32 for the fused
    kernels; `local_rotation`, `local_cos`, `local_sin` the same for sliding-window layers with
    their own base (Gemma 3's rope_local_theta, unscaled), else the global ones."""

    def __init__(self, config, freq_factors: torch.Tensor | None, local: bool) -> None:
        self.config, self.freq_factors, self.local = config, freq_factors, local
        self.length = 0
        self.rotation = torch.zeros(0, dtype=torch.complex64)
        self.cos = self.sin = torch.zeros(0)
        self.local_rotation, self.local_cos, self.local_sin = self.rotation, self.cos, self.sin

    def ensure(self, length: int) -> None:
        """Tables for positions < length (at least), at least twice the previous length."""
        if length <= self.length:
            return
        length = max(length, 2 * self.length)
        self.rotation, self.cos, self.sin = rope_tables(rope_frequencies(self.config, self.freq_factors), length)
        self.local_rotation, self.local_cos, self.local_sin = self.rotation, self.cos, self.sin
        if self.local:
            local = replace(self.config, rope_theta=self.config.rope_local_theta, rope_scaling=None)
            self.local_rotation, self.local_cos, self.local_sin = rope_tables(rope_frequencies(local), length)
        self.length = length
