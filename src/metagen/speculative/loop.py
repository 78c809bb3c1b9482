"""Speculative decoding: a drafter's tokens verified by the target, in the one speculative loop.

The loop itself is `metagen.decoding.draft_loop` (jump-forward runs in it too); this module
builds its verification by name (`registry.VERIFICATIONS`; the token / block rules are
`rule_verification.RuleVerification`) and checks what it is given. Per step and row (the
target cache holds every committed token but the last, t0), with the token / block rules:

    d_1..d_γ, p   = drafter.propose(context)                 # p: draft distributions (or point masses)
    logits        = target.forward(cache, [t0, d_1..d_γ], logits="all")     # (γ+1) positions
    q             = chain.process(logits) per position, chain.accept(d_j) between positions
    tau, x        = rule(d, p, q)                            # token / block / greedy verification
    cache.truncate(row, old + 1 + tau);  chain.rollback(γ − tau);  chain.accept(x)
    emit d_1..d_tau, x                                       # through the row's bookkeeping (rows.py)

The same sampler chain (bias, penalties, n-gram blocking, temperature, truncations, constraints)
produces p in the drafter and q here, so the verification rules make the emitted tokens follow
exactly the distribution plain decoding samples from; the chain's state follows the cache, so a
rejected draft token is rolled back where the cache is truncated. A draft token the chain removes
(q = 0) is rejected by every rule, so the chain stops following that row's draft there. Rows
accept different numbers of tokens; the next forward is ragged. Under the rules Mirostat cannot
be honoured (its state follows the surprise of each token under the distribution it was drawn
from, which a draft changes) and raises.

`verify="draw"` (`decoding.draw_verify`) instead draws each token from q as plain decoding
does and keeps the draft while the draw equals it: the same law, Mirostat included, and for a
drafter that draws no random numbers (n-gram) and one row, plain decoding's seeded tokens; the
acceptance of a point-mass draft is q(d) under every rule, so it costs nothing there, while a
sampled draft is kept less often (q(d) instead of min(1, q(d)/p(d))).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from metagen.decoding.batch import RowBatch
from metagen.decoding.draft_loop import draft_stream
from metagen.decoding.drafts import Drafter
from metagen.decoding.prompts import Prompt
from metagen.decoding.result import GenerationResult, StreamEvent
from metagen.sampling import LogitsProcessor, SamplingParams
from metagen.speculative.registry import check_verification, make_verification

ADAPTIVE_MAX_DRAFT = 16


@dataclass(frozen=True)
class SpeculativeConfig:
    """How many tokens to draft and how to verify them.

    num_draft_tokens: γ, draft tokens per step (the starting value when `adaptive`).
    verify: a rule of `registry.VERIFICATIONS`: "token" (Leviathan et al.)
        or "block" (Sun et al.), where temperature 0 uses greedy
        verification (longest prefix matching the target's argmax); or "draw": each token drawn
        from the target as plain decoding draws it, the draft kept while the draw equals it
        (`decoding.draw_verify`) — for one row and a drafter that draws no random numbers
        (n-gram) the seeded output is plain decoding's, and Mirostat is allowed; a point-mass
        draft is kept with the same chance q(d) as under the rules, a sampled draft less often;
        "multi-draft": tree verification (`tree_verify`), needed by a tree drafter, where γ
        bounds the tree's depth; "spectr": tree verification by SpecTr's k-sequential selection
        (`spectr`), for trees whose siblings are drawn i.i.d.
    adaptive: per row, γ grows by 2 after a fully accepted draft and shrinks by 1 after a
        rejection, within [1, max_draft_tokens].
    max_draft_tokens: the adaptive upper bound.
    """

    num_draft_tokens: int = 4
    verify: str = "token"
    adaptive: bool = False
    max_draft_tokens: int = ADAPTIVE_MAX_DRAFT

    def __post_init__(self) -> None:
        for name in ("num_draft_tokens", "max_draft_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r} must be an int >= 1")
        check_verification(self.verify)  # a registered rule the loop runs (registry.VERIFICATIONS)
        if self.adaptive and self.max_draft_tokens < self.num_draft_tokens:
            raise ValueError(
                f"max_draft_tokens={self.max_draft_tokens} is below num_draft_tokens={self.num_draft_tokens}"
            )

    def next_length(self, gamma: int, proposed: int, accepted: int) -> int:
        """The row's draft length for the next step."""
        if not self.adaptive or proposed == 0:
            return gamma
        if accepted == proposed:
            return min(gamma + 2, self.max_draft_tokens)
        return max(gamma - 1, 1)


def check_compatible(model, drafter: Drafter, params: SamplingParams, config: SpeculativeConfig | None = None) -> None:
    """Raise ValueError when the drafter, the sampling parameters and the verification cannot be
    used together."""
    if params.uses_mirostat and (config is None or config.verify != "draw"):
        raise ValueError(
            f"mirostat_tau={params.mirostat_tau!r} cannot be used with speculative decoding's token / block "
            "rules: Mirostat's state follows each token's surprise under the distribution it was drawn "
            "from, which drafting changes (use plain decoding or verify='draw')"
        )
    verify = "token" if config is None else config.verify
    rule = check_verification(verify)
    if drafter.proposes_trees and not rule.trees:
        raise ValueError(f"the {drafter.name} drafter proposes token trees, which verify={verify!r} cannot verify "
                         "(it verifies chains): use a tree rule, verify='multi-draft'")
    if drafter.proposes_trees and rule.iid_siblings and not drafter.iid_siblings:
        raise ValueError(f"verify={verify!r} needs a node's children drawn i.i.d. (with replacement), but the "
                         f"{drafter.name} drafter draws them without replacement: use TreeDrafter(replacement=True) "
                         "(--speculative spectr) or verify='multi-draft'")
    if drafter.vocab_size is not None and drafter.vocab_size != model.vocab_size:
        raise ValueError(
            f"the {drafter.name} drafter's vocabulary has {drafter.vocab_size} tokens, the target's "
            f"{model.vocab_size}: drafter and target must share a tokenizer"
        )


def speculative_stream(
    model,
    drafter: Drafter,
    prompt: Prompt,
    params: SamplingParams | None = None,
    config: SpeculativeConfig | None = None,
    *,
    chat: bool | None = None,
    generator: torch.Generator | None = None,
    result: GenerationResult | None = None,
    processors: Sequence[LogitsProcessor] = (),
) -> Iterator[StreamEvent]:
    """`metagen.decoding.stream` with speculative decoding; same events, same completions.

    `result.cost` receives model calls (target and drafter), FLOPs, draft and accepted tokens
    and target steps (so `cost.acceptance_rate` and `cost.block_efficiency`). `processors` as
    in `stream`: they mask draft and target alike and are rolled back with rejected drafts.
    """
    params = params or SamplingParams()
    config = config or SpeculativeConfig()
    check_compatible(model, drafter, params, config)
    started = time.perf_counter()
    gamma_most = config.max_draft_tokens if config.adaptive else config.num_draft_tokens
    nodes_most = gamma_most if drafter.max_nodes is None else max(gamma_most, drafter.max_nodes)  # a tree's budget
    batch = RowBatch.for_prompt(model, prompt, params, processors, chat=chat, generator=generator,
                                positions=nodes_most + 1)
    result = batch.fill(result if result is not None else GenerationResult([], batch.prompt_ids))
    verification = make_verification(config.verify)
    yield from draft_stream(batch, drafter, verification, result, started, config)


def speculative_generate(
    model,
    drafter: Drafter,
    prompt: Prompt,
    params: SamplingParams | None = None,
    config: SpeculativeConfig | None = None,
    *,
    chat: bool | None = None,
    generator: torch.Generator | None = None,
    processors: Sequence[LogitsProcessor] = (),
) -> GenerationResult:
    """`params.n` completions of `prompt` by speculative decoding (see `speculative_stream`)."""
    result = GenerationResult([], [])
    for _ in speculative_stream(model, drafter, prompt, params, config, chat=chat, generator=generator, result=result,
                                processors=processors):
        pass
    return result
