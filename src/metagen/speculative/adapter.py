"""Trained exit adapters: make the target's first L layers a good drafter (Kangaroo-style).

The early-exit model (`early_exit_model`) reads the L-th layer's normalised residual stream
h (..., H) out with the target's LM head; its argmax agrees with the full model on few tokens
(SmolLM2-135M, L=15 of 30: ~2%). Kangaroo (Liu et al. 2024) trains a small adapter between the
exit layer and the shared LM head. Here it is a low-rank residual map

    y = h + U(D h),  D: (r, H), U: (H, r), U = 0 at initialisation (the identity),
    logits = lm_head(y)

(rank=None, the default: one full (H, H) matrix, y = h + M h). Training starts from the ridge
regression of the full model's final hidden state on h (closed form, seconds), then Adam
minimises the distillation loss KL(softmax(z_full / T) ‖ softmax(lm_head(y) / T)) over
positions of the target's own samples.

Teacher memory: V = 49152, so the full model's logits at 16k positions would take 3 GB in
float32. Each position keeps only the teacher's top-K (K = 64) log-probabilities and the log
of the remaining tail mass; the loss is the KL between the two distributions coarsened to K + 1
bins (the K teacher tokens + "anything else"), a lower bound of the full KL that is tight when
the tail mass is small. Time per training step: O(N·V·H) for N positions (the LM head matmul).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from metagen.models.base import ForwardOutput, LanguageModel, LogitsMode
from metagen.speculative.self_draft import early_exit_model

TEACHER_TOP_K = 64
_FORMAT = "metagen.exit_adapter/1"
_IDENTITY_FIELDS = ("name", "hidden_size", "num_hidden_layers", "vocab_size", "source", "dtype")

DEFAULT_PROMPTS = (
    "Explain why the sky is blue.", "Explain how a refrigerator keeps food cold.",
    "Explain what a black hole is to a ten-year-old.", "Explain the difference between weather and climate.",
    "Explain how vaccines train the immune system.", "Explain what inflation is and why it matters.",
    "Summarize the plot of Romeo and Juliet in a few sentences.", "Summarize the causes of the French Revolution.",
    "Summarize the benefits of regular exercise.", "Summarize how photosynthesis works.",
    "Rewrite this sentence to sound more formal: 'hey, can u send me the file asap?'",
    "Rewrite this in plain English: 'The aforementioned party shall indemnify the other party.'",
    "Rewrite the following as a friendly reminder: 'Pay your invoice.'",
    "List five tips for sleeping better.", "List the planets of the solar system in order.",
    "List some healthy breakfast ideas.", "List three advantages and three disadvantages of remote work.",
    "List the steps to change a flat tire.", "Write a Python function that reverses a string.",
    "Write a Python function that checks whether a number is prime.",
    "Write a SQL query that counts the orders per customer.", "Write a JavaScript function that sums an array.",
    "How do I read a CSV file in Python?", "What does the 'git rebase' command do?",
    "What is 17 times 23? Show your work.", "Solve for x: 3x + 7 = 22.",
    "A train travels 120 km in 1.5 hours. What is its average speed?",
    "If I buy 3 apples at 40 cents each and pay with 2 dollars, how much change do I get?",
    "What is the area of a circle with radius 4?", "Write a short story about a robot who learns to paint.",
    "Write a short story about a lost dog finding its way home.", "Write a poem about the ocean at night.",
    "Write a haiku about autumn leaves.", "Tell me a fun fact about octopuses.",
    "What are the main ingredients of a pizza?", "Give me a recipe for pancakes.",
    "How can I improve my public speaking?", "What should I pack for a weekend camping trip?",
    "Describe a typical day of a medieval farmer.", "Write an email asking my manager for a day off.",
)


class ExitAdapter:
    """y = h + U(D h) on the exit layer's normalised hidden state h (..., H) float32.

    rank: r of the low-rank residual, or None (default) for a full (H, H) matrix M (y = h + M h):
        at L=15 of SmolLM2-135M, least squares gives held-out top-1 agreement 0.39 full rank vs
        0.27 at r=64.
    num_layers: the exit layer L; target: identity of the model it was trained on (see
    `model_identity`). Parameters: 2·H·r (r=64, H=576: 73,728) or H² (331,776).
    """

    def __init__(self, num_layers: int, target: dict, rank: int | None = None, seed: int = 0) -> None:
        hidden = int(target["hidden_size"])
        if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int) or not 1 <= rank <= hidden):
            raise ValueError(f"rank={rank!r} is out of range: must be an int in [1, {hidden}] or None (full rank)")
        self.num_layers, self.target, self.rank = num_layers, dict(target), rank
        generator = torch.Generator().manual_seed(seed)
        if rank is None:
            self.tensors = {"full": torch.zeros(hidden, hidden)}
        else:  # D random (a basis for U to use), U zero: the map starts as the identity
            self.tensors = {"down": torch.randn(rank, hidden, generator=generator) / math.sqrt(hidden),
                            "up": torch.zeros(hidden, rank)}

    @property
    def num_parameters(self) -> int:
        return sum(t.numel() for t in self.tensors.values())

    def __call__(self, hidden: Tensor) -> Tensor:
        """hidden (..., H) float32 -> (..., H) float32."""
        if self.rank is None:
            return hidden + hidden @ self.tensors["full"].t()
        return hidden + (hidden @ self.tensors["down"].t()) @ self.tensors["up"].t()

    def save(self, path: str | os.PathLike) -> None:
        """One safetensors file: the tensors, and the metadata as JSON in its header."""
        save_tensors(path, self.tensors, {"format": _FORMAT, "num_layers": self.num_layers, "rank": self.rank,
                                          "target": self.target})

    @classmethod
    def load(cls, path: str | os.PathLike, target) -> "ExitAdapter":
        """The adapter saved at `path`; ValueError if `target` is not the model it was trained on."""
        meta, tensors = load_tensors(path, _FORMAT, "exit adapter")
        check_identity(meta["target"], model_identity(target))
        adapter = cls(meta["num_layers"], meta["target"], meta["rank"])
        adapter.tensors = tensors
        return adapter


def save_tensors(path: str | os.PathLike, tensors: dict[str, Tensor], meta: dict) -> None:
    """One safetensors file: `tensors`, and `meta` (with its "format") as JSON in the header."""
    from safetensors.torch import save_file

    save_file({k: v.detach().contiguous() for k, v in tensors.items()}, os.fspath(path),
              metadata={"metagen": json.dumps(meta)})


def load_tensors(path: str | os.PathLike, file_format: str, what: str,
                 names: Sequence[str] | None = None) -> tuple[dict, dict[str, Tensor]]:
    """(meta, float32 tensors) from a `save_tensors` file. FileNotFoundError if `path` is not a file;
    ValueError naming `what` if it is not readable safetensors, its format is not `file_format`, or
    its tensor names are not `names` (when given)."""
    from safetensors import SafetensorError, safe_open

    where = os.fspath(path)
    if not os.path.isfile(where):
        raise FileNotFoundError(f"{what} {where} does not exist or is not a file")
    try:
        with safe_open(where, framework="pt") as handle:
            meta = json.loads((handle.metadata() or {}).get("metagen", "{}"))
            tensors = {key: handle.get_tensor(key).float() for key in handle.keys()}
    except (SafetensorError, json.JSONDecodeError) as error:
        raise ValueError(f"{where} is not a metagen {what} (not a readable safetensors file: {error})") from None
    if not isinstance(meta, dict) or meta.get("format") != file_format:
        found = meta.get("format") if isinstance(meta, dict) else None
        raise ValueError(f"{where} is not a metagen {what} (format {found!r}, expected {file_format!r})")
    if names is not None and set(tensors) != set(names):
        raise ValueError(f"{where}: tensors {sorted(tensors)} do not match the {what}'s {sorted(names)}")
    return meta, tensors


def model_identity(target) -> dict:
    """What an adapter is tied to: config name and shape, checkpoint file name and dtype."""
    config = target.config
    return {"name": config.name, "hidden_size": config.hidden_size, "num_hidden_layers": config.num_hidden_layers,
            "vocab_size": config.vocab_size, "source": os.path.basename(target.source or ""), "dtype": target.dtype}


def check_identity(saved: dict, actual: dict, what: str = "exit adapter") -> None:
    """ValueError naming the first `model_identity` field where `saved` and `actual` differ."""
    for field in _IDENTITY_FIELDS:
        if saved.get(field) != actual.get(field):
            raise ValueError(f"the {what} was trained on a model with {field}={saved.get(field)!r}, "
                             f"this target has {field}={actual.get(field)!r}: train one for this model")


class AdaptedExitModel(LanguageModel):
    """The target's first `adapter.num_layers` layers, the adapter, then the target's LM head.

    Shares every weight with the target; its own cache. FLOPs per token: the early-exit model's
    plus 2·(adapter parameters).
    """

    def __init__(self, target, adapter: ExitAdapter) -> None:
        check_identity(adapter.target, model_identity(target))
        self.adapter = adapter
        self.body = early_exit_model(target, adapter.num_layers)
        self.config, self.tokenizer = self.body.config, self.body.tokenizer
        self.name = f"{self.body.name} + exit adapter"

    @property
    def vocab_size(self) -> int:
        return self.body.vocab_size

    @property
    def max_context(self) -> int:
        return self.body.max_context

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return self.body.eos_token_ids

    def new_cache(self, batch_size: int = 1):
        return self.body.new_cache(batch_size)

    @property
    def kv_bytes_per_token(self) -> int:
        return self.body.kv_bytes_per_token

    def flops_per_token(self, context_length: int) -> float:
        return self.body.flops_per_token(context_length) + 2.0 * self.adapter.num_parameters

    def exit_hidden(self, cache, tokens, *, all_positions: bool, tree=None) -> tuple[Tensor, list[int]]:
        """The exit layer's normalised hidden states: (B, T, H) at every position, or (B, H) at
        each row's last new token; `tree` as in `forward`."""
        out = self.body.hidden_states(cache, tokens, positions="all" if all_positions else "last", tree=tree)
        return out.hidden, out.num_new

    @torch.no_grad()
    def forward(self, cache, tokens, *, logits: LogitsMode = "last", hidden: bool = False,
                tree=None) -> ForwardOutput:
        """LanguageModel.forward; `hidden` returns the adapter's output y (what the head reads).
        A token `tree` runs through the body's layers (ancestor-only attention, `models/token_tree.py`);
        the adapter and the head act per position, so each node's logits follow its path alone."""
        if logits == "none" and not hidden:
            out = self.body.forward(cache, tokens, logits="none", tree=tree)
            return ForwardOutput(None, None, out.num_new)
        states, num_new = self.exit_hidden(cache, tokens, all_positions=logits == "all", tree=tree)
        adapted = self.adapter(states)  # (B, H) or (B, T, H)
        out_logits = None if logits == "none" else self.body.logits_from_hidden(adapted)
        return ForwardOutput(out_logits, adapted if hidden else None, num_new)


