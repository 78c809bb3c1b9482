"""The options a speculative drafter factory may read (`registry.DrafterOptions`), checked when
made: each names the field, its value and what is allowed. No heavy import: the CLI builds and
checks them before any model loads."""

from __future__ import annotations

from dataclasses import dataclass, fields

__all__ = ["DRAFT_DTYPES", "DrafterOptions"]

DRAFT_DTYPES = ("fp32", "bf16", "int8", "int4")  # weight formats a model draft may load in


@dataclass(frozen=True)
class DrafterOptions:
    """Options a drafter factory may read; None: not given (the entry's own default applies).

    exit_layer: early exit: layers the draft runs (>= 1; default two thirds of the target's depth).
    exit_adapter: early exit: a trained `ExitAdapter` file (its layer count wins).
    draft_dtype: weights of a model draft loaded from a file, one of `DRAFT_DTYPES` (default int4).
    confidence: model drafts: a row's draft stops after a token below this probability, in [0, 1].
    tree_widths: tree drafts: children per node at each depth (ints >= 1; default (2, 2, 1), stand's
        (3, 2, 1, 1)).
    tree_nodes: tree drafts: nodes per row and step (>= 1; default 16, stand's 12). Either tree
        option makes a drafter reading it draft token trees (`tree`).
    draft_corpus: retrieval drafts: a UTF-8 text file, tokenized once with the target's tokenizer.
    stop_head: model chain drafts: a trained SpecDec++ stop head file (`stop_head.StopHead`); a
        row's draft stops once the predicted probability that a token so far is rejected passes
        `stop_threshold` (in (0, 1), default 0.5; only with a stop head).
    """

    exit_layer: int | None = None
    exit_adapter: str | None = None
    draft_dtype: str | None = None
    confidence: float | None = None
    tree_widths: tuple[int, ...] | None = None
    tree_nodes: int | None = None
    draft_corpus: str | None = None
    stop_head: str | None = None
    stop_threshold: float | None = None

    def __post_init__(self) -> None:
        if self.stop_head is not None and (not isinstance(self.stop_head, str) or not self.stop_head):
            raise ValueError(f"stop_head={self.stop_head!r} must be a non-empty path string")
        if self.stop_threshold is not None and (self.stop_head is None or not 0.0 < self.stop_threshold < 1.0):
            raise ValueError(f"stop_threshold={self.stop_threshold!r} must be in (0, 1) and given with stop_head "
                             "(the probability that a draft token is rejected, past which drafting stops)")
        if self.exit_layer is not None and (isinstance(self.exit_layer, bool) or not isinstance(self.exit_layer, int)
                                            or self.exit_layer < 1):
            raise ValueError(f"exit_layer={self.exit_layer!r} must be an int >= 1")
        if self.draft_dtype is not None and self.draft_dtype not in DRAFT_DTYPES:
            raise ValueError(f"draft_dtype={self.draft_dtype!r} is not a draft format: choose one of "
                             f"{', '.join(DRAFT_DTYPES)}")
        if self.confidence is not None and not 0.0 <= self.confidence <= 1.0:
            raise ValueError(f"confidence={self.confidence!r} is out of range: must be in [0, 1] or None")
        if self.tree_widths is not None and (not isinstance(self.tree_widths, tuple) or not self.tree_widths or any(
                isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in self.tree_widths)):
            raise ValueError(f"tree_widths={self.tree_widths!r} must be a non-empty tuple of ints >= 1 (children "
                             "per node at each depth)")
        if self.tree_nodes is not None and (isinstance(self.tree_nodes, bool) or not isinstance(self.tree_nodes, int)
                                            or self.tree_nodes < 1):
            raise ValueError(f"tree_nodes={self.tree_nodes!r} must be an int >= 1")
        if self.draft_corpus is not None and (not isinstance(self.draft_corpus, str) or not self.draft_corpus):
            raise ValueError(f"draft_corpus={self.draft_corpus!r} must be a non-empty path string")

    @property
    def tree(self) -> bool:
        """Whether a tree option is given (the drafter then drafts token trees)."""
        return self.tree_widths is not None or self.tree_nodes is not None

    def given(self) -> dict[str, object]:
        """The options set (not None), by name."""
        values = {field.name: getattr(self, field.name) for field in fields(self)}
        return {name: value for name, value in values.items() if value is not None}
