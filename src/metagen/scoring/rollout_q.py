"""Q̂ by rollouts: the value of a prefix as the reward of a model's continuations of it, for
Transfer Q* (Chakraborty et al. 2024; `strategies/transfer_q.py`).

    Q̂(x, y) = (1/m) Σ_i r(x, y∘τ_i),                 τ_i ~ π_BL(· | x, y), |τ_i| ≤ L   (direct)
    Q̂(x, y) = Σ_i w_i r(x, y∘τ_i) / Σ_i w_i,          w_i = exp((r − r_BL)(x, y∘τ_i) / α)  (indirect)

π_BL is the rollout (baseline) model, greedy or sampled at temperature 1; r and r_BL are
`PrefixValue`s of whole sequences. The self-normalised weights of the second line are the
importance ratio π*_r / π_BL of a baseline that is the KL(·‖π_ref)-optimum for r_BL with weight α,
whose unknown normaliser cancels.

The baseline keeps its own cache across calls: the prompt once, then per call one ragged forward
feeding each distinct state its new tokens from the longest cached prefix (in tokenwise decoding,
the previous call's chosen candidate, held as a snapshot: a page-table hold, no K/V copy), the
m rollout rows of each state forked from it, and one forward per rollout token over the rows
still going. Cost of a call of N continuations: 1 + L baseline forwards over at most N·m rows and
one reward call (two for indirect transfer) over at most N·m sequences, all in `Values.cost`
(FLOPs in `scorer_flops` too). Rollouts end at a stop token, at L tokens, at `max_tokens`
completion tokens or at the baseline's context; stop strings are not looked for in them.
"""

from __future__ import annotations

from collections.abc import Collection

import torch

from metagen.decoding.cost import Cost, forward_cost, prefill_cost
from metagen.scoring.process_reward import PrefixValue, Values