# ------------------------------------------------------------------------------------ training
@dataclass(frozen=True)
class AdapterReport:
    """What `train_exit_adapter` did. KL: coarsened to the teacher's top-K + tail (nats per
    position); agreement: share of held-out positions where the student's argmax is the full
    model's argmax (the greedy acceptance rate of a one-token draft)."""

    num_layers: int
    rank: int | None
    parameters: int
    train_tokens: int
    held_out_tokens: int
    steps: int
    collect_seconds: float
    train_seconds: float
    kl_before: float
    kl_after: float
    agreement_before: float
    agreement_after: float


def sample_training_data(target, prompts: Sequence[str] = DEFAULT_PROMPTS, tokens_per_prompt: int = 256,
                         seed: int = 0) -> list[list[int]]:
    """Prompt + completion token ids of one temperature-1 sample of `target` per chat prompt."""
    from metagen.decoding.sample_loop import generate
    from metagen.sampling import SamplingParams

    generator = torch.Generator().manual_seed(seed)
    params = SamplingParams(temperature=1.0, max_tokens=tokens_per_prompt)
    sequences = []
    for prompt in prompts:
        result = generate(target, prompt, params, chat=True, generator=generator)
        sequences.append(list(result.prompt_token_ids) + list(result.completions[0].token_ids))
    return sequences


