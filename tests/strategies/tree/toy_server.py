"""A generator with STEP_CONTINUATION backed by the toy model, answering as servers do.

`continue_prefix` samples the toy model from the prefix (token ids, or text tokenized the way a
server would: BOS + characters) with metagen's own decoding loop, then shapes the answer like an
engine: stop strings cut from the text (the sampled ids keep the token, as vLLM's do), and
either `stop_reason` reported (vLLM, SGLang) or not (llama.cpp: the sampled tokens' texts in
its logprobs run past the cut text instead). Every completion is one request (a fan-out).
"""

from __future__ import annotations

from metagen.decoding import capabilities as caps
from metagen.decoding.cost import Cost
from metagen.decoding.generator import Generator
from metagen.decoding.result import GenerationResult
from metagen.decoding.sample_loop import generate
from metagen.remote.responses import RemoteCompletion
from tests.decoding.toy_model import PIECES, SPECIAL, ToyModel, ToyTokenizer

FULL = frozenset({caps.STEP_CONTINUATION, caps.LOGPROBS, caps.TOKEN_IDS, caps.TOKEN_PROMPTS})


class ToyServer(Generator):
    """capabilities: what it declares (and returns: no LOGPROBS -> no logprobs, no TOKEN_IDS ->
    no ids); report_stops: set stop_reason (False: llama.cpp's way, token texts instead)."""

    def __init__(self, capabilities=FULL, report_stops: bool = True, tokenizer=None, chat=None) -> None:
        self.model = ToyModel()
        self.capabilities = frozenset(capabilities)
        self.report_stops = report_stops
        self.tokenizer = tokenizer if tokenizer is not None else ToyTokenizer()
        self.chat = chat
        self.prefixes: list[object] = []

    def generate(self, prompt, params, *, generator=None):
        raise AssertionError("a step search continues prefixes, it does not generate from prompts")

    def continue_prefix(self, prefix, params, *, generator=None):
        self.prefixes.append(prefix)
        ids = list(prefix) if isinstance(prefix, list) else self.model.tokenizer.encode(prefix)
        if isinstance(prefix, list) and caps.TOKEN_PROMPTS not in self.capabilities:
            raise AssertionError("token ids sent to a server that does not take them")
        local = generate(self.model, ids, params, generator=generator)
        completions = [self._shape(c) for c in local.completions]
        generated = sum(len(c.token_ids) for c in local.completions)
        cost = Cost(model_calls=len(completions), prompt_tokens_computed=len(ids) * len(completions),
                    generated_tokens=generated, flops=None, target_steps=generated, scorer_flops=None)
        return GenerationResult(completions, ids, cost=cost)

    def _shape(self, completion) -> RemoteCompletion:
        shaped = RemoteCompletion(text=completion.text, token_ids=list(completion.token_ids))
        shaped.finish_reason = completion.finish_reason
        shaped.logprobs = list(completion.logprobs) if caps.LOGPROBS in self.capabilities else []
        if caps.LOGPROBS in self.capabilities:  # texts of the sampled tokens (EOS has none)
            shaped.tokens = ["" if t in SPECIAL else PIECES[t] for t in completion.token_ids]
        if self.report_stops:
            shaped.stop_reason = completion.stop_reason
        if caps.TOKEN_IDS not in self.capabilities:
            shaped.token_ids = None
        return shaped
