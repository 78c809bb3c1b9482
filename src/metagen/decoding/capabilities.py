"""What a `Generator` can do, and what a strategy needs from one.

A generator declares `capabilities` (a frozenset of the names below); a strategy declares the
ones it needs, and `require` refuses a strategy that a backend cannot run before any request is
sent, naming the strategy, the missing capability and what would provide it. Nothing degrades
silently: a server that returns only top-k logprobs does not have FULL_DISTRIBUTIONS, so
self-certainty refuses it.
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
STEP_CONTINUATION = "step_continuation"  # continue a token prefix until a stop string
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


def require(needs, generator, what: str) -> None:
    """ValueError naming `what`, the first capability in `needs` that `generator` lacks, and what
    would provide it."""
    have = getattr(generator, "capabilities", frozenset())
    missing = [need for need in sorted(needs) if need not in have]
    if missing:
        raise ValueError(
            f"{what} needs {', '.join(missing)}, which {type(generator).__name__} does not provide; "
            f"use {PROVIDERS.get(missing[0], 'a backend that has it')}"
        )
