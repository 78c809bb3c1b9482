r"""PEARL: parallel speculative decoding with adaptive draft length (Liu et al. 2024).

The draft model and the target run at the same time. A round is one target forward, over the
row's last committed token t0 and the draft tokens D not yet verified, while the draft model
drafts γ tokens e_1..e_γ after t0 + D in another thread:

    pre-verify  (D empty):    target: [t0]               draft: e_1..e_γ after the context
                              e_1 is verified against the target's distribution after t0
    post-verify (D = e_2..e_γ of the last round, γ − 1 tokens):
                              target: [t0] + D           draft: e'_1..e'_γ after the context + D
                              D is verified, then e'_1 against the distribution after D

Every verified token is accepted with probability min(1, q(x)/p(x)), the first rejection is
replaced by a draw from norm(max(0, q − p)) (token verification, Leviathan et al. 2023). When D
and e_1 are all accepted, e_1 is the round's last token — no bonus token is drawn — and e_2..e_γ,
drafted during the round, are next round's D (post-verify); any rejection empties D (back to
pre-verify). So a round costs max(γ·t_draft, t_target) when both run in parallel, the draft
keeps drafting as long as the target keeps accepting (the adaptive draft length), and a
rejection of e_1 costs one round with one target forward and no wasted verification. The last
token of a round is a one-token speculative draw from q after D, so each emitted token follows
exactly the target's distribution (`pearl_verify`); at temperature 0 the rules are greedy
verification and e_1 is kept when it is the target's argmax.

`PearlDrafter` wraps a `ModelDrafter` (any draft model: a smaller one, the target's first
layers, a quantized copy); `PearlVerification` is the token rule with that last draw. With
`parallel=True` the draft runs in a worker thread (torch releases the GIL in its kernels), each
thread with its own intra-op thread count; `PearlDrafter.stats` records each round's draft and
target seconds, so `PearlStats.ideal_parallel_seconds` (Σ per round max(draft, target) plus the
serial rest) can be set against the measured time.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import torch
from torch import Tensor

from metagen.decoding.batch import RowBatch
from metagen.decoding.cost import forward_flops
from metagen.decoding.drafts import Draft
from metagen.speculative.drafters import ModelDrafter
from metagen.speculative.rule_verification import RuleVerification
from metagen.speculative.token_verify import token_verify
from metagen.speculative.verify import sample_residual

__all__ = ["PearlDraft", "PearlDrafter", "PearlStats", "PearlVerification", "pearl_verify"]


def pearl_verify(draft: Tensor, p: Tensor, q: Tensor, generator: torch.Generator | None = None
                 ) -> tuple[int, int]:
    """Token verification of γ ≥ 1 draft tokens against γ target rows (no bonus row).

    draft: (γ,) Long; p, q: (γ, V), row i the draft / target distribution x_{i+1} is judged by.
    x_i is accepted while u_i·p_i(x_i) < q_i(x_i); at the first rejection τ < γ the token is
    drawn from norm(max(0, q_τ − p_τ)), returning (τ, token); when all γ pass, the last draft
    token is the token: (γ − 1, x_γ). Either way the token after the τ kept ones follows q_τ.
    Time complexity: O(γ·V).
    """
    gamma = draft.shape[0]
    if gamma == 0 or p.shape != q.shape or p.shape[0] != gamma:
        raise ValueError(f"pearl_verify needs draft (γ,) with γ >= 1 and p, q (γ, V) alike, got {tuple(draft.shape)}, "
                         f"{tuple(p.shape)}, {tuple(q.shape)}")
    index = draft[:, None]
    u = torch.rand(gamma, generator=generator, device=q.device)
    accepted = (u * p.gather(1, index).squeeze(1) < q.gather(1, index).squeeze(1)).long()  # (γ,)
    tau = int(accepted.cumprod(0).sum())
    if tau == gamma:
        return gamma - 1, int(draft[-1])
    row = q[tau : tau + 1]
    return tau, int(sample_residual((row - p[tau : tau + 1].to(row.dtype)).clamp(min=0), row, generator)[0])


@dataclass
class PearlStats:
    """Per round (one target forward): the draft's and the target's seconds and the round's wall
    seconds (from one proposal to the next); draft forwards in all, the pre-verify rounds (no row
    had draft tokens left to verify), and the e_1 verified in place of a bonus token and kept
    (`Cost.draft_tokens` / `accepted_tokens` count the tokens of D, which the loop feeds)."""

    draft_seconds: list[float] = field(default_factory=list)
    target_seconds: list[float] = field(default_factory=list)
    round_seconds: list[float] = field(default_factory=list)
    draft_forwards: int = 0
    pre_verify_rounds: int = 0
    next_verified: int = 0
    next_kept: int = 0

    @property
    def rounds(self) -> int:
        return len(self.round_seconds)

    @property
    def ideal_parallel_seconds(self) -> float:
        """Σ per round max(draft, target) + the rest of the round (verification, bookkeeping),
        from times measured with `parallel=False` (a round there is draft + target + rest)."""
        return sum(total - d - t + max(d, t)
                   for d, t, total in zip(self.draft_seconds, self.target_seconds, self.round_seconds))


@dataclass
class PearlDraft(Draft):
    """A chain draft whose next token e_1 (drafted while the target runs) `wait()` delivers."""

    owner: PearlDrafter | None = None

    def wait(self) -> list[tuple[int, Tensor | None] | None]:
        """Per row: (e_1, its draft distribution (V,) or None when greedy), or None (no draft)."""
        return self.owner.wait()


class PearlDrafter(ModelDrafter):
    """PEARL's draft side: hands the loop the tokens drafted last round (D) and drafts γ more
    after them while the target verifies D (see the module docstring).

    model: the draft model (the target's vocabulary). parallel: draft in a worker thread during
    the target's forward (False: draft first, then the target, same tokens and random draws).
    threads: intra-op threads of each of the two threads when parallel (None: half of torch's
    current count, at least 1); the caller's count is restored by `finish`.
    """

    def __init__(self, model, *, parallel: bool = True, threads: int | None = None, name: str = "pearl",
                 share_prompt_cache: bool = False) -> None:
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
            raise ValueError(f"threads={threads!r} must be an int >= 1 or None")
        super().__init__(model, name=name, share_prompt_cache=share_prompt_cache)
        self.parallel, self.threads = parallel, threads
        self.stats = PearlStats()
        self._ahead: list[tuple[list[int], Tensor | None]] = []  # per row: drafted tokens after the context
        self._executor: ThreadPoolExecutor | None = None
        self._caller_threads: int | None = None
        self._job: Future | None = None
        self._drafted: Draft | None = None
        self._true_lengths: list[int] = []
        self._round_start: float | None = None
        self._planned: tuple[int, float] = (0, 0.0)
        self._target_start = 0.0

    def for_request(self) -> PearlDrafter:
        """A copy for one request of the serving engine, drafting serially (`parallel=False`):
        the engine's one thread runs every request's forwards and sets the process's thread
        count, so a copy neither starts a worker nor changes that count. Its rounds, tokens and
        random draws are PEARL's; only the overlap of drafting with the target's forward is lost."""
        copy = super().for_request()
        copy.parallel, copy._executor, copy._caller_threads, copy._job = False, None, None, None
        copy.stats = PearlStats()
        return copy

    def start(self, prompt_ids: Sequence[int], batch_size: int, target_cache=None) -> None:
        self.finish([])  # a request that ended without finish() leaves nothing running
        super().start(prompt_ids, batch_size, target_cache)
        self.stats = PearlStats()
        self._ahead = [([], None) for _ in range(batch_size)]
        if self.parallel:
            self._caller_threads = torch.get_num_threads()
            each = self.threads or max(1, self._caller_threads // 2)
            torch.set_num_threads(each)
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="pearl-draft",
                                                initializer=torch.set_num_threads, initargs=(each,))

    def finish(self, outputs: Sequence[Sequence[int]]) -> None:
        self._join()
        self._close_round()
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        if self._caller_threads is not None:
            torch.set_num_threads(self._caller_threads)
            self._caller_threads = None

    def select(self, rows: Sequence[int]) -> None:
        self._join()
        super().select(rows)
        self._ahead = [self._ahead[r] for r in rows]

    def propose(self, contexts, lengths, chain, generator) -> Draft:
        self._join()
        self._close_round()
        self._round_start = time.perf_counter()
        batch = len(contexts)
        pending = [(tokens[:n], None if probs is None else probs[: min(n, len(tokens))])
                   for (tokens, probs), n in zip(self._ahead, lengths)]
        ahead = [tokens for tokens, _ in pending]
        probe = chain.fork(torch.arange(batch))  # the chain after each row's D, for drafting past it
        for j in range(max((len(tokens) for tokens in ahead), default=0)):
            probe.accept(torch.tensor([tokens[j] if j < len(tokens) else -1 for tokens in ahead], dtype=torch.long))
        extended = [list(context) + tokens for context, tokens in zip(contexts, ahead)]
        self._true_lengths = [len(context) for context in contexts]
        calls, flops = self._planned = self._planned_cost(extended, lengths)
        self.stats.pre_verify_rounds += sum(not tokens for tokens in ahead) == batch
        if self.parallel:
            self._job = self._executor.submit(self._draft, extended, lengths, probe, generator)
        else:
            self._job = Future()
            self._job.set_result(self._draft(extended, lengths, probe, generator))
        self._target_start = time.perf_counter()
        draft = PearlDraft.chain(ahead, [probs for _, probs in pending], calls, flops)
        draft.owner = self
        return draft

    def wait(self) -> list[tuple[int, Tensor | None] | None]:
        """Block until this round's drafting ends; each row's e_1 (see `PearlDraft.wait`)."""
        self._join()
        drafted = self._drafted
        return [(tokens[0], None if probs is None else probs[0]) if tokens else None
                for tokens, probs in zip(drafted.tokens, drafted.probs)]

    def _join(self) -> None:
        """Collect the round's drafting job, if one runs (every method touching the draft's cache
        or its tokens joins first, whichever verification the loop runs)."""
        if self._job is not None:
            self.stats.target_seconds.append(time.perf_counter() - self._target_start)
            job, self._job = self._job, None
            self._drafted, seconds = job.result()  # re-raises what the worker raised
            self.stats.draft_seconds.append(seconds)
            self.stats.draft_forwards += self._drafted.calls
            if self._drafted.calls != self._planned[0] or not math.isclose(self._drafted.flops, self._planned[1],
                                                                           rel_tol=1e-9):
                raise RuntimeError(f"the {self.name} draft spent {self._drafted.calls} calls, {self._drafted.flops} "
                                   f"FLOPs, not the {self._planned} counted for it")
            self._committed = list(self._true_lengths)  # D is not committed: the next catch-up checks it

    def observe(self, fed, logits, committed=None) -> None:
        self._join()
        if committed is None or self._drafted is None:
            return
        for b, ((nodes, token), fed_row) in enumerate(zip(committed, fed)):
            tokens, probs = self._drafted.tokens[b], self._drafted.probs[b]
            kept_all = len(nodes) == len(fed_row) - 1  # every token of D accepted
            kept_next = kept_all and bool(tokens) and tokens[0] == token
            self.stats.next_verified += kept_all and bool(tokens)
            self.stats.next_kept += kept_next
            self._ahead[b] = (tokens[1:], None if probs is None else probs[1:]) if kept_next else ([], None)

    def _draft(self, contexts, lengths, probe, generator) -> tuple[Draft, float]:
        """γ_b tokens after each extended context (the worker thread's job); (draft, seconds)."""
        started = time.perf_counter()
        drafted = ModelDrafter.propose(self, contexts, lengths, probe, generator)
        return drafted, time.perf_counter() - started

    def _planned_cost(self, contexts, lengths) -> tuple[int, float]:
        """Calls and FLOPs `ModelDrafter.propose` will spend (it drafts every row's full length:
        no confidence stop), known before the worker runs it."""
        longest = max(lengths, default=0)
        if longest == 0:
            return 0, 0.0
        flops = 0.0
        for b, context in enumerate(contexts):
            keep = self._confirmed_length(b, context)
            flops += forward_flops(self.model, keep, len(context) - keep)
            flops += sum(forward_flops(self.model, len(context) + step, 1) for step in range(longest - 1))
        return longest, flops

    def _close_round(self) -> None:
        if self._round_start is not None:
            self.stats.round_seconds.append(time.perf_counter() - self._round_start)
            self._round_start = None


class PearlVerification(RuleVerification):
    """Token verification of D, then the round's last token by `pearl_verify` against the
    drafter's e_1 when D is all accepted (greedy verification at temperature 0); drafts without
    an e_1 (not a `PearlDraft`, or a row with no budget left) draw it from q as the token rule does."""

    def __init__(self) -> None:
        super().__init__(token_verify, "pearl")

    def verify(self, batch: RowBatch, logits: Tensor, draft: Draft):
        self._next = draft.wait() if isinstance(draft, PearlDraft) else [None] * len(draft.tokens)
        return (yield from super().verify(batch, logits, draft))

    def outcomes(self, batch: RowBatch, processed: Tensor, draft: Draft) -> list[tuple[int, int]]:
        if batch.params.greedy:  # greedy verification; e_1 is kept when it is the argmax
            return super().outcomes(batch, processed, draft)
        out, vocab = [], batch.model.vocab_size
        for b, (tokens, probs, candidate) in enumerate(zip(draft.tokens, draft.probs, self._next)):
            gamma = len(tokens)
            q = torch.softmax(processed[b, : gamma + 1], dim=-1)  # (γ' + 1, V): D's positions, then the next
            ids = torch.tensor(tokens, dtype=torch.long)
            p = probs if probs is not None else torch.zeros(gamma, vocab).scatter_(1, ids[:, None], 1.0)
            p = p.to(q.dtype)  # (γ', V); point masses for a deterministic D
            if candidate is not None:  # D, then e_1 in place of the bonus draw
                token, p_next = candidate
                ids = torch.cat([ids, torch.tensor([token])])
                out.append(pearl_verify(ids, torch.cat([p, p_next[None].to(q.dtype)]), q, batch.generator))
            elif gamma:
                tau, token = token_verify(ids, p, q, batch.generator)
                out.append((int(tau), int(token)))
            else:  # nothing drafted: the token is a draw from q
                out.append((0, int(sample_residual(q[:1], q[:1], batch.generator)[0])))
        return out
