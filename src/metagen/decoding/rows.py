"""`Row`: the per-row bookkeeping shared by every decoding loop (sampling, speculative, beam search,
tree search, tokenwise controlled decoding), and the `Completion` a row produces.

    rules   = StopRules.from_params(params, model, len(prompt_ids))     # stop_rules.py, once per request
    chain   = request_chain(params, model, prompt_ids, n, processors)   # request.py, the rows' processors
    row     = Row(model.tokenizer, prompt_ids, rules, want_top)         # one per completion
    records = token_records(logits, tokens, processed, num_top)         # records.py, one per step, batched
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

from collections.abc import Sequence

from metagen.decoding.records import TokenRecord
from metagen.decoding.result import Completion
from metagen.decoding.stop_rules import StopRules
from metagen.models.detokenize import IncrementalDetokenizer, StopStringMatcher
from metagen.sampling import NO_OPINION, StopVerdict


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

    def push(self, token: int, record: TokenRecord, verdict: StopVerdict = NO_OPINION) -> str:
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
