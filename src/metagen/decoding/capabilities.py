"""What a `Generator` can do, and what a strategy needs from one.

A generator declares `capabilities` (a frozenset of the names below; the `Generator` base
declares none, so a minimal generator runs the sequence-level strategies that read only text);
a strategy declares the ones it needs, and `require` refuses a strategy that a backend cannot
run before any request is sent, naming the strategy, the missing capability and what would
provide it. Nothing degrades silently: a server that returns only top-k logprobs does not have
FULL_DISTRIBUTIONS, so self-certainty refuses it.

LOCAL_CACHE is the one capability that is not a field of the completions: a generator with it
hands its local model to searches that decode their own steps, through
`Generator.local_model()`.
"""

from __future__ import annotations

TOKEN_PROMPTS = "token_prompts"  # prompts given as token ids
TOKEN_IDS = "token_ids"  # completions carry the ids of their tokens
LOGPROBS = "logprobs"  # log p of every sampled token
TOP_LOGPROBS = "top_logprobs"  # the top-k log-probabilities at every position
FULL_DISTRIBUTIONS = "full_distributions"  # every next-token distribution (Completion.certainties)
PROMPT_SCORING = "prompt_scoring"  # log-probabilities of given text (echo)
HIDDEN_STATES = "hidden_states"  # final hidden states (value heads)
LOCAL_CACHE = "local_cache"  # a local LanguageModel whose KV cache rows can be snapshotted
STEP_CONTINUATION = "step_continuation"  # continue a prefix (token ids, or a final assistant message)
# until a stop string, reporting the stop that ended it (Completion.stop_reason)
STRUCTURED_OUTPUT = "structured_output"  # constrain outputs to a schema / grammar

# What provides each capability, for error messages.
PROVIDERS = {
    TOKEN_PROMPTS: "a local model, or a server that accepts token-id prompts (vLLM, SGLang, llama.cpp)",
    TOKEN_IDS: "a local model, or a server that returns token ids (vLLM return_tokens_as_token_ids, "
               "SGLang return_token_ids) or a tokenizer supplied for the served model",
    LOGPROBS: "a local model, or a server that returns logprobs",
    TOP_LOGPROBS: "a local model, or a server that returns top logprobs",
    FULL_DISTRIBUTIONS: "a local model (servers return at most the top-k log-probabilities)",
    PROMPT_SCORING: "a local model, or a server that echoes prompt logprobs",
    HIDDEN_STATES: "a local model",
    LOCAL_CACHE: "a local model (LocalGenerator)",
    STEP_CONTINUATION: "a local model, or a server that accepts token-id prompts and stop strings",
    STRUCTURED_OUTPUT: "a backend with constrained decoding",
}
ALL = frozenset(PROVIDERS)


def missing(needs, generator) -> list[str]:
    """The capabilities in `needs` that `generator` does not declare, sorted."""
    have = getattr(generator, "capabilities", None)
    if not isinstance(have, (set, frozenset)):
        raise TypeError(f"{type(generator).__name__} declares no capabilities set: a generator subclasses "
                        "metagen.decoding.Generator (whose default is the empty set)")
    unknown = sorted(set(needs) - ALL)
    if unknown:
        raise ValueError(f"capability {unknown[0]!r} is not known; choose from {', '.join(sorted(ALL))}")
    return [need for need in sorted(needs) if need not in have]


def require(needs, generator, what: str) -> None:
    """ValueError naming `what`, every capability in `needs` that `generator` lacks, and what
    would provide each; nothing when it has them all."""
    lacking = missing(needs, generator)
    if lacking:
        providers = "; ".join(f"{need}: {PROVIDERS[need]}" for need in lacking)
        raise ValueError(f"{what} needs {', '.join(lacking)}, which {type(generator).__name__} does not provide "
                         f"(what provides it — {providers})")
