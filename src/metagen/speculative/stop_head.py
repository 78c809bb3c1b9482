"""SpecDec++ (Huang et al. 2024): a learned stopping rule for chain drafts.

A small head reads, for each draft token x_i, the draft model's hidden state h_i (H,) — the one
its next-token logits z_i (V,) were read from — and two features of its raw distribution
p_i = softmax(z_i): log p_i(x_i) and the entropy H(p_i). It predicts r_i, the probability that
the target rejects x_i (given the earlier tokens were kept):

    f_i  = [h_i, log p_i(x_i), H(p_i)]                                  (H + 2,)
    r_i  = σ(w · f_i + b)                                               # logistic regression
    r_i  = σ(w₂ · SiLU(W₁ f_i + b₁) + b₂)                               # hidden_units = M

The draft stops after token k, the first whose predicted probability that at least one token so
far is rejected passes the threshold h (the paper's rule, its eq. for the stopping time):

    1 − Π_{i ≤ k} (1 − r_i) > h

Verification is unchanged, so the output distribution is the target's whatever the head says;
the head only decides how many tokens the target checks. Training: `stop_training.py`. Cost per
draft token: 2·(H + 2) FLOPs (linear) or 2·M·(H + 3) (MLP), next to the draft's forward.
"""

from __future__ import annotations

import os

import torch
from torch import Tensor

from metagen.speculative.adapter import check_identity, load_tensors, model_identity, save_tensors

__all__ = ["EXTRA_FEATURES", "StopHead", "stop_features", "stop_probability", "stops"]

EXTRA_FEATURES = 2  # log p(x), entropy of p
_FORMAT = "metagen.stop_head/1"


def stop_features(hidden: Tensor, logits: Tensor, tokens: Tensor) -> Tensor:
    """f = [h, log p(x), H(p)] per row: hidden (N, H), logits (N, V) the draft's raw logits read
    from h, tokens (N,) the drafted tokens -> (N, H + 2) float32. Entropy over tokens with p > 0."""
    log_p = torch.log_softmax(logits.float(), dim=-1)  # (N, V)
    chosen = log_p.gather(1, tokens.long().view(-1, 1))  # (N, 1)
    entropy = -(log_p.exp() * torch.nan_to_num(log_p, neginf=0.0)).sum(-1, keepdim=True)  # (N, 1)
    return torch.cat([hidden.float().reshape(len(tokens), -1), chosen.clamp(min=-100.0), entropy], dim=1)


def stop_probability(rejects: Tensor) -> Tensor:
    """1 − Π_{i ≤ k}(1 − r_i) for every prefix k: rejects (..., T) -> (..., T), nondecreasing in k."""
    return 1.0 - torch.cumprod(1.0 - rejects, dim=-1)


def stops(survival: Tensor, rejects: Tensor, threshold: float) -> tuple[Tensor, Tensor]:
    """One drafting step of the stop rule for B rows: survival (B,) = Π(1 − r_i) over each row's
    tokens so far, rejects (B,) this token's r. Returns (new survival (B,), stop (B,) bool: the
    row's draft ends after this token, 1 − survival > threshold)."""
    survival = survival * (1.0 - rejects)
    return survival, (1.0 - survival) > threshold