def coarse_kl(student_logits: Tensor, top_ids: Tensor, top_logprobs: Tensor, tail_logprob: Tensor) -> Tensor:
    """KL(p ‖ q) between teacher p and student q coarsened to K + 1 bins: the teacher's top-K
    tokens and the rest. student_logits (N, V); top_ids, top_logprobs (N, K); tail_logprob (N,)
    = log(1 − Σ top-K p). Returns (N,). Σ_k p_k (log p_k − log q_k) + p_tail (log p_tail − log q_tail)."""
    log_q = torch.log_softmax(student_logits, dim=-1)
    q_top = log_q.gather(1, top_ids)  # (N, K)
    q_tail = torch.logsumexp(log_q.scatter(1, top_ids, -math.inf), dim=-1)  # (N,)
    return (top_logprobs.exp() * (top_logprobs - q_top)).sum(-1) + tail_logprob.exp() * (tail_logprob - q_tail)


def _teacher_and_inputs(target, body: AdaptedExitModel, sequences, temperature: float):
    """Per position of every sequence: the exit hidden state (N, H), the full model's top-K ids
    and log-probabilities (N, K) at `temperature`, its log tail mass (N,) and its final
    hidden state (N, H)."""
    hidden, ids, logprobs, tails, finals = [], [], [], [], []
    for sequence in sequences:
        out = target.forward(target.new_cache(1), [sequence], logits="all", hidden=True)
        full = out.logits[0]  # (T, V)
        finals.append(out.hidden[0])
        log_p = torch.log_softmax(full / temperature, dim=-1)
        top = torch.topk(log_p, TEACHER_TOP_K, dim=-1)  # sorted: column 0 is the argmax
        tails.append(torch.logsumexp(log_p.scatter(1, top.indices, -math.inf), dim=-1).clamp(min=-80.0))
        ids.append(top.indices)
        logprobs.append(top.values)
        states, _ = body.exit_hidden(body.new_cache(1), [sequence], all_positions=True)
        hidden.append(states[0])
    return torch.cat(hidden), torch.cat(ids), torch.cat(logprobs), torch.cat(tails), torch.cat(finals)


