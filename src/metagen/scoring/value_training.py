"""Data and training for the prefix value head (CD-FUDGE, see `value_head.py`).

Data: `collect_value_data` (one prefill per problem, one batched forward over its n sampled
completions, keeping all |y| + 1 prefix states; with `next_top_k`, also the states one token
further along the model's top-k next tokens at every prefix, for CD-Q's exact Bellman target). Training: `train_value_head` (full-batch AdamW
on BCE, completions or whole problems held out; report AUC, Brier score and ECE at prefix
fractions).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from metagen.decoding.cost import Cost, forward_flops
from metagen.scoring.base import Verifier
from metagen.scoring.value_head import ValueHead, model_identity

REPORT_FRACTIONS = (0.0, 0.25, 0.5, 0.75, 1.0)


# ------------------------------------------------------------------------------ data
@dataclass
class ValueDataset:
    """Prefix states of sampled completions, each labelled with its completion's reward.

    hidden: (N, H) float32, row i = the state after prompt + `position[i]` completion tokens.
    labels: (N,) float32 in {0, 1}; completion: (N,) long, the completion row i comes from;
    position: (N,) long, t in 0..length. lengths: (C,) completion token counts;
    rewards: (C,) completion rewards; problem: (C,) long, problem index of each completion.
    sequences: per completion, prompt + completion token ids; identity: `model_identity` of the
    LM; cost: sampling plus the prefix forwards.
    next_hidden: (N, k, H) or None: row i's state after one more token z_j, the model's top-k
    next tokens after that prefix (zeros at a completion's last prefix, which has no next step);
    next_probs: (N, k) p(z_j | prefix) at temperature 1 (the base model's, as the Bellman
    identity takes it); next_sampled: (N,) bool, the completion's own next token is among the k.
    """

    hidden: torch.Tensor
    labels: torch.Tensor
    completion: torch.Tensor
    position: torch.Tensor
    lengths: torch.Tensor
    rewards: torch.Tensor
    problem: torch.Tensor
    sequences: list[list[int]] = field(default_factory=list)
    identity: dict[str, str] = field(default_factory=dict)
    cost: Cost = field(default_factory=Cost)
    next_hidden: torch.Tensor | None = None
    next_probs: torch.Tensor | None = None
    next_sampled: torch.Tensor | None = None


def collect_value_data(
    model,
    problems: Sequence,
    verifier_for: Callable[[object], Verifier],
    samples_per_problem: int,
    params,
    *,
    prompt_suffix: str = "",
    chat: bool | None = None,
    generator: torch.Generator | None = None,
    next_top_k: int = 0,
) -> ValueDataset:
    """Sample `samples_per_problem` completions per problem, label each with its verifier and keep
    the hidden state at every prefix. problems: objects with `.question` (eval.tasks.Problem).

    Per problem: one generate (LocalGenerator), then one prefill of the prompt (hidden at t = 0)
    and one batched forward of its non-empty completions with logits="all" (hidden (B, T, H) at
    t = 1..|y|). Time: O(Σ |x| + |y|) forward tokens beyond sampling.
    `next_top_k` = k > 0 (`method="cd_q_exact"`'s data): per completion, one more forward of a
    token tree (models/token_tree.py) from the prompt: the completion's chain, and under each
    prefix t < |y| its k most likely next tokens as leaves, so each leaf's state is that of
    [x, y^t, z] alone; O(|y|·(k + 1)) more forward tokens per completion.
    """
    if isinstance(next_top_k, bool) or not isinstance(next_top_k, int) or next_top_k < 0:
        raise ValueError(f"next_top_k={next_top_k!r} is out of range: must be an int >= 0")
    from dataclasses import replace

    from metagen.decoding.generator import LocalGenerator

    local = LocalGenerator(model, chat=chat)
    params = replace(params, n=samples_per_problem)
    hidden_rows, labels, completion_ids, positions = [], [], [], []  # per completion, (length + 1, ...)
    next_rows: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []  # per completion, with next_top_k
    lengths, rewards, problem_ids, sequences = [], [], [], []  # per completion
    cost = Cost()
    for index, problem in enumerate(problems):
        prompt = problem.question + prompt_suffix
        result = local.generate(prompt, params, generator=generator)
        cost += result.cost
        verifier = verifier_for(problem)
        prompt_ids = result.prompt_token_ids
        cache, out = model.prefill(prompt_ids, logits="last" if next_top_k else "none", hidden=True)  # (1, H)
        completions = result.completions
        filled = [c for c in completions if c.token_ids]
        prompt_row = cache.snapshot(0) if next_top_k else None
        if filled:
            cache.select([0] * len(filled))
            chain = model.forward(cache, [c.token_ids for c in filled], logits="all", hidden=True)
            states = chain.hidden  # (B, T, H)
        cost += Cost(model_calls=1 + bool(filled), prompt_tokens_computed=len(prompt_ids),
                     flops=forward_flops(model, 0, len(prompt_ids)))
        row = 0
        for completion in completions:
            verdict = verifier.verify(prompt, completion)
            reward = 1.0 if verdict.passed else 0.0
            length = len(completion.token_ids)
            prefix = out.hidden[:1]  # (1, H) state after the prompt alone
            if length:
                prefix = torch.cat([prefix, states[row, :length]])  # (length + 1, H)
                row += 1
                cost += Cost(prompt_tokens_computed=length, flops=forward_flops(model, len(prompt_ids), length))
            if next_top_k:
                width = prefix.shape[-1]
                if length:  # the logits after each prefix t < L: the prompt's, then the chain's
                    before = torch.cat([out.logits[:1], chain.logits[row - 1, :length - 1]])  # (L, V)
                    next_rows.append(_next_states(model, cache, prompt_row, completion.token_ids, before, next_top_k))
                    cost += Cost(model_calls=1, prompt_tokens_computed=length * (next_top_k + 1),
                                 flops=forward_flops(model, len(prompt_ids), length * (next_top_k + 1)))
                else:
                    next_rows.append((torch.zeros(1, next_top_k, width), torch.zeros(1, next_top_k),
                                      torch.zeros(1, dtype=torch.bool)))
            c = len(lengths)
            hidden_rows.append(prefix.float())
            labels.append(torch.full((length + 1,), reward))
            completion_ids.append(torch.full((length + 1,), c, dtype=torch.long))
            positions.append(torch.arange(length + 1))
            lengths.append(length)
            rewards.append(reward)
            problem_ids.append(index)
            sequences.append(list(prompt_ids) + list(completion.token_ids))
        if prompt_row is not None:
            cache.release(prompt_row)
    dataset = ValueDataset(torch.cat(hidden_rows), torch.cat(labels), torch.cat(completion_ids),
                           torch.cat(positions), torch.tensor(lengths), torch.tensor(rewards),
                           torch.tensor(problem_ids), sequences, model_identity(model), cost)
    if next_top_k:
        dataset.next_hidden, dataset.next_probs, dataset.next_sampled = (torch.cat(part) for part in zip(*next_rows))
    return dataset


def _next_states(model, cache, prompt_row, tokens: list[int], before: torch.Tensor, k: int):
    """One completion's rows of `next_hidden (L + 1, k, H)`, `next_probs (L + 1, k)`,
    `next_sampled (L + 1,)`: `before (L, V)` holds the logits after each prefix t < L; the cache
    goes back to the prompt row and one tree forward feeds the chain y_1..y_L then, under prefix t,
    its top-k tokens (parent: chain node t − 1, or −1 under the prompt). The last prefix (t = L)
    has no next step: zeros, and `next_sampled` False."""
    length = len(tokens)
    probs = torch.softmax(before.float(), dim=-1)  # (L, V)
    top_probs, top_tokens = probs.topk(k, dim=-1)  # (L, k)
    fed = list(tokens) + top_tokens.flatten().tolist()
    parents = list(range(-1, length - 1)) + [t - 1 for t in range(length) for _ in range(k)]
    cache.restore([prompt_row])
    hidden = model.forward(cache, [fed], logits="all", tree=[parents], hidden=True).hidden[0]  # (L + L·k, H)
    width = hidden.shape[-1]
    next_hidden = torch.zeros(length + 1, k, width)
    next_hidden[:length] = hidden[length:].float().reshape(length, k, width)
    next_probs = torch.zeros(length + 1, k)
    next_probs[:length] = top_probs
    sampled = torch.zeros(length + 1, dtype=torch.bool)
    sampled[:length] = (top_tokens == torch.tensor(tokens)[:, None]).any(dim=-1)
    return next_hidden, next_probs, sampled


# --------------------------------------------------------------------------- metrics
def auc(scores, labels) -> float:
    """Area under the ROC curve = P(s⁺ > s⁻) + ½ P(s⁺ = s⁻) (Mann–Whitney U / (n⁺ n⁻)).

    U = Σ ranks of positives − n⁺(n⁺ + 1)/2 with average ranks for ties. O(N log N).
    NaN when one class is empty.
    """
    scores, labels = np.asarray(scores, dtype=np.float64), np.asarray(labels).astype(bool)
    positives, negatives = int(labels.sum()), int((~labels).sum())
    if positives == 0 or negatives == 0:
        return float("nan")
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(len(scores))
    sorted_scores = scores[order]
    # tie groups [start, end): each element gets the mean of ranks start+1..end
    boundaries = np.flatnonzero(np.diff(sorted_scores)) + 1
    starts = np.concatenate([[0], boundaries])
    ends = np.concatenate([boundaries, [len(scores)]])
    ranks[order] = np.repeat((starts + ends + 1) / 2.0, ends - starts)
    u = ranks[labels].sum() - positives * (positives + 1) / 2.0
    return float(u / (positives * negatives))


def brier(probabilities, labels) -> float:
    """mean (p − y)²."""
    p, y = np.asarray(probabilities, dtype=np.float64), np.asarray(labels, dtype=np.float64)
    return float(np.mean((p - y) ** 2))


def expected_calibration_error(probabilities, labels, bins: int = 10) -> float:
    """ECE = Σ_b (|b| / N) · |mean p_b − mean y_b| over `bins` equal-width bins of [0, 1]."""
    p, y = np.asarray(probabilities, dtype=np.float64), np.asarray(labels, dtype=np.float64)
    index = np.minimum((p * bins).astype(int), bins - 1)
    total = 0.0
    for b in range(bins):
        members = index == b
        if members.any():
            total += members.mean() * abs(p[members].mean() - y[members].mean())
    return float(total)


# --------------------------------------------------------------------------- training
@dataclass(frozen=True)
class PrefixMetrics:
    """Held-out metrics of V at prefix t = round(fraction · |y|) of each held-out completion."""

    fraction: float
    auc: float
    brier: float
    ece: float
    count: int


@dataclass
class ValueReport:
    """train_loss: final mean BCE on training prefixes; held_out_auc: over all held-out prefixes;
    base_rate: share of held-out completions that passed (the Brier score of the constant
    predictor is base_rate · (1 − base_rate)); at_fraction: per prefix fraction."""

    train_completions: int
    held_out_completions: int
    train_loss: float
    held_out_auc: float
    base_rate: float
    at_fraction: list[PrefixMetrics]
    seconds: float


def train_value_head(
    dataset: ValueDataset,
    *,
    mlp_hidden: int | None = None,
    steps: int = 300,
    lr: float = 1e-2,
    weight_decay: float = 1e-2,
    held_out: float = 0.2,
    seed: int = 0,
    group_by_problem: bool = False,
    method: str = "fudge",
    rounds: int = 4,
) -> tuple[ValueHead, ValueReport]:
    """Fit V by full-batch AdamW on mean BCE over all training prefix rows.

    method="fudge" (CD-FUDGE): every prefix's target is its completion's reward r.
    method="cd_q" (CD-Q, Mudgal et al. 2024: the Bellman identity, fitted like DQN): after a CD-FUDGE fit,
    `rounds` times recompute the targets from the current head and refit from there:
        v_t = V_θ([x, y^{t+1}])   (t < |y|),      v_|y| = r
    The identity's v_t = Σ_z p(z | x, y^t) V_θ([x, y^t, z]) needs a forward of every z; the sampled
    next token y_{t+1} ~ p is its one-sample unbiased estimate, and it is already in the data.
    method="cd_q_exact": the same rounds with the identity's sum over the model's top-k next tokens
    K (the data's `next_hidden`, `collect_value_data(next_top_k=k)`), the rest of the mass by the
    sampled token when it falls outside K:
        v_t = Σ_{z ∈ K} p(z | x, y^t) V_θ([x, y^t, z]) + 1[y_{t+1} ∉ K] · V_θ([x, y^{t+1}])
    unbiased for the identity's target like the one-sample one (E[1[y ∉ K] V(y)] = Σ_{z ∉ K} p(z) V(z)),
    exact when K holds every token of positive probability, and of lower variance whenever K
    holds most of the mass.
    Completions are held out whole (a random `held_out` share; with `group_by_problem` all
    completions of a problem go to the same side, so no held-out prompt was seen in training).
    Time: O(steps · N · H) (linear) or O(steps · N · H · M) (MLP), × (1 + rounds) for CD-Q.
    """
    if not 0.0 <= held_out < 1.0:
        raise ValueError(f"held_out={held_out} is out of range: must be in [0, 1)")
    if method not in ("fudge", "cd_q", "cd_q_exact"):
        raise ValueError(f"method={method!r} is not known; choose fudge, cd_q or cd_q_exact")
    if method == "cd_q_exact" and dataset.next_hidden is None:
        raise ValueError("method='cd_q_exact' needs the states after each prefix's top-k next tokens: "
                         "collect the data with collect_value_data(next_top_k=k)")
    if rounds < 1:
        raise ValueError(f"rounds={rounds} is out of range: must be >= 1")
    start = time.perf_counter()
    generator = torch.Generator().manual_seed(seed)
    groups = dataset.problem if group_by_problem else torch.arange(len(dataset.lengths))
    unique = torch.unique(groups)
    shuffled = unique[torch.randperm(len(unique), generator=generator)]
    test_groups = shuffled[: int(round(held_out * len(unique)))]
    test_completion = torch.isin(groups, test_groups)  # (C,)
    test_row = test_completion[dataset.completion]  # (N,)

    head = ValueHead(dataset.hidden.shape[1], mlp_hidden, identity=dataset.identity, generator=generator)
    x = dataset.hidden[~test_row]  # (N_train, H)
    loss = _fit(head, x, dataset.labels[~test_row], steps, lr, weight_decay)
    if method in ("cd_q", "cd_q_exact"):
        last = dataset.position == dataset.lengths[dataset.completion]  # (N,) the state after the last token
        for _ in range(rounds):
            targets = torch.where(last, dataset.labels, bellman_target(head, dataset, method == "cd_q_exact"))
            loss = _fit(head, x, targets[~test_row], steps, lr, weight_decay)

    values = head(dataset.hidden).numpy()  # (N,)
    labels = dataset.labels.numpy()
    test_ids = torch.nonzero(test_completion).flatten()
    at_fraction = []
    for fraction in REPORT_FRACTIONS:
        rows = [_row_of(dataset, int(c), int(round(fraction * int(dataset.lengths[c])))) for c in test_ids]
        p, r = values[rows], labels[rows]
        at_fraction.append(PrefixMetrics(fraction, auc(p, r), brier(p, r) if rows else float("nan"),
                                         expected_calibration_error(p, r) if rows else float("nan"), len(rows)))
    test_mask = test_row.numpy()
    report = ValueReport(
        train_completions=int((~test_completion).sum()), held_out_completions=len(test_ids),
        train_loss=loss, held_out_auc=auc(values[test_mask], labels[test_mask]),
        base_rate=float(dataset.rewards[test_completion].mean()) if len(test_ids) else float("nan"),
        at_fraction=at_fraction, seconds=time.perf_counter() - start,
    )
    return head, report


def bellman_target(head, dataset: ValueDataset, exact: bool) -> torch.Tensor:
    """CD-Q's target v_t (N,) for every row not at a completion's end (those rows' values are
    meaningless): V_θ of the next prefix (one sample), or with `exact` the top-k sum plus the
    sampled next state where it is outside the top k (`train_value_head`)."""
    following = torch.roll(head(dataset.hidden), -1)  # row i + 1 is prefix t + 1 of the same completion
    if not exact:
        return following
    n, k, width = dataset.next_hidden.shape
    candidates = head(dataset.next_hidden.reshape(n * k, width)).reshape(n, k)
    return (dataset.next_probs * candidates).sum(dim=-1) + torch.where(dataset.next_sampled, 0.0, following)


def _fit(head: ValueHead, x: torch.Tensor, targets: torch.Tensor, steps: int, lr: float,
         weight_decay: float) -> float:
    """Full-batch AdamW on mean BCE(σ(logit(x)), targets); returns the final loss."""
    parameters = list(head.params.values())
    for p in parameters:
        p.requires_grad_(True)
    optimizer = torch.optim.AdamW(parameters, lr=lr, weight_decay=weight_decay)
    loss = torch.tensor(float("nan"))
    for _ in range(steps):
        optimizer.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(head.logit(x), targets)
        loss.backward()
        optimizer.step()
    for p in parameters:
        p.requires_grad_(False)
    return float(loss.detach())


def _row_of(dataset: ValueDataset, completion: int, position: int) -> int:
    """Row of (completion, position): rows of a completion are contiguous, t = 0..length."""
    first = int(dataset.lengths[:completion].sum()) + completion
    return first + position