class StopHead:
    """r = σ(w · f + b), or with `hidden_units` = M: σ(w₂ · SiLU(W₁ f + b₁) + b₂).

    input_size: F = H + EXTRA_FEATURES. Features are standardised with the training set's mean
    and scale (stored: `mean`, `scale` (F,)). Parameters: linear weight (F,), bias (); MLP
    w1 (M, F), b1 (M,), w2 (M,), b2 (). identity: {"target": `adapter.model_identity` of the
    target, "draft": the draft model's name} (a head is tied to the draft that drafts and the
    target that verifies). temperature: the sampling temperature its labels were made at.
    """

    def __init__(self, input_size: int, identity: dict, hidden_units: int | None = None, *,
                 temperature: float = 0.0, seed: int = 0) -> None:
        if hidden_units is not None and (isinstance(hidden_units, bool) or not isinstance(hidden_units, int)
                                         or hidden_units < 1):
            raise ValueError(f"hidden_units={hidden_units!r} is out of range: must be an int >= 1 or None (linear)")
        self.input_size, self.hidden_units, self.temperature = input_size, hidden_units, float(temperature)
        self.identity = dict(identity)
        self.tensors = {"mean": torch.zeros(input_size), "scale": torch.ones(input_size)}
        if hidden_units is None:
            self.tensors |= {"weight": torch.zeros(input_size), "bias": torch.zeros(())}
        else:  # uniform in ±1/√F; zeros would leave the hidden units identical
            generator = torch.Generator().manual_seed(seed)
            w1 = (torch.rand(hidden_units, input_size, generator=generator) * 2 - 1) * input_size**-0.5
            self.tensors |= {"w1": w1, "b1": torch.zeros(hidden_units), "w2": torch.zeros(hidden_units),
                             "b2": torch.zeros(())}

    @property
    def parameters(self) -> list[Tensor]:
        """The trained tensors (not the standardisation)."""
        return [value for key, value in self.tensors.items() if key not in ("mean", "scale")]

    def logit(self, features: Tensor) -> Tensor:
        """(N, F) -> (N,) pre-sigmoid rejection scores."""
        t = self.tensors
        x = (features - t["mean"]) / t["scale"]
        if self.hidden_units is None:
            return x @ t["weight"] + t["bias"]
        return torch.nn.functional.silu(x @ t["w1"].T + t["b1"]) @ t["w2"] + t["b2"]

    def __call__(self, features: Tensor) -> Tensor:
        """(N, F) -> (N,) rejection probabilities r in (0, 1)."""
        if features.shape[-1] != self.input_size:
            raise ValueError(f"features have size {features.shape[-1]}, the stop head expects {self.input_size}")
        with torch.no_grad():
            return torch.sigmoid(self.logit(features.float()))

    def reject_probability(self, hidden: Tensor, logits: Tensor, tokens: Tensor) -> Tensor:
        """r for B drafted tokens: hidden (B, H), logits (B, V), tokens (B,) -> (B,)."""
        return self(stop_features(hidden, logits, tokens))

    def save(self, path: str | os.PathLike) -> None:
        """One safetensors file: the tensors, and the shape, identity and temperature as JSON metadata."""
        save_tensors(path, self.tensors, {"format": _FORMAT, "input_size": self.input_size,
                                          "hidden_units": self.hidden_units, "temperature": self.temperature,
                                          "identity": self.identity})

    @classmethod
    def load(cls, path: str | os.PathLike, target, draft) -> "StopHead":
        """The head saved at `path`; ValueError unless it was trained for this target and draft."""
        meta, tensors = load_tensors(path, _FORMAT, "stop head")
        check_stop_identity(meta["identity"], stop_identity(target, draft))
        head = cls(meta["input_size"], meta["identity"], meta["hidden_units"], temperature=meta["temperature"])
        if set(tensors) != set(head.tensors):
            raise ValueError(f"{os.fspath(path)}: tensors {sorted(tensors)} do not match {sorted(head.tensors)}")
        head.tensors = tensors
        return head


def stop_identity(target, draft) -> dict:
    """What a stop head is tied to: the target's `model_identity` and the draft model's name."""
    return {"target": model_identity(target), "draft": str(getattr(draft, "name", type(draft).__name__))}


def check_stop_identity(saved: dict, actual: dict) -> None:
    """ValueError naming the field where a head's saved identity and this target / draft differ."""
    check_identity(saved.get("target", {}), actual["target"], what="stop head")
    if saved.get("draft") != actual["draft"]:
        raise ValueError(f"the stop head was trained for the draft {saved.get('draft')!r}, this drafter runs "
                         f"{actual['draft']!r}: train a stop head for this draft")
