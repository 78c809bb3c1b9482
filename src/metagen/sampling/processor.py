"""`LogitsProcessor`: one interface for everything that edits next-token logits, with or without
per-row state (the sampler interface of llama.cpp and vLLM's `LogitsProcessor` are the models).

A processor holds the state of B rows (the rows of a decoding batch) and follows the rows as the
KV cache does:

    processed = processor.apply(logits)     # (B, V) -> (B, V) float32, the input untouched
    processor.accept(tokens)                # (B,) the token chosen in each row (< 0: row skipped)
    processor.rollback(counts)              # (B,) forget the last counts[b] accepted tokens of row b
    processor.select(indices)               # row i becomes old row indices[i]   (cache.select)
    forked = processor.fork(indices)        # an independent copy of those rows (cache.snapshot)
    joined = type(p).concat([p1, p2, ...])  # rows of several states in one   (cache.restore)
    processor.reset()                       # back to the state right after the prompt

| decoding loop event                          | cache                | processor             |
|----------------------------------------------|----------------------|-----------------------|
| n samples forked from one prefill            | select([0] * n)      | select / fork         |
| a row finishes and leaves the batch          | select(keep)         | select(keep)          |
| beam reorder                                 | select(parents)      | select(parents)       |
| speculative rejection of k draft tokens      | truncate(row, len)   | rollback(k)           |
| tree node kept outside the batch / restored  | snapshot / restore   | fork([b]) / concat    |

`argmax_invariant` is True when `apply` never changes which token is the argmax (temperature and
the truncations that always keep the top token); greedy decoding may skip such stateless
processors. Penalties, biases, bans and constraints are not argmax invariant.

`stateless` is True for a processor that keeps no per-row state (`StatelessProcessor`): it works
for any number of rows, has no `batch_size` (None) and ignores accept / rollback / select / reset.

Three optional hooks let a processor decide where a row may end (a constraint: EOS only where the
grammar accepts); the default is "no opinion":

    allows_stop(row)  may row `row` end after the tokens it has accepted (EOS, a stop string,
                      max_tokens)? A row ending where some processor says no is marked
                      `Completion.complete = False`.
    finished(row)     must row `row` end now (nothing can follow)?
    forced(row)       the tokens that are the only possible continuation (jump-forward), [] if none.

A chain sums the first two into a `StopVerdict` (may_stop, must_stop) per row; `NO_OPINION` is
(None, False), what a chain without such a processor answers.

Stateless adapters (temperature, top-k, ...) are pure functions wrapped by `StatelessProcessor`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence

from torch import Tensor

StopVerdict = tuple[bool | None, bool]  # (may_stop, must_stop) of a row, see SamplerChain.stop_verdict
NO_OPINION: StopVerdict = (None, False)


class LogitsProcessor(ABC):
    """B rows of logits-editing state; see the module docstring for the protocol.

    Attributes:
        name: short name shown in `SamplerChain.names`.
        argmax_invariant: True when `apply` never changes which token is the argmax.
        stateless: True when the processor keeps no per-row state (works for any number of rows).
    """

    name: str = "processor"
    argmax_invariant: bool = False
    stateless: bool = False

    @property
    @abstractmethod
    def batch_size(self) -> int | None:
        """Rows of state B; None for a stateless processor (any number of rows)."""

    @abstractmethod
    def apply(self, logits: Tensor) -> Tensor:
        """`logits (B, V)` of the current rows -> new float32 logits `(B, V)`; input untouched."""

    @abstractmethod
    def accept(self, tokens: Tensor) -> None:
        """Advance each row by its chosen token, `tokens (B,)`; negative entries skip the row."""

    @abstractmethod
    def rollback(self, counts: Tensor) -> None:
        """Forget the last `counts[b]` accepted tokens of row b, `counts (B,)` long (skipped rows
        do not count). Raises ValueError when a row has accepted fewer tokens than asked."""

    @abstractmethod
    def select(self, indices: Tensor) -> None:
        """In place: row i becomes old row `indices[i]`, `indices (B',)` long (rows may repeat
        or vanish), following `cache.select`."""

    @abstractmethod
    def fork(self, indices: Tensor) -> LogitsProcessor:
        """A new, independent processor made of rows `indices (B',)`; this one is unchanged."""

    @abstractmethod
    def reset(self) -> None:
        """Back to the state right after the prompt, for every row (all accepted tokens undone)."""

    @classmethod
    def concat(cls, parts: Sequence[LogitsProcessor]) -> LogitsProcessor:
        """One processor whose rows are the rows of `parts`, in order (parts are unchanged).

        Tree search needs it to expand several nodes in one batch; a processor that cannot join
        states says so here rather than deep in a search."""
        raise NotImplementedError(
            f"{cls.__name__} cannot join the rows of several states (concat): tree search needs it to "
            "restore several nodes as one batch"
        )

    def allows_stop(self, row: int) -> bool:
        """May row `row` end after the tokens it accepted? Default: no opinion (True)."""
        return True

    def finished(self, row: int) -> bool:
        """Must row `row` end now? Default: no opinion (False)."""
        return False

    def forced(self, row: int) -> list[int]:
        """Tokens that are the only possible continuation of row `row`; default none."""
        return []


class StatelessProcessor(LogitsProcessor):
    """A pure function `(logits (B, V)) -> logits (B, V)` as a processor with no state.

    accept / rollback / select / reset do nothing; fork and concat return the processor itself
    (it holds nothing that rows could share or lose).
    """

    stateless = True

    def __init__(self, name: str, function: Callable[[Tensor], Tensor], argmax_invariant: bool) -> None:
        self.name = name
        self.function = function
        self.argmax_invariant = argmax_invariant

    def __repr__(self) -> str:
        return f"StatelessProcessor({self.name!r})"

    @property
    def batch_size(self) -> None:
        return None

    def apply(self, logits: Tensor) -> Tensor:
        return self.function(logits)

    def accept(self, tokens: Tensor) -> None:
        pass

    def rollback(self, counts: Tensor) -> None:
        pass

    def select(self, indices: Tensor) -> None:
        pass

    def fork(self, indices: Tensor) -> StatelessProcessor:
        return self

    def reset(self) -> None:
        pass

    @classmethod
    def concat(cls, parts: Sequence[LogitsProcessor]) -> LogitsProcessor:
        return parts[0]


def overrides_stop_hooks(processor: LogitsProcessor) -> bool:
    """True when the processor has an opinion on where rows end (overrides a hook); checked once
    when a chain is built, so loops ask only processors that answer."""
    kind = type(processor)
    return any(getattr(kind, hook) is not getattr(LogitsProcessor, hook)
               for hook in ("allows_stop", "finished", "forced"))
