r"""S2D: sorted speculative decoding — one draft for nested targets (Kavehzadeh et al. 2024).

A *sorted* model holds working sub-models at several depths (the first L layers + the shared
norm and LM head; S2D trains them so with sorted fine-tuning). S2D serves several targets —
depths t_1 < t_2 < ... of one model — with one draft: the sub-models at shallow depths
d_1 < ... < d_k (< every target). Per draft token, the draft selects the shallowest sub-model
whose confidence (its largest next-token probability after the sampler chain) reaches the
target's threshold θ_t, else takes the deepest one's token; a token below θ_t even there ends
the draft (the draft length follows confidence). Each target has its own θ_t: a deeper target
agrees with deeper drafts, so it trades more draft compute for acceptance.

    draft      = SortedDraft(model, draft_depths=(4, 8), thresholds={20: 0.5, 30: 0.6})
    target     = early_exit_model(model, 20)                 # one of the nested targets
    drafter    = draft.drafter(target)                        # θ = 0.5, sub-models at 4 and 8
    speculative_generate(target, drafter, prompt, params)

Per draft token and row: sub-model j's logits after the row's context + draft so far
(`SubModel.catch_up` runs what its own cache lacks), p_j = softmax(chain(logits_j)),
j* = min{j : max p_j ≥ θ} (k when none), x ~ p_{j*}; the draft goes on while max p_{j*} ≥ θ
and fewer than γ tokens are drafted. p_{j*} is a function of the context alone, so the token
rule stays lossless for any selection. Cost per token: the sub-models tried (each catches up on
the tokens its cache lacks — a deeper sub-model skipped for some tokens runs them in one
forward when next asked). Unlike the paper's draft, a deeper sub-model here runs its layers
from the embedding (no reuse of the shallower one's hidden state), so trying sub-model 2 costs
d_2 layers, not d_2 − d_1; FLOPs are counted so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from metagen.decoding.cost import forward_flops
from metagen.decoding.drafts import Draft, Drafter
from metagen.speculative.self_draft import early_exit_model

__all__ = ["DEFAULT_THRESHOLD", "S2DDrafter", "SortedDraft", "SubModel"]

DEFAULT_THRESHOLD = 0.5


class SubModel:
    """One draft sub-model with its own cache, kept in step with the contexts it is asked about.

    `catch_up(contexts, committed)` truncates each row to the longest prefix still valid —
    tokens before `committed[b]` at an earlier call are final, later ones are checked against
    the context — feeds the rest (at least the last token) in one ragged forward and returns the
    next-token logits `(B, V)` and the FLOPs spent. O(B · tokens fed) model work.
    """

    def __init__(self, model) -> None:
        self.model = model
        self.cache = None
        self.cached: list[list[int]] = []
        self.final: list[int] = []  # per row: tokens known to be committed

    def start(self, head: Sequence[int], batch_size: int, target_cache=None) -> float:
        """Cache the prompt's `head` (copied from `target_cache` row 0 when given); its FLOPs."""
        self.cache = self.model.new_cache(1)
        flops = 0.0
        if target_cache is not None:
            self.cache.copy_prefix(target_cache, 0, len(head), 0)
        elif head:
            self.model.forward(self.cache, [list(head)], logits="none")
            flops = forward_flops(self.model, 0, len(head))
        self.cache.select([0] * batch_size)
        self.cached = [list(head) for _ in range(batch_size)]
        self.final = [len(head)] * batch_size
        return flops

    def select(self, rows: Sequence[int]) -> None:
        self.cache.select(list(rows))
        self.cached = [list(self.cached[r]) for r in rows]
        self.final = [self.final[r] for r in rows]

    def catch_up(self, contexts: Sequence[Sequence[int]], committed: Sequence[int]) -> tuple[Tensor, float]:
        feed, flops = [], 0.0
        for b, context in enumerate(contexts):
            cached = self.cached[b]
            keep, limit = min(self.final[b], len(cached)), min(len(cached), len(context) - 1)
            while keep < limit and cached[keep] == context[keep]:
                keep += 1
            keep = min(keep, len(context) - 1)
            self.cache.truncate(b, keep)
            del cached[keep:]
            feed.append(list(context[keep:]))
            cached.extend(feed[-1])
            self.final[b] = min(committed[b], len(context))
            flops += forward_flops(self.model, keep, len(feed[-1]))
        return self.model.forward(self.cache, feed).logits, flops  # (B, V)


