"""A prefix value head on the LM's final hidden state, trained with CD-FUDGE.

    V(x, y_≤t) = σ(w · h_t + b)                          # linear (logistic regression)
    V(x, y_≤t) = σ(w₂ · SiLU(W₁ h_t + b₁) + b₂)           # one hidden layer of size M

h_t: (H,) the final hidden state (after the last norm) at the state that has read the prompt x
and the first t completion tokens. CD-FUDGE (Yang & Klein 2021, FUDGE; the "controlled decoding"
form of Mudgal et al. 2024): sample y ~ p(·|x), score it r(x, y) ∈ {0, 1} with a verifier, and
regress r from *every* prefix of y — the minimiser is V(x, y_≤t) = E[r | x, y_≤t] under the
model's own sampling, the value of the prefix. Data and training: `value_training.py`.
Use: `ValueScorer` reads V at the end of prompt + candidate; `process_reward.HeadValue` reads it
on search nodes. Save/load checks the LM's identity.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from metagen.decoding.cost import Cost, forward_flops
from metagen.decoding.prompts import Prompt, encode_prompt
from metagen.scoring.base import Scorer, Scores

# ------------------------------------------------------------------------- identity + head
def model_identity(model) -> dict[str, str]:
    """What a head is tied to: config name, hidden size, layers, vocab, source file, dtype."""
    config = getattr(model, "config", None)
    return {
        "config_name": str(getattr(config, "name", getattr(model, "name", ""))),
        "hidden_size": str(getattr(config, "hidden_size", "")),
        "num_hidden_layers": str(getattr(config, "num_hidden_layers", "")),
        "vocab_size": str(model.vocab_size),
        "source": Path(model.source).name,
        "dtype": str(getattr(model, "dtype", "")),
    }


class ValueHead:
    """V(h) = σ(w · h + b), or with `mlp_hidden` = M: σ(w₂ · SiLU(W₁ h + b₁) + b₂).

    hidden: (..., H) float32 → values (...) in [0, 1]. Parameters are plain tensors:
    linear: weight (H,), bias (); MLP: w1 (M, H), b1 (M,), w2 (M,), b2 ().
    identity: the `model_identity` of the LM whose hidden states it reads.
    """

    def __init__(self, hidden_size: int, mlp_hidden: int | None = None, *,
                 identity: dict[str, str] | None = None, generator: torch.Generator | None = None) -> None:
        if mlp_hidden is not None and mlp_hidden < 1:
            raise ValueError(f"mlp_hidden={mlp_hidden} is out of range: must be >= 1 or None")
        self.hidden_size, self.mlp_hidden = hidden_size, mlp_hidden
        self.identity = dict(identity or {})
        if mlp_hidden is None:
            self.params = {"weight": torch.zeros(hidden_size), "bias": torch.zeros(())}
        else:  # Kaiming-uniform-like init; zeros would leave the hidden units identical
            bound = hidden_size**-0.5
            w1 = (torch.rand(mlp_hidden, hidden_size, generator=generator) * 2 - 1) * bound
            self.params = {"w1": w1, "b1": torch.zeros(mlp_hidden),
                           "w2": torch.zeros(mlp_hidden), "b2": torch.zeros(())}

    def logit(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., H) → (...) pre-sigmoid values."""
        p = self.params
        if self.mlp_hidden is None:
            return hidden @ p["weight"] + p["bias"]
        return torch.nn.functional.silu(hidden @ p["w1"].T + p["b1"]) @ p["w2"] + p["b2"]

    @property
    def flops_per_state(self) -> int:
        """Multiply-adds ×2 to read one hidden state: 2·H (linear) or 2·M·(H + 1) (MLP)."""
        if self.mlp_hidden is None:
            return 2 * self.hidden_size
        return 2 * self.mlp_hidden * (self.hidden_size + 1)

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., H) → (...) values in [0, 1]."""
        if hidden.shape[-1] != self.hidden_size:
            raise ValueError(f"hidden has size {hidden.shape[-1]}, the head expects {self.hidden_size}")
        with torch.no_grad():
            return torch.sigmoid(self.logit(hidden.float()))

    def save(self, path: str | Path) -> None:
        """safetensors file: the parameters, and JSON metadata with the shape and identity."""
        from safetensors.torch import save_file

        meta = {"hidden_size": self.hidden_size, "mlp_hidden": self.mlp_hidden, "identity": self.identity}
        save_file({k: v.detach().contiguous() for k, v in self.params.items()}, str(path),
                  metadata={"metagen_value_head": json.dumps(meta)})

    @classmethod
    def load(cls, path: str | Path, model) -> "ValueHead":
        """The head at `path`; ValueError naming the field when `model` is not the one it was trained on."""
        from safetensors import SafetensorError, safe_open

        if not Path(path).is_file():
            raise FileNotFoundError(f"value head {path} does not exist or is not a file")
        try:
            with safe_open(str(path), framework="pt") as handle:
                raw = (handle.metadata() or {}).get("metagen_value_head")
                tensors = {key: handle.get_tensor(key) for key in handle.keys()}
            meta = None if raw is None else json.loads(raw)
        except (SafetensorError, json.JSONDecodeError) as error:
            raise ValueError(f"{path}: not a metagen value head (not a readable safetensors file: {error})") from None
        if meta is None:
            raise ValueError(f"{path}: not a metagen value head (no 'metagen_value_head' metadata)")
        expected = model_identity(model)
        for name, value in meta["identity"].items():
            if expected.get(name) != value:
                raise ValueError(f"{path}: value head was trained on {name}={value!r}, "
                                 f"but the model has {name}={expected.get(name)!r}")
        head = cls(meta["hidden_size"], meta["mlp_hidden"], identity=meta["identity"])
        if set(tensors) != set(head.params):
            raise ValueError(f"{path}: tensors {sorted(tensors)} do not match {sorted(head.params)}")
        head.params = {k: tensors[k].float() for k in head.params}
        return head


# ---------------------------------------------------------------------------- scorer
class ValueScorer(Scorer):
    """Scores a candidate by V at the end of prompt + candidate: one batched forward of the
    B rows prompt + candidate_i (logits="none", hidden (B, H) at each row's last token).

    Completion tokens: its `token_ids` when set, else its text encoded without special tokens.
    Cost: model_calls = 1, prompt_tokens_computed = Σ row lengths, flops = Σ forward_flops.
    """

    name = "value_head"

    def __init__(self, model, head: ValueHead, chat: bool | None = None) -> None:
        if head.identity and head.identity != model_identity(model):
            diff = [k for k in head.identity if head.identity[k] != model_identity(model).get(k)]
            raise ValueError(f"value head was trained on another model (differs in {', '.join(diff)})")
        self.model, self.head, self.chat = model, head, chat

    def score(self, prompt: Prompt, candidates: Sequence) -> Scores:
        if not candidates:
            return Scores([])
        start = time.perf_counter()
        prompt_ids = encode_prompt(self.model.tokenizer, prompt, self.chat, vocab_size=self.model.vocab_size)
        rows = [prompt_ids + (list(c.token_ids) or self.model.tokenizer.encode(c.text, add_special_tokens=False))
                for c in candidates]
        cache = self.model.new_cache(len(rows))
        hidden = self.model.forward(cache, rows, logits="none", hidden=True).hidden  # (B, H)
        values = self.head(hidden).tolist()
        cost = Cost(model_calls=1, prompt_tokens_computed=sum(map(len, rows)),
                    flops=sum(forward_flops(self.model, 0, len(r)) for r in rows),
                    wall_seconds=time.perf_counter() - start)
        return Scores([float(v) for v in values], cost)
