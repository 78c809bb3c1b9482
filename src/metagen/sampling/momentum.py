"""Momentum decoding (Lan, Su, Liu, Huang & Mao, 2022, "Momentum Decoding: Open-ended Text
Generation As Graph Exploration", arXiv:2212.02175).

Generation walks a directed graph whose nodes are the tokens of the text so far (prompt +
output) and whose edges join each token to the next. Greedy decoding degenerates when the walk
enters a circular loop. Momentum decoding takes the greedy step among the k most likely tokens,
but a candidate that returns to a node already in the graph (closes a loop) loses confidence by a
resistance that grows with the depth of the loop:

    x_t = argmax_{v in V_k}  p(v | x_<t) - alpha * f(d(v))

    V_k   = the k tokens of highest p(v | x_<t)                       (`candidates`, k)
    d(v)  = 0 when v is not in the text so far; otherwise the largest m <= D such that the m-gram
            (x_{t-m+1}, ..., x_{t-1}, v) already occurs in the text     (`max_depth`, D)
    f(d)  = d                                                        (the resistance function)

d(v) = 1 means v was seen but never after the current context; d(v) = m means stepping to v
would repeat the last m - 1 tokens and v, i.e. walk an m-token circle again. Each further step
round the same loop raises d by one up to D, so the resistance grows for as long as the walk stays
on the loop, and a fresh token among the k candidates wins.

Where the published material had to be read (the paper's full text was not at hand while writing
this; the formula above is the one of the authors' released code, gmftbyGMFTBY/MomentumDecoding):
  * nodes are tokens, and the depth is the longest repeated n-gram that stepping to v closes,
    capped at D (`max_length=5` in that code). It is not a count of visits to an n-gram node:
    revisiting a node raises the resistance only through the depth, as that code measures it.
  * f is a lookup table there, in several versions: the one labelled for GPT2-XL is f(d) = d,
    used here; others are (1, 3, 4, 5, 6) for d = 1..5, an n-gram-blocking-like (0, 0, 0, 5),
    and constant / log / exponential ablations. A table other than f(d) = d is not offered.
  * alpha = 0.2 is that code's default; k is set per run by the authors' scripts: 5 is ours.
  * p is the model's probability after every earlier processor of the chain (bias, penalties,
    n-gram bans, a constraint's mask), so those compose with momentum decoding.
  * ties between equal scores go to the lower token id (the authors' code: the likelier one).

As a processor, `apply` returns the momentum score p(v) - alpha * d(v) for the k candidates and
-inf for every other token (and for a candidate whose logit is -inf): its argmax is the
momentum-decoding step. The score is not a logit, so momentum decoding runs under greedy
decoding only (`SamplingParams` refuses it with temperature > 0).

Time complexity per step: O(T D + V + k) per row (one suffix match over the history, one
scatter-max into the vocabulary, a top-k).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._common import NEG_INF, float_logits
from ._history import TokenHistoryState
from ._tokens import PAD, PromptIds


def loop_depths(history: Tensor, max_depth: int, vocab_size: int) -> Tensor:
    """d(v) for every token: `history (N, T)` left-padded with -1 -> `(N, V)` long in [0, D].

    For every past position i, the loop closed by stepping to x_i again has depth
    1 + (the number of tokens before i that match the last tokens of the history, up to D - 1);
    d(v) is the deepest over the positions holding v.

    Time complexity: O(T D + V) per row.
    """
    rows, length = history.shape
    depths = torch.zeros(rows, vocab_size, dtype=torch.long, device=history.device)
    if length == 0:
        return depths
    context = max_depth - 1  # tokens matched before the candidate
    if context > 0:
        padded = torch.nn.functional.pad(history, (context, 0), value=PAD)  # (N, T + D - 1)
        # before[n, i, j] = x_{i-1-j}: the j-th token before position i
        before = padded[:, :length + context - 1].unfold(1, context, 1).flip(-1)  # (N, T, D - 1)
        suffix = padded[:, -context:].flip(-1)  # (N, D - 1): x_T, x_{T-1}, ...
        same = (before == suffix[:, None, :]) & (before >= 0) & (suffix >= 0)[:, None, :]
        matched = same.long().cumprod(-1).sum(-1)  # (N, T) consecutive matches from the right
    else:
        matched = torch.zeros_like(history)
    depth = (matched + 1) * (history >= 0)  # (N, T), 0 at padding
    return depths.scatter_reduce_(1, history.clamp(min=0), depth, reduce="amax")


def momentum_scores(logits: Tensor, history: Tensor, max_depth: int, resistance: float,
                    candidates: int) -> Tensor:
    """The momentum score of the top `candidates` tokens, -inf elsewhere: `logits (N, V)`,
    `history (N, T)` left-padded -> new float32 `(N, V)` whose argmax is the momentum step.

    Time complexity: O(T D + V + k) per row.
    """
    logits = float_logits(logits)
    probabilities = torch.softmax(logits, dim=-1)  # (N, V)
    pool = torch.topk(logits, min(candidates, logits.shape[-1]), dim=-1).indices  # (N, k)
    depth = loop_depths(history, max_depth, logits.shape[-1]).gather(1, pool)  # (N, k)
    score = probabilities.gather(1, pool) - resistance * depth.float()  # p(v) - alpha * f(d), f(d) = d
    score = score.masked_fill(logits.gather(1, pool) == NEG_INF, NEG_INF)  # a banned candidate stays out
    return torch.full_like(logits, NEG_INF).scatter_(1, pool, score)


def _check(max_depth: int, resistance: float, candidates: int) -> None:
    if isinstance(max_depth, bool) or not isinstance(max_depth, int) or max_depth < 1:
        raise ValueError(f"max_depth={max_depth!r} is out of range: must be an int >= 1")
    if isinstance(resistance, bool) or not isinstance(resistance, (int, float)) or not resistance > 0:
        raise ValueError(f"resistance={resistance!r} is out of range: must be a number > 0")
    if isinstance(candidates, bool) or not isinstance(candidates, int) or candidates < 1:
        raise ValueError(f"candidates={candidates!r} is out of range: must be an int >= 1")


class MomentumState(TokenHistoryState):
    """Each row's tokens (prompt + generated) and the momentum score over them (a `LogitsProcessor`).

    Attributes:
        max_depth: D, the longest repeated n-gram the loop depth counts.
        resistance: alpha, the resistance per unit of depth.
        candidates: k, the tokens of highest probability that are ranked.
    """

    name = "momentum"
    argmax_invariant = False

    def __init__(self, history: Tensor, max_depth: int, resistance: float = 0.2, candidates: int = 5,
                 capacity: int | None = None) -> None:
        _check(max_depth, resistance, candidates)
        self.max_depth, self.resistance, self.candidates = max_depth, float(resistance), candidates
        super().__init__(history, capacity)

    @classmethod
    def from_prompt(cls, prompt_ids: PromptIds, batch_size: int, max_depth: int, resistance: float = 0.2,
                    candidates: int = 5, max_new_tokens: int = 0,
                    device: torch.device | str | None = None) -> MomentumState:
        """State after the prompt (the prompt's tokens are nodes of the graph); room is reserved
        for `max_new_tokens` generated tokens."""
        prompts, capacity = cls.prompt_rows(prompt_ids, batch_size, max_new_tokens, device)
        return cls(prompts, max_depth, resistance, candidates, capacity=capacity)

    def depths(self, vocab_size: int) -> Tensor:
        """`(B, V)` loop depth d(v) of every token for each row's next step."""
        return loop_depths(self.tokens(), self.max_depth, vocab_size)

    def apply(self, logits: Tensor) -> Tensor:
        """`logits (B, V)` -> momentum scores `(B, V)` (-inf outside the k candidates); input untouched."""
        return momentum_scores(logits, self.tokens(), self.max_depth, self.resistance, self.candidates)
