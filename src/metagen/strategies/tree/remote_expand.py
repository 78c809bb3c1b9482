"""Step expansion over a remote engine: the same search trees, grown by completion requests.

A node is the prompt plus the text of the steps on its path (with their token ids where the
generator returns them). Expanding a parent into k children is one `continue_prefix` call:

    prefix = prompt ids + path ids     where the server takes token-id prompts and ids are known
           = prompt text + path text   otherwise (raw text on /v1/completions: no chat template
                                       is applied again to a prefix that ends mid-answer)
    params = n = k (the generator fans out when the server ignores n),
             stop = [delimiter] + params.stop, max_tokens = min(max_step_tokens, tokens left)
    child  = the step's text with the delimiter put back (servers cut stop strings from the
             text; where the tokens' text is known, the whole last token, as locally), Σ log p
             of its tokens, finished or not, then valued

Which stop ended a completion: its `stop_reason` (vLLM, SGLang, a local generator), else the
sampled tokens' text: llama.cpp's logprobs list the token holding the stop string although the
text is cut before it, so the tokens' text beyond the returned text starts with the stop that
matched, and nothing beyond it means EOS.

Chat prompts: with chat (the generator's setting unless given), a text prompt is rendered once
into text with the tokenizer's chat template (the generator's `tokenizer`); without a tokenizer
chat is refused (a server's template cannot continue a half-written answer). Without chat, the
raw question is continued. Blockwise CD's steps (no delimiter) are max_tokens = block length.

Values: text values (`reads_text`: step verifiers, LLM-judge PRMs) see the path text; token
values (`FunctionValue`) need token ids (TOKEN_IDS); values reading hidden states are refused.
Cost: the requests' own `Cost` — requests, prompt tokens computed vs served from the server's
prefix cache (as its usage reports them), generated tokens; FLOPs None unless the generator
knows its parameter count. Nothing is held per node, so `release` frees nothing.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from metagen.decoding import capabilities as caps
from metagen.decoding.cost import Cost
from metagen.decoding.prompts import Prompt
from metagen.decoding.request import refuse_token_healing
from metagen.sampling import SamplingParams
from metagen.strategies.tree.expand import Node, StepConfig


def stateful_fields(params: SamplingParams) -> list[str]:
    """The SamplingParams fields set to a value that keeps per-path state (penalties, mirostat)."""
    defaults = SamplingParams()
    names = ["repetition_penalty", "frequency_penalty", "presence_penalty", "no_repeat_ngram_size", "momentum_ngram"]
    found = [name for name in names if getattr(params, name) != getattr(defaults, name)]
    return found + (["mirostat_tau"] if params.mirostat_tau is not None else [])


def ending(completion, stops: list[str]) -> str | None:
    """The stop string that ended a completion with finish_reason "stop", or None for EOS / a
    stop token; RuntimeError when the completion does not tell (see the module docstring)."""
    if isinstance(completion.stop_reason, str):
        return completion.stop_reason
    if isinstance(completion.stop_reason, int):
        return None
    beyond = completion.past_text()
    if beyond is None:
        raise RuntimeError("the server ended a step with finish_reason 'stop' but reports neither which stop "
                           "string matched (stop_reason) nor the sampled tokens' text (logprobs): EOS and the "
                           "step delimiter cannot be told apart")
    if not beyond:
        return None
    for stop in stops:
        if beyond.startswith(stop):
            return stop
    raise RuntimeError(f"the server stopped with text {beyond!r} past the returned text, which starts with "
                       f"none of the stop strings {stops}")


class RemoteStepExpander:
    """Grows search trees through `engine.continue_prefix` (a Generator with STEP_CONTINUATION).

    engine: the generator; value: a PrefixValue (or None) applied to every new node;
    generator: the torch.Generator that seeds requests and the search's own draws.
    """

    def __init__(self, engine, prompt: Prompt, params: SamplingParams, step: StepConfig, value=None, *,
                 chat: bool | None = None, generator: torch.Generator | None = None) -> None:
        caps.require({caps.STEP_CONTINUATION}, engine, "a remote step search")
        have = engine.capabilities
        if not have & {caps.LOGPROBS, caps.TOKEN_IDS}:
            raise ValueError(f"a remote step search needs {caps.LOGPROBS} or {caps.TOKEN_IDS} to count each step's "
                             f"tokens (params.max_tokens bounds a solution); {type(engine).__name__} provides neither")
        if stateful_fields(params):
            raise ValueError(f"a remote step search needs stateless sampling: {', '.join(stateful_fields(params))} "
                             "keep per-path state, which a server continuing each prefix anew does not follow "
                             "(the local expander does)")
        if params.structured_outputs is not None:
            raise ValueError(f"structured_outputs ({params.structured_outputs.kind}) cannot be honoured by a remote "
                             "step search: every step is a new request, and a server starts the constraint afresh "
                             "at each one instead of continuing the path's matcher state; run the search on a local "
                             "model (its nodes keep their constraint state), or constrain a plain request")
        if params.n != 1:
            raise ValueError(f"params.n={params.n}: tree search sets its own branching; leave n=1")
        refuse_token_healing(params, "tree search (RemoteStepExpander)")
        self.engine, self.params, self.step, self.value = engine, params, step, value
        self.has_logprobs = caps.LOGPROBS in have
        self.token_prompts = caps.TOKEN_PROMPTS in have
        self.generator = generator if generator is not None else params.make_generator()
        self.prompt_text, self.prompt_ids = self._prompt(prompt, engine.chat if chat is None else chat)
        self._check_value(value, have)
        self.stops = ([step.delimiter] if step.delimiter is not None else []) + list(params.stop)
        self.cost = Cost()
        self.root = Node(None, [], 0, len(self.prompt_ids or []))
        if value is not None:
            self.score([self.root])

    def _prompt(self, prompt: Prompt, chat: bool | None) -> tuple[str | None, list[int] | None]:
        """(prompt text, prompt ids): ids as given (token prompts), or text rendered as documented."""
        tokenizer = self.engine.tokenizer
        if isinstance(prompt, str):
            if not prompt:
                raise ValueError("prompt is empty: give at least one character or token")
            messages = [{"role": "user", "content": prompt}] if chat else None
        else:
            items = list(prompt)
            if items and all(isinstance(item, int) and not isinstance(item, bool) for item in items):
                if not {caps.TOKEN_PROMPTS, caps.TOKEN_IDS} <= self.engine.capabilities:
                    raise ValueError(f"the prompt is token ids, but {type(self.engine).__name__} does not take token "
                                     f"prompts and return token ids ({caps.TOKEN_PROMPTS}, {caps.TOKEN_IDS}): give "
                                     "the prompt as text")
                return None, items
            messages = items
        if messages is not None:
            if tokenizer is None or tokenizer.chat_template is None:
                raise ValueError("a chat prompt on a remote step search is rendered once with the model's chat "
                                 "template, and the generator has no tokenizer with one: pass tokenizer= to the "
                                 "generator (--tokenizer PATH), or chat=False (--no-chat) to continue the raw "
                                 "question")
            final = messages[-1].get("role") == "assistant"
            text = tokenizer.apply_chat_template(messages, add_generation_prompt=not final,
                                                 continue_final_message=final)
        else:
            text = prompt
        return text, (tokenizer.encode(text, add_special_tokens=True) if tokenizer is not None else None)

    def _check_value(self, value, have) -> None:
        if value is None:
            return
        name = type(value).__name__
        if value.needs_hidden:
            raise ValueError(f"{name} reads the model's final hidden states, which a remote server does not return "
                             f"({caps.HIDDEN_STATES}: {caps.PROVIDERS[caps.HIDDEN_STATES]}); use a value over "
                             "text (a step verifier or an LLM-judge PRM) or a local model")
        if not value.reads_text and (caps.TOKEN_IDS not in have or self.prompt_ids is None):
            raise ValueError(f"{name} reads token ids, which {type(self.engine).__name__} does not give for the "
                             f"prompt and its steps ({caps.TOKEN_IDS}); give it a tokenizer, or use a value over text")

    def _prefix(self, node: Node) -> str | list[int]:
        path = node.path()
        if self.token_prompts and self.prompt_ids is not None and all(n.token_ids is not None for n in path):
            return self.prompt_ids + node.path_ids()
        return self.prompt_text + node.text

    def expand(self, parents: list[Node], counts: list[int]) -> list[list[Node]]:
        """`counts[i]` next steps of `parents[i]` (one request, or a fan-out, per parent);
        children per parent, valued, appended to `parent.children`. Finished parents raise."""
        if len(parents) != len(counts) or any(c < 0 for c in counts):
            raise ValueError(f"counts {counts} must be >= 0, one per parent ({len(parents)})")
        if any(parent.finished for parent in parents):
            raise ValueError("a finished node cannot be expanded")
        produced = []
        for parent, count in zip(parents, counts):
            if count == 0:
                produced.append([])
                continue
            used = parent.length - len(self.prompt_ids or [])
            limit = min(self.step.max_step_tokens, self.params.max_tokens - used)
            request = replace(self.params, n=count, max_tokens=limit, stop=tuple(self.stops), logprobs=None)
            result = self.engine.continue_prefix(self._prefix(parent), request, generator=self.generator)
            self.cost += result.cost
            children = [self._child(parent, completion, used) for completion in result.completions]
            parent.children += children
            produced.append(children)
        if self.value is not None:
            self.score([child for children in produced for child in children])
        return produced

    def _child(self, parent: Node, completion, used: int) -> Node:
        """The node of one completion (see the module docstring for how its end is read)."""
        ids = None if completion.token_ids is None else list(completion.token_ids)
        logprobs = list(completion.logprobs) if self.has_logprobs else []
        count = len(logprobs) if self.has_logprobs else len(ids)
        text, reason = completion.text, None
        if completion.finish_reason == "stop":
            stop = ending(completion, self.stops)
            if stop is not None and stop == self.step.delimiter and stop not in self.params.stop:
                beyond = completion.past_text()  # the whole last token, as the local expander keeps it
                text += beyond if beyond and beyond.startswith(stop) else stop
            else:
                reason = "stop"
        if reason is None and used + count >= self.params.max_tokens:
            reason = "length"  # out of tokens (after a delimiter too, as in the local expander)
        return Node(parent, ids, parent.depth + 1, parent.length + count, logprobs=logprobs,
                    finish_reason=reason, text=parent.text + text)

    def score(self, nodes: list[Node]) -> None:
        """Set `node.value` for `nodes` with one call of the value; its cost joins `self.cost`."""
        if not nodes:
            return
        if self.value.reads_text:
            values = self.value.text_values([node.text for node in nodes])
        else:
            values = self.value.values(self.prompt_ids, [node.path_ids() for node in nodes], None)
        for node, value in zip(nodes, values.values):
            node.value = float(value)
        values.cost.scorer_flops = values.cost.flops
        self.cost += values.cost

    def release(self, node: Node) -> None:
        """Nothing to free: a remote node is its text (the server keeps its own prefix cache)."""