def least_squares_init(adapter: ExitAdapter, hidden: Tensor, final: Tensor, ridge: float = 1.0) -> None:
    """Set the adapter to the ridge regression of the full model's final hidden state on the
    exit state: M = argmin Σ‖h + M h − f‖² + λ‖M‖² (λ = ridge · N / H), so M = ((HᵀH + λI)⁻¹ Hᵀ (F − H))ᵀ.
    Low rank r: reduced-rank regression, M_r = V_r V_rᵀ M with V_r the top-r right singular
    vectors of the fitted residuals H Mᵀ. hidden, final: (N, H). Time O(N·H² + H³).
    """
    full = ridge_residual(hidden, final, ridge)  # (H, H): y = h + h Mᵀ
    if adapter.rank is None:
        adapter.tensors["full"] = full
        return
    _, _, right = torch.linalg.svd(hidden @ full.t(), full_matrices=False)  # right: (H, H)
    basis = right[: adapter.rank]  # (r, H)
    adapter.tensors = {"down": basis @ full, "up": basis.t().contiguous()}


def ridge_residual(hidden: Tensor, final: Tensor, ridge: float = 1.0) -> Tensor:
    """M (H, H) minimising Σ‖h + M h − f‖² + λ‖M‖², λ = ridge · N / H, over rows of hidden,
    final (N, H): ((HᵀH + λI)⁻¹ Hᵀ (F − H))ᵀ. Time O(N·H² + H³)."""
    count, size = hidden.shape
    gram = hidden.t() @ hidden + ridge * count / size * torch.eye(size)
    return torch.linalg.solve(gram, hidden.t() @ (final - hidden)).t()


