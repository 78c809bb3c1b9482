"""Speculative decoding: lossless verification rules, drafters and the decoding loop.

Verification rules (pure tensor functions returning the accepted count and the next token):
`token_verify` (Leviathan et al. / Chen et al. 2023), `block_verify` (Sun et al. 2024),
`greedy_verify` (temperature 0) and `multi_draft_verify` (recursive rejection sampling,
Jeon et al. 2024).

Drafters: `ModelDrafter` over any same-vocabulary model — a smaller model, the target's first
layers (`early_exit_model`, optionally with a trained `ExitAdapter`) or a lower-precision copy
(`quantized_model`) — and the model-free `NgramDrafter` (prompt lookup + n-grams of past
outputs). `speculative_generate` / `speculative_stream` run the loop; `SpeculativeGenerator`
puts it behind the `Generator` interface.
"""

from metagen.speculative.adapter import AdaptedExitModel, ExitAdapter, sample_training_data, train_exit_adapter
from metagen.speculative.block_verify import block_verify
from metagen.speculative.drafters import Draft, Drafter, ModelDrafter
from metagen.speculative.generator import SpeculativeGenerator, make_drafter
from metagen.speculative.loop import SpeculativeConfig, speculative_generate, speculative_stream
from metagen.speculative.multi_draft import multi_draft_verify
from metagen.speculative.ngram import NgramDrafter
from metagen.speculative.self_draft import early_exit_model, quantized_model
from metagen.speculative.token_verify import token_verify
from metagen.speculative.verify import greedy_verify

__all__ = [
    "AdaptedExitModel",
    "ExitAdapter",
    "Draft",
    "Drafter",
    "ModelDrafter",
    "NgramDrafter",
    "SpeculativeConfig",
    "SpeculativeGenerator",
    "block_verify",
    "early_exit_model",
    "greedy_verify",
    "make_drafter",
    "multi_draft_verify",
    "quantized_model",
    "sample_training_data",
    "speculative_generate",
    "speculative_stream",
    "token_verify",
    "train_exit_adapter",
]
