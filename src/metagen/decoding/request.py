"""A request's sampler chain and prompt: what every loop builds once, before its first step.

    prompt_ids, healed = heal_request(params, model, prompt, chat, prompt_ids)  # token healing
    chain = request_chain(params, model, prompt_ids, n, processors, healed=healed)
    refuse_token_healing(params, "beam search")                               # loops that do not heal
"""

from __future__ import annotations

from collections.abc import Sequence

from metagen.sampling import LogitsProcessor, SamplerChain, SamplingParams


def request_chain(params: SamplingParams, model, prompt_ids: Sequence[int], batch_size: int,
                  processors: Sequence[LogitsProcessor] = (), *, healed: str = "") -> SamplerChain:
    """The sampler chain of a request's `batch_size` rows: the caller's `processors` (masks such as
    constraints, each given with its state after the prompt for one row) first, then what `params`
    asks for. Every sampling loop builds its chain here.

    A constraint in `params.structured_outputs` becomes a `StructuredProcessor` placed before the
    caller's processors (its stop ids, like EOS, are allowed only where the constraint accepts).
    `healed`: the prompt text token healing removed (`heal_request`); a `TokenHealingProcessor`
    makes the first tokens reproduce it, and the constraint's grammar is prefixed with it."""
    masks = list(processors)
    if healed:
        from metagen.sampling.token_healing import TokenHealingProcessor

        masks.insert(0, TokenHealingProcessor(model.tokenizer, healed, 1))
    if params.structured_outputs is not None:
        from metagen.sampling.constraint import StructuredProcessor  # llguidance only when a constraint is used

        masks.insert(0, StructuredProcessor(params.structured_outputs, model.tokenizer, 1,
                                            stop_token_ids=params.stop_token_ids, prefix=healed))
    return SamplerChain.from_params(params, batch_size, model.vocab_size, prompt_ids, masks=masks)


def heal_request(params: SamplingParams, model, prompt, chat: bool | None,
                 prompt_ids: list[int]) -> tuple[list[int], str]:
    """(the prompt ids to feed, the healed text) for `params.token_healing` (else (ids, "")).

    Token healing (`metagen.structured.healing`) backs up a prompt that ends mid-token, e.g.
    "The url is http:" loses ":" and the output must start with it ("://..."). The removed text
    belonged to the prompt, so loops pass it to `Row(skip_text=)`: the completions' text excludes
    it (it continues the prompt as given), while `token_ids` hold every generated token, the first
    ones covering the removed text.

    Refused (ValueError naming token_healing) for a prompt that ends with the chat template's
    assistant header (text wrapped as a user message, or messages not ending with an assistant
    message): that tail is the template's own fixed text, not a word cut short, and healing it
    would only let the reply start with a different newline. A conversation ending with an
    assistant message is continued from that message's text, which is healed."""
    if not params.token_healing:
        return prompt_ids, ""
    from metagen.decoding.prompts import ends_with_generation_prompt

    if ends_with_generation_prompt(model.tokenizer, prompt, chat):
        raise ValueError("token_healing=True needs a prompt that ends with its own text: this one ends with the "
                         "chat template's assistant header (text under the chat template, or messages not ending "
                         "with an assistant message); pass chat=False, or end the messages with the assistant's "
                         "partial reply to heal it")
    from metagen.structured.healing import heal_prompt

    return heal_prompt(model.tokenizer, prompt_ids)


def refuse_token_healing(params: SamplingParams, loop: str) -> None:
    """ValueError naming token_healing for a loop that does not heal prompts."""
    if params.token_healing:
        raise ValueError(f"token_healing=True is not supported by {loop}: use the sampling loop (generate, "
                         "LocalGenerator) or speculative decoding, or leave token_healing off")
