"""Blockwise controlled decoding (Mudgal et al. 2024; a "best-of-n++").

    node = root
    repeat: K blocks of M tokens continue node (one batched expand from its cached prefix)
            node = the block whose prefix value V is highest
    until the kept block finishes the solution

The user waits for one block at a time (K rows decode together), while the effective number of
candidates compared grows like K per block. With M = the whole answer it is best-of-K by the
value; with M = 1 it is greedy decoding of the value-tilted distribution (argmax rather than the
tokenwise sampler). Cost: K · (tokens of the answer) generated, one value call per block.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from metagen.decoding.result import GenerationResult
from metagen.strategies import runners
from metagen.strategies.options import option
from metagen.strategies.spec import register
from metagen.strategies.tree.expander import open_expander
from metagen.strategies.tree.leaves import TreeConfig, finish_search
from metagen.strategies.tree.node import StepConfig

if TYPE_CHECKING:
    import torch

    from metagen.decoding.prompts import Prompt


@dataclass(frozen=True)
class BlockwiseCDConfig(TreeConfig):
    """K, M and the limit on kept blocks (TreeConfig: the rest). The steps are the blocks: `step`
    is derived (StepConfig(None, M)) and must not be given."""

    step: StepConfig | None = None  # not `nested`: derived from block_tokens
    blocks: int = option(4, int, "K, candidate blocks per block", low=1, sizes_work=True)
    block_tokens: int = option(16, int, "M, tokens per block", low=1)
    max_blocks: int = option(64, int, "limit on kept blocks", low=1, sizes_work=True)

    def __post_init__(self) -> None:
        super().__post_init__()
        blocks = StepConfig(delimiter=None, max_step_tokens=self.block_tokens)
        if self.step is not None and self.step != blocks:  # (dataclasses.replace passes the derived one back)
            raise ValueError(f"step={self.step} is given, but blockwise CD's steps are blocks of block_tokens "
                             "tokens; set block_tokens instead")
        object.__setattr__(self, "step", blocks)


def blockwise_cd(model, prompt: Prompt, value, config: BlockwiseCDConfig | None = None, *,
                 chat: bool | None = None, rng: torch.Generator | None = None) -> GenerationResult:
    if value is None:
        raise ValueError("blockwise controlled decoding ranks blocks by a value: pass a PrefixValue")
    config = config or BlockwiseCDConfig()
    expander = open_expander(model, prompt, config.params, config.step, value, chat=chat, generator=rng)
    node = expander.root
    for _ in range(config.max_blocks):
        children = expander.expand([node], [config.blocks])[0]
        expander.release(node)
        node = max(children, key=lambda c: c.value)
        for child in children:
            if child is not node:
                expander.release(child)
        if node.finished:
            break
    return finish_search(expander, [node] if node.finished else [], config, [node])  # one candidate


register(runners.tree_spec("blockwise_cd", "blockwise controlled decoding: best of n blocks of 16 tokens (--value)",
                           blockwise_cd, BlockwiseCDConfig, lambda n, params: {"blocks": n}, {"blocks"},
                           fixed_step=True, defaults={"block_tokens": runners.BLOCK_TOKENS}.items()), __name__)
