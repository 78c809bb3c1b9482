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

from dataclasses import dataclass

TOKEN_PROMPTS = "token_prompts"  # prompts given as token ids
TOKEN_IDS = "token_ids"  # completions carry the ids of their tokens
LOGPROBS = "logprobs"  # log p of every sampled token
TOP_LOGPROBS = "top_logprobs"  # the top-k log-probabilities at every position
FULL_DISTRIBUTIONS = "full_distributions"  # every next-token distribution (Completion.certainties,
# one per token id: self-certainty reads both, so it implies TOKEN_IDS)
PROMPT_SCORING = "prompt_scoring"  # log-probabilities of given text (echo)
HIDDEN_STATES = "hidden_states"  # final hidden states (value heads)
LOCAL_CACHE = "local_cache"  # a local LanguageModel whose KV cache rows can be snapshotted
STEP_CONTINUATION = "step_continuation"  # continue a raw prefix (token ids, or text via
# `Generator.continue_prefix`, no chat template) until a stop string, telling which stop ended it
# (Completion.stop_reason, or the sampled tokens' text)
ASSISTANT_CONTINUATION = "assistant_continuation"  # `generate` on chat messages ending with an
# assistant message continues that message (no end-of-turn, no new turn: transformers'
# continue_final_message) until a stop string, naming the stop that ended it in stop_reason
STRUCTURED_OUTPUT = "structured_output"  # honours params.structured_outputs (a schema / grammar)

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
    STEP_CONTINUATION: "a local model, or a server with /v1/completions and stop strings that tells which stop "
                       "ended a completion (vLLM, SGLang; llama.cpp and OpenAI through returned logprobs)",
    ASSISTANT_CONTINUATION: "a local model, or a server that continues a final assistant message itself (vLLM, "
                            "SGLang: continue_final_message), or any server with /v1/completions that tells which "
                            "stop ended a completion, given tokenizer= with the model's chat template (the "
                            "conversation is rendered as text and continued raw; llama.cpp's server closes the "
                            "message and starts a new turn instead)",
    STRUCTURED_OUTPUT: "a local model (LocalGenerator), or a server whose engine takes the constraint's kind "
                       "(vLLM, SGLang, llama.cpp, OpenAI: see metagen.remote.constraints)",
}
ALL = frozenset(PROVIDERS)


@dataclass(frozen=True)
class Provided:
    """What a generator will provide, before it exists: its `capabilities` and how refusals name
    it (`described_as`). `require` and `StrategySpec.check` take it where they take a generator,
    so a command can refuse a strategy before it loads a model (`LocalGenerator.provides`)."""

    capabilities: frozenset[str]
    described_as: str | None = None


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
        raise ValueError(f"{what} needs {', '.join(lacking)}, which {described(generator)} does not provide "
                         f"(what provides it — {providers})")


def require_constraint(params, generator, what: str) -> None:
    """`require` STRUCTURED_OUTPUT when `params` (one SamplingParams, or several) carry a
    constraint: a generator that would ignore it is refused before any request."""
    for one in params if isinstance(params, (list, tuple)) else (params,):
        if getattr(one, "structured_outputs", None) is not None:
            require({STRUCTURED_OUTPUT}, generator, what)
            return


def described(generator) -> str:
    """How refusals name a generator: its `described_as` where it sets one (the proxy's fleet names
    its servers), else its class."""
    return generator.described_as or type(generator).__name__


def require_any(alternatives, generator, what: str) -> None:
    """Like `require`, for a strategy that runs with any one of several capability sets (e.g. a
    local cache, or continuation by a server): nothing when `generator` has one of them in
    full, else ValueError naming what each alternative lacks and what would provide it."""
    lacking = [missing(alternative, generator) for alternative in alternatives]
    if not lacking or any(not names for names in lacking):
        return
    name = described(generator)
    first, *others = [", ".join(names) for names in lacking]
    message = f"{what} needs {first}, which {name} does not provide"
    for other in others:
        message += f", or else {other}, which it does not provide either"
    providers = "; ".join(f"{need}: {PROVIDERS[need]}" for need in dict.fromkeys(n for names in lacking for n in names))
    raise ValueError(f"{message} (what provides it — {providers})")
