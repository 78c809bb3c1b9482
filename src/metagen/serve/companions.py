"""The companion models of a server-wide logits combiner (`metagen serve --contrastive`,
`--dexperts`): their caches in the engine, rows aligned with the main model's.

A server started with a `decoding.combine.LogitsCombiner` decodes every request with it, as
`RowBatch(combiner=)` does in the sampling loop: each companion keeps one cache holding a row
for every row of the engine's shared cache, with the same tokens, moved by the same operations:

    chunked prefill   each prompt piece is forwarded on the request's companion prompt rows
                      too (`forward_piece`, before the main model's), kept between steps as
                      snapshots (`EngineRequest.companion_prompt_rows`) and forked into its n rows
                      when the prompt is all in (`join`)
    decode step       `select` drops the ended rows of every cache, `forward` appends the same
                      tokens to every companion's rows; the runner combines each request's
                      slices, `combiner.combine([main, *companions])`, before its sampler chain
                      (a companion that is the main model itself has no cache here: its slot
                      takes the main slice, `CompanionSlots`)
    finish            `release` gives back a request's partial prompt rows (`Scheduler.finish` ->
                      `PrefixCacheManager.free`); its running rows leave with the next `select`

Why not share the main model's paged keys and values for `early-exit:L`: the amateur's keys and
values at layers < L are the expert's own (same weights, same inputs), but the model interface
appends tokens through all of a model's layers in one `forward`, so a truncated model run over the
main cache would write its tokens again into new slots; sharing needs a forward that returns the
logits of an exit at layer L next to the final ones (one pass for both models), which the models
do not offer yet. The early-exit amateur therefore has its own cache of L layers: L / layers of
the main cache's bytes per token, counted in the admission check (`RowBatch.start(combiner=)`).
Its cache is not the prefix cache's either, so a server with a combiner has no prefix cache.

Cost per step: each companion's forward of the same B rows × 1 token; per prompt piece, each
companion's forward of its C tokens and two snapshots of its running rows' page tables.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from metagen.decoding.combine import CompanionSlots, ContrastiveConfig, DExpertsConfig, LogitsCombiner
from metagen.decoding.combine import SwitchingCombiner
from metagen.decoding.combine import check_same_vocabulary, model_label

if TYPE_CHECKING:
    from metagen.serve.request_state import EngineRequest


class CompanionCaches:
    """The caches of `combiner`'s companions next to the engine's cache of `model` (engine thread
    only). ValueError when a companion has another vocabulary (`check_same_vocabulary`) or when
    the combiner switches models row by row (its companions run only some steps: not served)."""

    def __init__(self, model, combiner: LogitsCombiner) -> None:
        if isinstance(combiner, SwitchingCombiner) or not isinstance(combiner, LogitsCombiner):
            raise ValueError(f"the server decodes with a LogitsCombiner (contrastive decoding, DExperts); "
                             f"{type(combiner).__name__} is not one")
        self.combiner = combiner
        self.slots = CompanionSlots(model, combiner.companions)
        self.models = self.slots.running  # a companion that is the main model takes its logits, no cache
        for companion in self.models:
            check_same_vocabulary(model, companion)
        self.caches = [companion.new_cache(1) for companion in self.models]

    # ------------------------------------------------------------------ chunked prefill

    def set_aside(self, batch_running: bool) -> list[list]:
        """Each cache's running rows as snapshots (none when no batch runs)."""
        if not batch_running:
            return [[] for _ in self.caches]
        return [[cache.snapshot(row) for row in range(cache.batch_size)] for cache in self.caches]

    def forward_piece(self, request: EngineRequest, begin: int, end: int, last: bool) -> list:
        """Prompt tokens [begin, end) forwarded on each companion's prompt row of the request (its
        earlier pieces, else an empty row), which is kept as the request's snapshot right away
        (so `release` frees it whatever fails next). Returns each companion's logits, `(1, V)` on
        the last piece, else None; each cache is left holding that prompt row only."""
        rows = request.companion_prompt_rows or [None] * len(self.caches)
        request.companion_prompt_rows = rows
        logits = []
        for i, (companion, cache) in enumerate(zip(self.models, self.caches)):
            if rows[i] is not None:
                cache.restore([rows[i]])
                cache.release(rows[i])
                rows[i] = None
            elif begin:
                raise RuntimeError(f"companion prompt row of tokens [0, {begin}) is missing")
            else:
                cache.reset(1)
            out = companion.forward(cache, [list(request.prompt_ids[begin:end])], logits="last" if last else "none")
            rows[i] = cache.snapshot(0)
            logits.append(out.logits)
        return logits

    def join(self, request: EngineRequest, running: list[list]) -> None:
        """After the last piece: each cache holds its running rows, then the prompt row n times."""
        n = request.params.n
        for cache, aside, row in zip(self.caches, running, request.companion_prompt_rows):
            cache.restore(aside + [row] * n)
        self.release(request)

    def restore(self, running: list[list]) -> None:
        """Each cache back to its running rows (`set_aside`'s snapshots)."""
        for cache, aside in zip(self.caches, running):
            cache.restore(aside)

    def drop(self, running: list[list]) -> None:
        """Give back `set_aside`'s snapshots."""
        for cache, aside in zip(self.caches, running):
            for snapshot in aside:
                cache.release(snapshot)

    def release(self, request: EngineRequest) -> None:
        """The request's partial prompt rows given back (after its join, or when it leaves)."""
        for cache, row in zip(self.caches, request.companion_prompt_rows):
            if row is not None:
                cache.release(row)
        request.companion_prompt_rows = []

    # ------------------------------------------------------------------ decode step

    def select(self, kept_rows: Sequence[int]) -> None:
        """Drop the ended rows of every companion cache, as the main cache's."""
        for cache in self.caches:
            if len(kept_rows) < cache.batch_size:
                cache.select(kept_rows)

    def forward(self, tokens, running: list[EngineRequest]) -> None:
        """Every companion appends `tokens` (B, 1) to its rows; each running request's
        `companion_logits` become its slices `(k, V)` (views), in the order of `running`."""
        outs = [companion.forward(cache, tokens).logits for companion, cache in zip(self.models, self.caches)]
        start = 0
        for request in running:
            k = request.live_rows
            request.companion_logits = [out[start:start + k] for out in outs]  # (k, V) views
            start += k

    def reset(self) -> None:
        """Empty caches, after a failed forward lost the batch."""
        for cache in self.caches:
            cache.reset(0)


def combiner_card(combiner) -> dict:
    """What `/v1/models` and `/health` say of a server-wide combiner: its method, its models and
    its settings."""
    if isinstance(combiner, ContrastiveConfig):
        return {"method": "contrastive", "amateur": model_label(combiner.amateur), "alpha": combiner.alpha,
                "amateur_temperature": combiner.amateur_temperature, "beta": combiner.beta}
    if isinstance(combiner, DExpertsConfig):
        return {"method": "dexperts", "expert": model_label(combiner.expert),
                "anti_expert": model_label(combiner.anti_expert), "alpha": combiner.alpha}
    return {"method": type(combiner).__name__, "companions": [model_label(m) for m in combiner.companions]}
