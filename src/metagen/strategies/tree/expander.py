"""The step expander a search talks to, and which implementation serves a given backend.

Every search (step beam, DVTS, REBASE, MCTS, A*, particle filtering, blockwise CD) uses only:

    expander.root                          the prompt's node (valued)
    expander.expand(parents, counts)       counts[i] children of parents[i]: list per parent of
                                           `Node`s with their step tokens / text, Σ logprobs,
                                           finished flag and value; appended to parent.children
    expander.release(node)                 a pruned node will not be expanded again
    expander.cost                          what the search has spent so far
    expander.generator                     the torch.Generator of the search's own draws
    expander.has_logprobs                  nodes carry log p of their tokens (A*'s g reads it)

Two implementations:
- `StepExpander` (expand.py): a local `LanguageModel`; nodes keep KV-cache snapshots, nothing
  is recomputed. Chosen for a LanguageModel, or a Generator with LOCAL_CACHE.
- `RemoteStepExpander` (remote_expand.py): a Generator with STEP_CONTINUATION (a server);
  every expansion is a completion request continuing the node's prefix to the delimiter.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from metagen.decoding import capabilities as caps
from metagen.decoding.cost import Cost
from metagen.sampling import SamplingParams
from metagen.strategies.tree.node import Node, StepConfig

if TYPE_CHECKING:
    import torch

    from metagen.decoding.prompts import Prompt


class Expander(Protocol):
    root: Node
    cost: Cost
    generator: torch.Generator
    has_logprobs: bool

    def expand(self, parents: list[Node], counts: list[int]) -> list[list[Node]]: ...

    def release(self, node: Node) -> None: ...


def open_expander(backend, prompt: Prompt, params: SamplingParams, step: StepConfig, value=None, *,
                  chat: bool | None = None, generator: torch.Generator | None = None) -> Expander:
    """The expander for `backend`: a LanguageModel or a Generator with LOCAL_CACHE -> the local
    `StepExpander`; a Generator with STEP_CONTINUATION -> `RemoteStepExpander`; anything else:
    ValueError naming what is missing. chat None: the generator's own setting."""
    from metagen.decoding.generator import Generator
    from metagen.strategies.tree.expand import StepExpander

    if not isinstance(backend, Generator):
        return StepExpander(backend, prompt, params, step, value, chat=chat, generator=generator)
    if caps.LOCAL_CACHE in backend.capabilities:
        local = backend.local_model()
        return StepExpander(local.model, prompt, params, step, value, chat=local.chat if chat is None else chat,
                            generator=generator)
    caps.require_any([{caps.LOCAL_CACHE}, {caps.STEP_CONTINUATION}], backend, "a step search")
    caps.require_constraint(params, backend, "a step search with structured_outputs")
    from metagen.strategies.tree.remote_expand import RemoteStepExpander

    return RemoteStepExpander(backend, prompt, params, step, value, chat=chat, generator=generator)