class S2DDrafter(Drafter):
    """Drafts for one target with the sorted draft's sub-models (shallow to deep) and the
    target's confidence threshold (see the module docstring).

    submodels: draft models of increasing depth over the target's vocabulary. threshold: θ_t in
    [0, 1]. share_prompt_cache: copy the prompt's keys and values from the target's cache (exact
    for early-exit sub-models of the target's model). `selected[j]`: draft tokens taken from
    sub-model j so far (this request); `tried[j]`: forwards of sub-model j.
    """

    def __init__(self, submodels: Sequence, threshold: float = DEFAULT_THRESHOLD, *, name: str = "s2d",
                 share_prompt_cache: bool = False) -> None:
        if not submodels:
            raise ValueError("submodels is empty: S2D needs at least one draft sub-model")
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0.0 <= threshold <= 1.0:
            raise ValueError(f"threshold={threshold!r} is out of range: must be in [0, 1]")
        self.subs = [SubModel(model) for model in submodels]
        self.threshold, self.name, self.share_prompt_cache = float(threshold), name, share_prompt_cache
        self.vocab_size = submodels[0].vocab_size
        self.selected = [0] * len(submodels)
        self.tried = [0] * len(submodels)
        self._committed: list[int] = []

    @property
    def draft_models(self) -> tuple:
        return tuple(sub.model for sub in self.subs)

    def for_request(self) -> S2DDrafter:
        """A copy with sub-models of its own (each keeps a cache of the request's rows), the
        models themselves shared."""
        copy = super().for_request()
        copy.subs = [SubModel(sub.model) for sub in self.subs]
        return copy

    def start(self, prompt_ids: Sequence[int], batch_size: int, target_cache=None) -> None:
        head = list(prompt_ids[:-1])
        shared = target_cache if self.share_prompt_cache else None
        self.prefill_flops = sum(sub.start(head, batch_size, shared) for sub in self.subs)
        self.selected, self.tried = [0] * len(self.subs), [0] * len(self.subs)

    def select(self, rows: Sequence[int]) -> None:
        for sub in self.subs:
            sub.select(rows)

    def propose(self, contexts, lengths, chain, generator) -> Draft:
        batch = len(contexts)
        committed = [len(context) for context in contexts]
        tokens: list[list[int]] = [[] for _ in range(batch)]
        probs: list[list[Tensor]] = [[] for _ in range(batch)]
        drafting = [n > 0 for n in lengths]
        probe = chain.fork(torch.arange(batch))
        calls, flops, last = 0, 0.0, len(self.subs) - 1
        while any(drafting):
            extended = [list(context) + row for context, row in zip(contexts, tokens)]
            chosen = [None] * batch  # per row: (sub-model, processed logits (V,), confident)
            for j, sub in enumerate(self.subs):
                logits, spent = sub.catch_up(extended, committed)
                calls, flops, self.tried[j] = calls + 1, flops + spent, self.tried[j] + 1
                processed = probe.process(logits)  # (B, V)
                confidence = torch.softmax(processed, dim=-1).amax(-1).tolist()
                for b in range(batch):
                    if drafting[b] and chosen[b] is None and (confidence[b] >= self.threshold or j == last):
                        chosen[b] = (j, processed[b], confidence[b] >= self.threshold)
                if all(c is not None for b, c in enumerate(chosen) if drafting[b]):
                    break
            rows = torch.stack([c[1] if c is not None else processed[b] for b, c in enumerate(chosen)])  # (B, V)
            picked = probe.choose(rows, generator)
            probe.accept(torch.where(torch.tensor(drafting), picked, -1))
            distribution = None if chain.greedy else torch.softmax(rows, dim=-1)
            for b, token in enumerate(picked.tolist()):
                if not drafting[b]:
                    continue
                j, _, confident = chosen[b]
                self.selected[j] += 1
                tokens[b].append(token)
                if distribution is not None:
                    probs[b].append(distribution[b])
                drafting[b] = confident and len(tokens[b]) < lengths[b]
        stacked = [torch.stack(rows) if rows and not chain.greedy else None for rows in probs]
        return Draft.chain(tokens, stacked, calls, flops)


class SortedDraft:
    """One draft serving nested targets: the sub-models at `draft_depths` of `base` (a
    `DepthTruncatable` model, e.g. the native backend) and a threshold per target depth.

    thresholds: {target depth: θ_t}; a target depth not listed uses `default_threshold`. Every
    target must be `base` or `early_exit_model(base, t)` deeper than every draft depth.
    """

    def __init__(self, base, draft_depths: Sequence[int], thresholds: Mapping[int, float] | None = None,
                 default_threshold: float = DEFAULT_THRESHOLD) -> None:
        depth = base.config.num_hidden_layers
        depths = tuple(draft_depths)
        if not depths or list(depths) != sorted(set(depths)) or not all(1 <= d < depth for d in depths):
            raise ValueError(f"draft_depths={depths!r} must be increasing ints in [1, {depth - 1}]")
        self.base, self.draft_depths = base, depths
        self.thresholds = dict(thresholds or {})
        self.default_threshold = default_threshold
        self.submodels = [early_exit_model(base, d) for d in depths]  # shared by every target's drafter

    @classmethod
    def for_target(cls, target, exit_layer: int | None = None, threshold: float | None = None) -> SortedDraft:
        """The draft `--speculative s2d` builds for `target`: exits at exit_layer // 2 and
        exit_layer (default a third of its depth), one threshold (default `DEFAULT_THRESHOLD`)."""
        deepest = exit_layer or max(1, target.config.num_hidden_layers // 3)
        depths = sorted({max(1, deepest // 2), deepest})
        return cls(target, depths, default_threshold=DEFAULT_THRESHOLD if threshold is None else threshold)

    def threshold(self, target_depth: int) -> float:
        return self.thresholds.get(target_depth, self.default_threshold)

    def drafter(self, target) -> S2DDrafter:
        """The drafter for `target` (the base model or one of its early-exit depths); ValueError
        for a target that is not a deeper depth of `base`."""
        depth = target.config.num_hidden_layers
        nested = target is self.base or (getattr(target, "embed", None) is getattr(self.base, "embed", object())
                                         and getattr(target, "layers", [None])[0] is self.base.layers[0])
        if not nested or depth <= self.draft_depths[-1]:
            raise ValueError(f"S2D drafts for the base model or its early-exit depths deeper than "
                             f"{self.draft_depths[-1]} layers; got {getattr(target, 'name', type(target).__name__)} "
                             f"with {depth} layers")
        return S2DDrafter(self.submodels, self.threshold(depth), share_prompt_cache=True)
