"""A search tree's node (a partial solution) and what ends a step (`StepConfig`); the expanders
(expand.py, remote_expand.py) build nodes. Importing it imports no torch: a search's config
(`StepConfig`) is read by the registry and the command line before anything runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from metagen.strategies.options import check_options, option

if TYPE_CHECKING:
    import torch

    from metagen.decoding.rows import Row
    from metagen.sampling import SamplerChain


@dataclass(frozen=True)
class StepConfig:
    """delimiter: text that ends a step (a step ends with the first token whose text contains
    it); None: steps are blocks of exactly max_step_tokens tokens (blockwise control);
    max_step_tokens: a step longer than this ends there (it stays expandable); the solution
    ends at EOS / a stop token, a stop string, or params.max_tokens in total."""

    delimiter: str | None = option("\n", str, "text that ends a reasoning step (null: blocks of max_step_tokens)",
                                   optional=True, name="step_delimiter")
    max_step_tokens: int = option(64, int, "a step longer than this many tokens ends there", low=1)

    def __post_init__(self) -> None:
        check_options(self)
        if self.delimiter == "":
            raise ValueError("step_delimiter='' is empty: give the text that ends a step, e.g. '\\n'")


@dataclass(eq=False)
class Node:
    """A partial solution. token_ids: this step's tokens (None: unknown, a remote engine that
    returns no ids); finish_reason: None while the solution
    can go on, else "stop" (EOS, stop token or stop string) or "length"; value: V of the path;
    logprob: Σ log p(token) of this step under the unmodified model; complete: for a finished
    node, whether its processors (a constraint) accept the path as it ended (None: no opinion;
    False: cut by max_tokens before the constraint accepted, not valid output)."""

    parent: Node | None = field(repr=False)
    token_ids: list[int] | None
    depth: int
    length: int  # cached tokens: prompt + path
    snapshot: object = field(default=None, repr=False)
    logits: torch.Tensor | None = field(default=None, repr=False)  # (V,) next-token logits after it
    hidden: torch.Tensor | None = field(default=None, repr=False)  # (H,) final hidden state there
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str | None = None
    value: float | None = None
    text: str = ""  # the whole path's text (stop strings cut off)
    children: list[Node] = field(default_factory=list, repr=False)
    row: Row | None = field(default=None, repr=False)  # the path's bookkeeping, continued by children
    sampler: SamplerChain | None = field(default=None, repr=False)  # one-row chain state after the path
    complete: bool | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def path(self) -> list[Node]:
        """Nodes from the first step down to this one (the root excluded)."""
        nodes, node = [], self
        while node.parent is not None:
            nodes.append(node)
            node = node.parent
        return nodes[::-1]

    def path_ids(self) -> list[int] | None:
        """The path's token ids, None when a step's ids are unknown."""
        path = self.path()
        if any(node.token_ids is None for node in path):
            return None
        return [token for node in path for token in node.token_ids]

    def path_logprobs(self) -> list[float]:
        return [lp for node in self.path() for lp in node.logprobs]