def train_exit_adapter(target, num_layers: int, texts_or_token_ids: Sequence[str] | Sequence[Sequence[int]], *,
                       rank: int | None = None, steps: int = 300, lr: float = 2e-3, batch_tokens: int = 512,
                       seed: int = 0, temperature: float = 1.0,
                       held_out: float = 0.1, init: str = "least_squares") -> tuple[ExitAdapter, AdapterReport]:
    """Train an `ExitAdapter` at exit layer `num_layers` by distillation from `target`.

    Init: "least_squares" (`least_squares_init`, the default) or "identity".
    Data: every position of the sequences (texts are tokenized as they are); a `held_out`
    share of whole sequences (at least one) measures KL and top-1 agreement before and after.
    Adam (cosine-decayed `lr`) on minibatches of `batch_tokens` random positions minimises the
    mean `coarse_kl` at `temperature`. Time: one target + one early-exit forward per sequence,
    then O(steps · batch_tokens · V · H) for the LM head matmuls (bf16 for quantized targets).
    """
    if not 0.0 <= held_out < 1.0:
        raise ValueError(f"held_out={held_out!r} is out of range: must be in [0, 1)")
    sequences = [target.tokenizer.encode(item) if isinstance(item, str) else [int(t) for t in item]
                 for item in texts_or_token_ids]
    sequences = [s[: target.max_context] for s in sequences if len(s) >= 2]
    if len(sequences) < 2:
        raise ValueError(f"need at least 2 sequences of 2+ tokens (one is held out), got {len(sequences)}")
    generator = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(sequences), generator=generator).tolist()
    split = max(1, round(held_out * len(sequences)))
    adapter = ExitAdapter(num_layers, model_identity(target), rank, seed)
    model = AdaptedExitModel(target, adapter)

    started = time.perf_counter()
    with torch.no_grad():
        train = _teacher_and_inputs(target, model, [sequences[i] for i in order[split:]], temperature)
        test = _teacher_and_inputs(target, model, [sequences[i] for i in order[:split]], temperature)
    finals, train, test = train[4], train[:4], test[:4]
    collect_seconds = time.perf_counter() - started
    hidden_size = target.config.hidden_size
    # the LM head as a (V, H) matrix in the matmul dtype: the head applied to the identity
    body = model.body  # the head's values are matmul-dtype numbers: casting back to that dtype is exact
    head = body.logits_from_hidden(torch.eye(hidden_size)).t().to(body.matmul_dtype).contiguous()

    def student_logits(states: Tensor) -> Tensor:  # (N, H) -> (N, V) float32, at `temperature`
        return (adapter(states).to(head.dtype) @ head.t()).float() / temperature

    def evaluate(data) -> tuple[float, float]:
        kl, agree, count = 0.0, 0.0, data[0].shape[0]
        with torch.no_grad():
            for start in range(0, count, 1024):
                part = [t[start : start + 1024] for t in data]
                logits = student_logits(part[0])
                kl += float(coarse_kl(logits, *part[1:]).sum())
                agree += float((logits.argmax(-1) == part[1][:, 0]).sum())
        return kl / count, agree / count

    kl_before, agreement_before = evaluate(test)
    started = time.perf_counter()
    if init == "least_squares":
        least_squares_init(adapter, train[0], finals)
    elif init != "identity":
        raise ValueError(f"init={init!r} is not supported: choose 'least_squares' or 'identity'")
    parameters = list(adapter.tensors.values())
    for tensor in parameters:
        tensor.requires_grad_(True)
    optimizer = torch.optim.Adam(parameters, lr=lr)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, max(steps, 1), eta_min=lr / 10)
    count = train[0].shape[0]
    for _ in range(steps):
        batch = torch.randint(count, (min(batch_tokens, count),), generator=generator)
        states, top_ids, top_logprobs, tails = (t[batch] for t in train)
        loss = coarse_kl(student_logits(states), top_ids, top_logprobs, tails).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
    for tensor in parameters:
        tensor.requires_grad_(False)
    train_seconds = time.perf_counter() - started
    kl_after, agreement_after = evaluate(test)
    report = AdapterReport(num_layers, rank, adapter.num_parameters, count, test[0].shape[0], steps,
                           collect_seconds, train_seconds, kl_before, kl_after, agreement_before, agreement_after)
    return adapter, report
