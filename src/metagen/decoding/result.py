"""The one output type per sequence (`Completion`) and the one per call (`GenerationResult`).

Every loop and strategy returns a `GenerationResult` whose `cost` the code that spent it filled:

    sampling loop / jump-forward      stream, generate            completions of one prompt
    speculative decoding              speculative_stream           the same, plus draft counts
    beam search                       beam_search                  the n_best hypotheses, best first
    a Generator (local, remote, ...)  generator.generate           params.n completions
    a strategy                        best_of_n, mbr, tree search  every completion it produced,
                                                                   `chosen`, `votes`

A strategy's completions carry its judgement of them (`score`, `answer`); a beam hypothesis its
normalized score (or stochastic key) as `score`. Scorers and verifiers read `Completion`s, so
scoring and strategies share this floor's type and import nothing of each other for it.

Complete outputs first: a completion cut before its constraint accepted it (`complete=False`: a
structured output that hit max_tokens) is not valid output, so no strategy chooses one while a
complete one exists (`prefer_complete`); it may still count as a pseudo-reference (MBR).
`GenerationResult.incomplete` lists those, and `chosen.complete` says whether the chosen one is
valid (False only when every completion was cut).

No torch here: a result and its `Cost` are plain data.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from metagen.decoding.cost import Cost


@dataclass
class Completion:
    """One generated sequence.

    token_ids: the sampled ids; None when unknown (a server that returns no ids and no tokenizer
        given; such a generator lacks the TOKEN_IDS capability).
    logprobs: log p(token) under the model's unmodified distribution, per token.
    sampling_logprobs: log p(token) under the distribution it was drawn from (after adapters).
    top_logprobs: per token, {token_id: logprob} of the model's top `params.logprobs` tokens.
    certainties: per token, KL(uniform ‖ p) of the model's unmodified next-token distribution
        p: −log V − mean_v log p_v (self-certainty's per-token term; 0 for a uniform p).
    finish_reason: "stop" (EOS, stop token, stop string, or a processor ending the row) or
        "length" (max_tokens / context); None: a beam left alive when its search ended.
    stop_reason: the stop string or token id that ended the row, if any.
    complete: None when no processor judges where the row may end; else whether they accept the
        output as it ended (False: cut short, e.g. a constrained output at max_tokens — not valid).
    score: a strategy's value for it (best-of-N, weighted voting, MBR, a verifier), or a beam
        hypothesis' logp / len^α (stochastic beam search: its Gumbel key); None when unscored.
    answer: the answer a strategy extracted from it (voting), None when none was found.
    """

    text: str = ""
    token_ids: list[int] | None = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    sampling_logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[dict[int, float]] | None = None
    certainties: list[float] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    complete: bool | None = None
    score: float | None = None
    answer: str | None = None

    def past_text(self) -> str | None:
        """The sampled tokens' text beyond `text` (a stop string cut from it, with the rest of its
        token), or None when not known: here, where `stop_reason` says what ended the row; a
        server's completion (`remote.responses.RemoteCompletion`) reads it from its token texts."""
        return None

    @property
    def cumulative_logprob(self) -> float:
        """log p(sequence) under the model: the sum of `logprobs`."""
        return float(sum(self.logprobs))


def prefer_complete(completions: list[Completion]) -> list[Completion]:
    """The completions a strategy may choose from: those not cut before their constraint accepted
    (complete is not False), or all of them when every one was cut."""
    complete = [c for c in completions if c.complete is not False]
    return complete or list(completions)


@dataclass
class GenerationResult:
    """The outputs of one call — a decoding loop's, a generator's or a strategy's — and its `Cost`.

    completions: every sequence produced, in order (a strategy: everything it generated; beam
        search: the n_best hypotheses, best first).
    prompt_token_ids: None when unknown (a remote server given text or chat messages, a strategy
        of several prompts); with token healing, the prompt as fed (its healed tail removed).
    cost: what the call spent, filled by the code that spent it (None only from a hand-made
        result, as a test's fake generator returns).
    chosen: the output a strategy returns (None: no choice was made; `text` is the first).
    votes: answer -> total vote (voting strategies).
    prefill_seconds / decode_seconds: a decoding loop's split of its time (a remote generator's
        whole request time is decode_seconds).
    forced_tokens: tokens taken from jump-forward runs over all completions (each saved a forward
        of its row; see `decoding.jump_forward`).
    healed_text: the prompt text token healing removed and the output reproduced ("" when none);
        it is not part of the completions' text.
    model_tokens: tokens each model gave, summed over completions, by role ({"small": .., "large":
        ..} for entropy-adaptive decoding); empty when one model (or a fixed mix) gave every token.
    lookahead_steps: AdaDec (`decoding.adadec`): the row-steps, over all completions, whose
        entropy was above τ and whose token a lookahead rerank chose (0 without AdaDec).
    """

    completions: list[Completion]
    prompt_token_ids: list[int] | None = None
    cost: Cost | None = None
    chosen: Completion | None = None
    votes: dict[str, float] = field(default_factory=dict)
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    forced_tokens: int = 0
    healed_text: str = ""
    model_tokens: dict[str, int] = field(default_factory=dict)
    lookahead_steps: int = 0

    @property
    def model_shares(self) -> dict[str, float]:
        """Each model's share of `model_tokens` (they sum to 1); empty without them."""
        total = sum(self.model_tokens.values())
        return {name: count / total for name, count in self.model_tokens.items()} if total else {}

    @property
    def output(self) -> Completion:
        """The output the call returns: `chosen`, else the first completion."""
        return self.chosen if self.chosen is not None else self.completions[0]

    @property
    def text(self) -> str:
        return self.output.text

    @property
    def answer(self) -> str | None:
        return self.output.answer

    @property
    def incomplete(self) -> list[int]:
        """Indices of the completions cut before their constraint accepted them (never chosen by a
        strategy while a complete one exists)."""
        return [i for i, c in enumerate(self.completions) if c.complete is False]

    @property
    def generated_tokens(self) -> int:
        """Tokens generated over all completions (from `cost` when some ids are unknown, as from a
        server that returns no token ids: their `token_ids` is None)."""
        if any(c.token_ids is None for c in self.completions):
            if self.cost is None:
                raise ValueError("token ids are unknown and no cost was recorded: generated tokens unknown")
            return self.cost.generated_tokens
        return sum(len(c.token_ids) for c in self.completions)

    @property
    def prompt_tokens(self) -> int:
        """The prompt's length in tokens: its ids when known, else from the cost (every request
        of a remote generator carries the whole prompt, computed or served from the server's
        cache: (computed + reused) / requests); 0 when neither tells."""
        if self.prompt_token_ids:
            return len(self.prompt_token_ids)
        cost = self.cost
        if cost is None or not cost.model_calls:
            return 0
        return round((cost.prompt_tokens_computed + cost.prompt_tokens_reused) / cost.model_calls)

    @property
    def tokens_per_second(self) -> float:
        return self.generated_tokens / self.decode_seconds if self.decode_seconds > 0 else 0.0


@dataclass
class StreamEvent:
    """A piece of output: `text` newly safe to show for completion `index` (after `token_id`)."""

    index: int
    text: str
    token_id: int | None
    finish_reason: str | None = None
