"""Speculative decoding: lossless verification rules, drafters and the decoding loop.

Verification rules (pure tensor functions returning the accepted count and the next token):
`token_verify` (Leviathan et al. / Chen et al. 2023), `block_verify` (Sun et al. 2024),
`greedy_verify` (temperature 0) and `multi_draft_verify` (recursive rejection sampling,
Jeon et al. 2024), which `TreeVerification` runs over each node's children of a token tree;
`SpecTrVerification` runs SpecTr's k-sequential selection (`k_sequential`, Sun et al. 2023)
there instead, over children drawn i.i.d.

Drafters: `ModelDrafter` over any same-vocabulary model — a smaller model, the target's first
layers (`early_exit_model`, optionally with a trained `ExitAdapter`) or a lower-precision copy
(`quantized_model`) — and the model-free `NgramDrafter` (prompt lookup + n-grams of past
outputs); `TreeDrafter`, a static token tree from any of those draft models (SpecInfer-style;
with `replacement=True` SpecTr's i.i.d. drafts); `NgramTreeDrafter`, the n-gram lookups'
continuations as branches; `DySpecDrafter`, a dynamic tree grown where the draft is most
confident (DySpec); `RecyclingDrafter` (token recycling: trees from a matrix of the target's
recycled top-k successors) and `RasdDrafter` (RASD: tries of continuations retrieved by longest
suffix match, optionally fused with a model tree) and `StandDrafter` (STAND: trees drawn from
the target's distributions observed earlier in the same request, shared by its rows), which run
no model. `PearlDrafter` + `PearlVerification` run PEARL (the draft drafts in a second thread
while the target verifies; pre-verify / post-verify rounds); `SortedDraft` / `S2DDrafter` serve
nested early-exit targets of one model with one draft of shallow exits (S2D); `MedusaDrafter` (token
trees from `MedusaHeads` on the target's own hidden state, `train_medusa_heads`). A `StopHead` (SpecDec++, `train_stop_head`) ends a `ModelDrafter`'s
chain once a rejection is likely. A `Draft` is a tree per
row (`Draft.chain` for the one-child case the chain drafters propose). `speculative_generate` /
`speculative_stream` run the loop; `SpeculativeGenerator`
puts it behind the `Generator` interface. `registry` names the drafters and the rules
(`DRAFTERS`, `VERIFICATIONS`, `make_drafter`) for the command line and `SpeculativeGenerator.by_name`.

Names are imported on first use (`metagen._lazy`): the registry imports no torch.
"""

from metagen._lazy import lazy_package

# name -> the submodule that defines it
_EXPORTS = {
    "AdaptedExitModel": "adapter",
    "ExitAdapter": "adapter",
    "sample_training_data": "adapter",
    "train_exit_adapter": "adapter",
    "block_verify": "block_verify",
    "Draft": "drafters",
    "Drafter": "drafters",
    "ModelDrafter": "drafters",
    "DySpecDrafter": "dyspec",
    "SpeculativeGenerator": "generator",
    "SpeculativeConfig": "loop",
    "speculative_generate": "loop",
    "speculative_stream": "loop",
    "MedusaDrafter": "medusa",
    "MedusaHeads": "medusa",
    "train_medusa_heads": "medusa_training",
    "multi_draft_verify": "multi_draft",
    "NgramDrafter": "ngram",
    "RasdDrafter": "rasd",
    "RecyclingDrafter": "recycling",
    "NgramTreeDrafter": "ngram_tree",
    "PearlDrafter": "pearl",
    "PearlVerification": "pearl",
    "pearl_verify": "pearl",
    "DRAFTERS": "registry",
    "VERIFICATIONS": "registry",
    "DrafterOptions": "registry",
    "make_drafter": "registry",
    "make_verification": "registry",
    "S2DDrafter": "s2d",
    "SortedDraft": "s2d",
    "early_exit_model": "self_draft",
    "quantized_model": "self_draft",
    "SpecTrVerification": "spectr",
    "k_sequential": "spectr",
    "spectr_plan": "spectr",
    "StandDrafter": "stand",
    "StopHead": "stop_head",
    "train_stop_head": "stop_training",
    "token_verify": "token_verify",
    "TreeDrafter": "tree_drafter",
    "TreeVerification": "tree_verify",
    "greedy_verify": "verify",
}
lazy_package(__name__, _EXPORTS)

__all__ = list(_EXPORTS)
