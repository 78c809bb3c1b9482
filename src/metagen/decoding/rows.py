"""Per-row bookkeeping shared by every decoding loop (sampling, speculative, beam search, tree
search, tokenwise controlled decoding): one place for what ends a row and what it records.

    rules   = StopRules.from_params(params, model, len(prompt_ids))     # once per request
    chain   = request_chain(params, model, prompt_ids, n, processors)   # the row's processors
    row     = Row(model.tokenizer, prompt_ids, rules, want_top)         # one per completion
    records = token_records(logits, tokens, processed, num_top)         # one per step, batched
    text    = row.push(token, records[b], chain.stop_verdict(b))        # per row and token

A row ends at the first of:
  * a stop token: `params.stop_token_ids` or EOS (unless `ignore_eos`); it adds no text;
  * a stop string (OpenAI `stop`), matched on the text across token boundaries and cut off;
  * a processor that says the row must end (`LogitsProcessor.finished`, e.g. a constraint whose
    grammar admits nothing more);
  * `max_tokens`, or the model's context: finish_reason "length".
When some processor judges where rows may end (`allows_stop`), `Completion.complete` records its
verdict at the end: False means the row was cut where the processor does not accept the output
(a structured output truncated by max_tokens), which must never be presented as valid.

Text is produced incrementally (`IncrementalDetokenizer`: O(1) per token, never the whole row
again); `Row.fork` copies a row in O(tokens so far) for beams and tree nodes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from metagen.decoding.result import Completion
from metagen.models.detokenize import IncrementalDetokenizer, StopStringMatcher
from metagen.sampling import LogitsProcessor, SamplerChain, SamplingParams

Verdict = tuple[bool | None, bool]  # (may_stop, must_stop), see SamplerChain.stop_verdict
NO_OPINION: Verdict = (None, False)


@dataclass(frozen=True)
class StopRules:
    """What ends a row of one request: stop token ids (EOS included unless ignored), stop strings,
    and the most tokens a row may hold (max_tokens, bounded by the context left after the prompt)."""

    stop_token_ids: frozenset[int]
    stop_strings: tuple[str, ...]
    max_new_tokens: int

    @classmethod
    def create(cls, model, prompt_length: int, *, max_tokens: int, stop: Sequence[str] = (),
               stop_token_ids: Sequence[int] = (), ignore_eos: bool = False) -> StopRules:
        """Rules for a prompt of `prompt_length` tokens. ValueError when the prompt leaves no room
        in the model's context, or for a stop token id outside the vocabulary (it could never stop
        anything)."""
        if prompt_length >= model.max_context:
            raise ValueError(f"prompt has {prompt_length} tokens, the model's context is {model.max_context}: "
                             "no room to generate")
        for token_id in stop_token_ids:
            if token_id >= model.vocab_size:
                raise ValueError(f"stop_token_ids entry {token_id} is out of range for vocab size {model.vocab_size}")
        ids = frozenset(stop_token_ids) | (frozenset() if ignore_eos else frozenset(model.eos_token_ids))
        return cls(ids, tuple(stop), min(max_tokens, model.max_context - prompt_length))

    @classmethod
    def from_params(cls, params: SamplingParams, model, prompt_length: int) -> StopRules:
        return cls.create(model, prompt_length, max_tokens=params.max_tokens, stop=params.stop,
                          stop_token_ids=params.stop_token_ids, ignore_eos=params.ignore_eos)


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
        from metagen.structured.healing import TokenHealingProcessor

        masks.insert(0, TokenHealingProcessor(model.tokenizer, healed, 1))
    if params.structured_outputs is not None:
        from metagen.structured import StructuredProcessor  # llguidance only when a constraint is used

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


class TokenRecord(NamedTuple):
    """What a row records with each token (see `Completion`)."""

    logprob: float
    sampled: float
    certainty: float
    top: dict[int, float] | None


def token_records(logits: Tensor, tokens: Tensor, processed: Tensor | None = None,
                  num_top: int = 0) -> list[TokenRecord]:
    """Records of N chosen tokens, batched: one log-softmax over `logits (N, V)` and one host
    transfer per quantity.

    logits: the model's raw logits; tokens: `(N,)` chosen ids; processed: `(N, V)` logits the
    tokens were drawn from (None: chosen by argmax, a point mass: sampled log-prob 0); num_top:
    how many top log-probabilities to report (0: none). O(N V).
    """
    ids = tokens.reshape(-1, 1).long()
    raw = torch.log_softmax(logits, dim=-1)  # (N, V)
    chosen = raw.gather(1, ids).squeeze(1).tolist()
    certainties = (-math.log(logits.shape[-1]) - raw.mean(dim=-1)).tolist()
    if processed is None:
        sampled = [0.0] * len(chosen)
    else:
        sampled = torch.log_softmax(processed, dim=-1).gather(1, ids).squeeze(1).tolist()
    tops: list[dict[int, float] | None] = [None] * len(chosen)
    if num_top:
        top = torch.topk(raw, num_top, dim=-1)
        tops = [dict(zip(i, v)) for i, v in zip(top.indices.tolist(), top.values.tolist())]
    return [TokenRecord(*fields) for fields in zip(chosen, sampled, certainties, tops)]


class Row:
    """Per-completion decoding state: the completion, incremental text and the stop checks.

    Attributes:
        completion: what the row produced so far.
        decoded: the text the last `push` added before stop strings were cut (a step search
            looks for its delimiter there).
    """

    def __init__(self, tokenizer, prompt_ids: Sequence[int], rules: StopRules, want_top: bool = False,
                 skip_text: str = "") -> None:
        self.rules = rules
        self.skip = skip_text  # healed prompt text the first tokens reproduce: not part of the output
        self.completion = Completion(top_logprobs=[] if want_top else None)
        # Special tokens (chat markers, EOS kept by ignore_eos) are not part of the text.
        self.detokenizer = IncrementalDetokenizer(tokenizer, prompt_ids, skip_special_tokens=True)
        self.stops = StopStringMatcher(rules.stop_strings) if rules.stop_strings else None
        self.decoded = ""

    @property
    def finished(self) -> bool:
        return self.completion.finish_reason is not None

    @property
    def full_text(self) -> str:
        """All text so far, held-back parts included (what the row reads as if it ended now)."""
        held = self.stops.held if self.stops is not None else ""
        return self.completion.text + held + self.detokenizer.peek()

    def push(self, token: int, record: TokenRecord, verdict: Verdict = NO_OPINION) -> str:
        """Record one chosen token; return the text it makes safe to show.

        Sets `completion.finish_reason` when the row ends (see the module docstring); `verdict`
        is the processors' (may_stop, must_stop) after accepting the token.
        """
        completion = self.completion
        if completion.finish_reason is not None:
            raise RuntimeError(f"row already finished ({completion.finish_reason}): no token can follow")
        completion.token_ids.append(token)
        completion.logprobs.append(record.logprob)
        completion.sampling_logprobs.append(record.sampled)
        completion.certainties.append(record.certainty)
        if completion.top_logprobs is not None:
            completion.top_logprobs.append(record.top)
        may_stop, must_stop = verdict
        is_stop_token = token in self.rules.stop_token_ids
        last = is_stop_token or must_stop or len(completion.token_ids) >= self.rules.max_new_tokens
        delta = "" if is_stop_token else self.detokenizer.push(token)  # stop tokens add no text
        if last:
            delta += self.detokenizer.flush()
        if self.skip:  # the healed text comes first (the processors allow nothing else)
            cut = len(self.skip) if delta.startswith(self.skip) else len(delta)
            if not self.skip.startswith(delta[:cut]):
                raise RuntimeError(f"token healing: the output {delta!r} does not reproduce {self.skip!r}")
            delta, self.skip = delta[cut:], self.skip[cut:]
        self.decoded = delta
        text, hit_stop_string = self.stops.feed(delta) if self.stops is not None else (delta, False)
        if hit_stop_string:
            completion.finish_reason, completion.stop_reason = "stop", self.stops.matched
        elif last:
            text += self.stops.flush() if self.stops is not None else ""
            completion.finish_reason = "stop" if is_stop_token or must_stop else "length"
            completion.stop_reason = token if is_stop_token else None
        if completion.finish_reason is not None:
            completion.complete = may_stop
        completion.text += text
        return text

    def fork(self) -> Row:
        """An independent copy (a beam's child, a tree node's continuation). O(tokens so far)."""
        twin = Row.__new__(Row)
        twin.rules, twin.decoded, twin.skip = self.rules, self.decoded, self.skip
        c = self.completion
        twin.completion = Completion(
            c.text, list(c.token_ids), list(c.logprobs), list(c.sampling_logprobs),
            list(c.top_logprobs) if c.top_logprobs is not None else None, list(c.certainties),
            c.finish_reason, c.stop_reason, c.complete)
        twin.detokenizer = self.detokenizer.copy()
        twin.stops = self.stops.copy() if self.stops is not None else None
        return twin