class RolloutQ(PrefixValue):
    """Q̂ of the module docstring: `values(prompt_ids, continuations)`, N continuations y in a batch.

    baseline: the LanguageModel rolling out; reward: a PrefixValue of whole sequences (text or
    ids; not one reading hidden states); rollouts: m; rollout_tokens: L (0: Q̂ = r(x, y));
    sample: sampled rollouts (else greedy); max_tokens: no rollout runs past this many completion
    tokens; stop_ids: the tokens ending one; generator: the sampled rollouts' randomness;
    baseline_reward, alpha: indirect transfer (both None: direct). The states it keeps are one
    prompt's (the first call's); `close` releases them (then any prompt may follow)."""

    def __init__(self, baseline, reward: PrefixValue, *, rollouts: int = 1, rollout_tokens: int = 16,
                 sample: bool = False, max_tokens: int = 256, stop_ids: Collection[int] = frozenset(),
                 generator: torch.Generator | None = None, baseline_reward: PrefixValue | None = None,
                 alpha: float | None = None) -> None:
        for value in (reward, baseline_reward):
            if value is not None and value.needs_hidden:
                raise ValueError(f"{type(value).__name__} reads hidden states, but Transfer Q*'s reward scores "
                                 "finished rollouts: give a reward of the sequences (a Scorer, --value steps, "
                                 "judge, prm:PATH or reward:URL)")
        if (baseline_reward is None) != (alpha is None):
            raise ValueError(f"alpha={alpha!r}: indirect transfer needs baseline_reward and alpha together")
        if alpha is not None and not alpha > 0:
            raise ValueError(f"alpha={alpha!r} is out of range: must be > 0")
        if rollouts < 1 or rollout_tokens < 0:
            raise ValueError(f"rollouts={rollouts}, rollout_tokens={rollout_tokens}: must be >= 1 and >= 0")
        self.baseline, self.reward, self.baseline_reward, self.alpha = baseline, reward, baseline_reward, alpha
        self.rollouts, self.rollout_tokens, self.sample, self.max_tokens = rollouts, rollout_tokens, sample, max_tokens
        self.stop_ids, self.generator = frozenset(stop_ids), generator
        self.cache, self.prompt_ids = None, []
        self._states: dict[tuple[int, ...], tuple[object, torch.Tensor]] = {}  # prefix → (snapshot, logits (V,))

    def values(self, prompt_ids, continuations, hidden=None) -> Values:
        cost = Cost()
        if self.cache is not None and list(prompt_ids) != self.prompt_ids:
            raise ValueError("RolloutQ keeps one prompt's states: close it (or make another) for a new prompt")
        if self.cache is None:  # the prompt, once
            self.prompt_ids = list(prompt_ids)
            self.cache, out = self.baseline.prefill(self.prompt_ids, batch_size=1)
            self._states[()] = (self.cache.snapshot(0), out.logits[0])
            cost += prefill_cost(self.baseline, len(prompt_ids), produced=False)
        unique = list(dict.fromkeys(tuple(c) for c in continuations))
        logits, advanced = self._advance(len(prompt_ids), unique)  # (U, V): each state's next token
        cost += advanced
        row_of = {key: u for u, key in enumerate(unique)}
        sequences, owners = self._rollouts(len(prompt_ids), unique, [row_of[tuple(c)] for c in continuations],
                                           logits, cost)
        rewards = self._score(prompt_ids, sequences, self.reward, cost)
        weights = [1.0] * len(sequences)
        if self.baseline_reward is not None:  # indirect transfer: w = exp((r − r_BL) / α), self-normalised
            baseline_rewards = self._score(prompt_ids, sequences, self.baseline_reward, cost)
            weights = [(r - b) / self.alpha for r, b in zip(rewards, baseline_rewards)]  # log w
        groups: list[list[int]] = [[] for _ in continuations]  # the sequences of each continuation
        for i, owner in enumerate(owners):
            groups[owner].append(i)
        estimates = []
        for mine in groups:
            r = torch.tensor([rewards[i] for i in mine], dtype=torch.float64)
            if self.baseline_reward is None:
                estimates.append(float(r.mean()))
            else:
                w = torch.softmax(torch.tensor([weights[i] for i in mine], dtype=torch.float64), 0)
                estimates.append(float(w @ r))
        cost.scorer_flops = cost.flops
        return Values(estimates, cost)

    def _advance(self, prompt_length: int, unique: list[tuple[int, ...]]):
        """Bring the cache to the U states `unique` (each from its longest cached prefix, one
        ragged forward), keep them as the new cached states; their next-token logits (U, V)."""
        bases = []
        for key in unique:
            cut = len(key) - 1
            while key[:cut] not in self._states:  # the previous step's candidate, else a shorter prefix
                cut -= 1
            bases.append(key[:cut])
        self.cache.restore([self._states[base][0] for base in bases])
        cost = Cost(prompt_tokens_reused=sum(prompt_length + len(base) for base in bases))
        out = self.baseline.forward(self.cache, [list(key[len(base):]) for key, base in zip(unique, bases)])
        cost += forward_cost(self.baseline, [prompt_length + len(base) for base in bases],
                             [len(key) - len(base) for key, base in zip(unique, bases)], produced=False)
        old, prompt_state = self._states, self._states.pop(())
        self._states = {(): prompt_state}
        for u, key in enumerate(unique):
            self._states[key] = (self.cache.snapshot(u), out.logits[u])
        for snapshot, _ in old.values():
            self.cache.release(snapshot)
        return out.logits, cost

    def _rollouts(self, prompt_length: int, unique, rows: list[int], logits, cost):
        """m continuations of at most L tokens from each continuation's state (row `rows[j]` of
        the cache): (the sequences y∘z∘τ, the continuation each belongs to). A continuation that
        already ended (a stop token, max_tokens) is its own single sequence. Adds the forwards to
        `cost`."""
        m, max_tokens = self.rollouts, self.max_tokens
        sequences, owners, sources = [], [], []
        for j, u in enumerate(rows):
            key = unique[u]
            room = min(self.rollout_tokens, max_tokens - len(key),
                       self.baseline.max_context - prompt_length - len(key))
            ended = key[-1] in self.stop_ids or room <= 0
            for _ in range(1 if ended else m):
                sequences.append(list(key))
                owners.append(j)
                if not ended:
                    sources.append((len(sequences) - 1, u, room))
        if not sources:
            return sequences, owners
        self.cache.select([u for _, u, _ in sources])
        live = [(index, room) for index, _, room in sources]  # (sequence, tokens it may still take)
        logits = logits[[u for _, u, _ in sources]]  # (R, V)
        while live:
            if not self.sample:
                tokens = torch.argmax(logits, dim=-1)  # (R,)
            else:
                probs = torch.softmax(logits.double(), dim=-1)
                tokens = torch.multinomial(probs, 1, generator=self.generator).squeeze(1)
            going = []
            for r, ((index, room), token) in enumerate(zip(live, tokens.tolist())):
                sequences[index].append(token)
                if token not in self.stop_ids and room > 1:
                    going.append(r)
            if not going:
                break
            self.cache.select(going)  # ended rollouts leave; the rest take their token
            starts = [prompt_length + len(sequences[live[r][0]]) - 1 for r in going]
            out = self.baseline.forward(self.cache, tokens[going].reshape(-1, 1))
            cost += forward_cost(self.baseline, starts, produced=False)
            live = [(live[r][0], live[r][1] - 1) for r in going]
            logits = out.logits
        return sequences, owners

    @staticmethod
    def _score(prompt_ids, sequences, reward: PrefixValue, cost) -> list[float]:
        scored = reward.values(prompt_ids, sequences)
        cost += scored.cost
        return list(scored.values)

    def close(self) -> None:
        """Release every cached state (the value can be used again: it prefills anew)."""
        for snapshot, _ in self._states.values():
            self.cache.release(snapshot)
        self._states, self.cache = {}, None
