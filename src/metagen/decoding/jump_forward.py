"""Jump-forward: the speculative loop with a processor's forced run as a point-mass draft.

When a processor names a run of tokens as the only continuation of a row (`SamplerChain.forced`:
a constraint's fixed text, e.g. the key `"birth_date":` of a JSON schema), the row feeds its
last token *and* the run in one multi-token forward. `sample_loop.stream` hands a request whose
processors may force runs to the speculative loop (`draft_loop.draft_stream`) with
`ForcedRunDrafter` and draw verification (`draw_verify`):

    runs    = chain.forced(b)[:budget] per row                     # the draft: d_1..d_k per row
    logits  = model.forward(cache, [[t0] + run per row], "all")    # (B, 1 + longest run, V)
    per position: draw x from q exactly as plain decoding draws it; the row follows on while x == d
    cache.truncate(row, after x)                                   # the untaken run tokens leave

Tokens follow exactly the law of plain decoding, jump-forward on or off, and a seeded request
of one row gives the same tokens (`draw_verify` says why, and why n > 1 rows do not); what
changes is the number of model forwards (one per run instead of one per token). The run is only
a proposal, so nothing is emitted that the chain forbids: a token another processor (a
penalty, a ban, a truncation) removes is never drawn. A run is cut where the row's budget
(max_tokens, the context) ends; stop strings and stop tokens apply to every token, and a row
that ends inside a run stops drawing there. llguidance's runs are the canonical tokenization of
the forced text; a model may prefer another split (`"na` + `me"`), which the draw then takes,
ending the run. Mirostat works here (each token is drawn from its distribution), unlike under
the token / block rules.

Cost: the forward of a run of k tokens costs about one decode step (fused kernels up to 16 new
tokens per row); per position of a run the chain runs over the whole batch (a mask per row).
`GenerationResult.forced_tokens` counts the run tokens taken (a run token on which the row ends
is its last token, not counted); a forward's FLOPs count every token fed, the run tokens a draw
left included; a row's tokens from one forward are one target step.
"""

from __future__ import annotations

from metagen.decoding.drafts import Draft, Drafter

__all__ = ["ForcedRunDrafter"]


class ForcedRunDrafter(Drafter):
    """Proposes, per row, the run of tokens the chain's processors force after its last token
    (`SamplerChain.forced`), cut to the row's budget. No model, no random numbers: a point mass."""

    name = "forced-run"
    forced = True

    def propose(self, contexts, lengths, chain, generator) -> Draft:
        runs = [chain.forced(b)[:length] if length > 0 else [] for b, length in enumerate(lengths)]
        return Draft.chain(runs)
