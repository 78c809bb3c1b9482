"""chain: small programs over a `Generator` -- generate, call a tool, generate again.

    program = Chain([
        Generate("reasoning", "{question}", prefill="Let's think step by step."),
        CallTool("check", Calculator(), "{expression}"),
        Transform("answer", lambda values: values["reasoning"].split()[-1]),
    ])
    result = program.run(generator, {"question": "...", "expression": "12 * 7"})
    result.text, result.values["reasoning"], result.trace, result.cost

Steps run in order against a dict of named text values: each reads values through a
`str.format` template of plain {name} fields (`templates.py`; checked when the `Chain` is built)
or a function of the values, and stores its output under its `name`.
`Generate` sends one chat request [system?, user, assistant prefill?]; `CallTool` runs a `Tool`;
`Transform` computes a value in Python. Cost: the sum of every model call; tools add wall time
(and what a tool's own model spent, `Tool.last_cost`: a dense retriever's query encoding).

Tool loop (`Generate(..., tools=[ToolBinding, ...])`): generation stops at a binding's `close`
string; when the text then ends with a whole call `open + input + close`, the handler (a tool,
another `Generate` step: the model answering a sub-question, or a sub-program of steps: search,
then the model reading the passages) runs on the input, the call is
replaced by its answered form (e.g. `<<12*7=84>>`) and the model continues, up to
`max_tool_calls` calls, after which it writes on without tools. A close string outside a call
(the opening fence of ```python also contains ```) just continues the text.

Continuation: every continuation is the same conversation with the assistant message so far
(prefill + text + answered calls) as its final, open message; `encode_prompt` continues such a
message rather than starting a new turn (transformers' `continue_final_message`; vLLM and SGLang
have the same flag), so a chain needs a generator with ASSISTANT_CONTINUATION (the registry
refuses others before any request). The model so keeps writing its own text with the results
inline, as in Toolformer (Schick et al. 2023), GSM8K's calculator annotations (Cobbe et al.
2021) and PAL (Gao et al. 2023) --
formats a small chat model follows far better than a multi-turn tool protocol it was never tuned
on. Each continuation re-sends the prompt (its tokens are counted again in the Cost).

Ready programs (`chain_programs.py`): `chain_of_thought` (Kojima et al. 2022: reason, then a
second call extracts the answer), `self_ask` (Press et al. 2022: follow-up questions answered by
the model) and `tool_loop` / `calculator_chain`. A program whose next step depends on what the
model wrote drives a `ChainRun` step by step instead of a fixed list (`dsp.py`: Demonstrate-
Search-Predict, whose hops end when the model says the passages suffice), and `ChainRun.sample`
draws n answers of one request in one call; both land in the same trace and Cost.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from metagen.decoding.cost import Cost
from metagen.decoding.result import Completion, GenerationResult
from metagen.sampling import SamplingParams
from metagen.scoring.answers import compile_pattern
from metagen.strategies.options import check_options, option
from metagen.strategies.templates import check_template, template_fields
from metagen.tools import Tool

if TYPE_CHECKING:
    import torch

    from metagen.decoding.generator import Generator

Template = str | Callable[[Mapping[str, str]], str]


@dataclass(frozen=True)
class ChainConfig:
    """params: sampling of `Generate` steps that have none of their own (`n` is set to 1); the
    tool-call limits and the ready programs' answer length are declared with their fields;
    pattern: the run's answer regex (`StrategyOptions.pattern`, group 1 the answer) with which the
    programs that extract an answer from free text (s2a, the tool loops) read it; None: the
    default extraction ("The answer is X" up to a space, else the last number)."""

    params: SamplingParams = SamplingParams(temperature=0.0, max_tokens=256)
    max_tool_calls: int = option(4, int, "tool calls per Generate step", low=0, high=64, sizes_work=True)
    max_tool_chars: int = option(1000, int, "a tool's answer is clipped to this many characters", low=1,
                                 high=100_000)
    answer_tokens: int = option(32, int, "max_tokens of the ready programs' short answering calls", low=1, high=4096)
    pattern: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.params, SamplingParams):
            raise ValueError(f"params={self.params!r} must be a SamplingParams")
        if self.pattern is not None:
            compile_pattern(self.pattern)  # refused now, naming the pattern, not at the first answer
        check_options(self)


@dataclass(frozen=True)
class Generate:
    """One model call (a tool loop when `tools` is given); its output is the generated text after
    the prefill, answered tool calls included."""

    name: str
    template: Template
    params: SamplingParams | None = None
    system: Template | None = None
    prefill: Template = ""
    tools: tuple[ToolBinding, ...] = ()


@dataclass(frozen=True)
class ToolBinding:
    """How a handler is called inside generated text: `open + input + close`.

    handler: a `Tool`, a `Generate` step whose values include {input} (the model answers), or a
        tuple of steps run in order on those values, the last one's output answering (a sub-program:
        `CallTool` a retriever on {input}, then `Generate` an answer from its passages).
    answer: how the answered call reads afterwards; fields {open}, {input}, {close}, {output}.
    input_separator: when set, only the text before it is the input (the model's own guess after
        it is dropped and recomputed: `<<12*7=85>>` becomes `<<12*7=84>>`).
    """

    handler: Tool | Generate | tuple[Generate | CallTool | Transform, ...]
    open: str
    close: str
    answer: str = "{open}{input}{close}{output}"
    input_separator: str | None = None


@dataclass(frozen=True)
class CallTool:
    """Run `tool` on the filled `input` template."""

    name: str
    tool: Tool
    input: Template


@dataclass(frozen=True)
class Transform:
    """A value computed in Python from the values so far."""

    name: str
    function: Callable[[Mapping[str, str]], str]


@dataclass
class TraceEntry:
    """One model call or tool call. kind: "generate" (input: the chat messages sent), "tool"
    (input: the tool's input text), "transform", or "demonstrate" (DSP's bootstrapped
    demonstrations: input what they were drawn from, cost what bootstrapping them spent)."""

    step: str
    kind: str
    input: object
    output: str
    cost: Cost


@dataclass
class ChainResult(GenerationResult):
    """candidates: one per step, in order (chosen: the output step's); values: every named value;
    trace: every model and tool call in order."""

    values: dict[str, str] = field(default_factory=dict)
    trace: list[TraceEntry] = field(default_factory=list)


ANSWER_FIELDS = {"open", "input", "close", "output"}  # the fields of a ToolBinding's answer


def _check_templates(step: Generate | CallTool | Transform) -> None:
    """ValueError naming the template of `step` (or of a binding's handler) that is not plain named
    fields (`templates.template_fields`); which names exist is known only at run time (`_fill`)."""
    parts = {"input": step.input} if isinstance(step, CallTool) else {}
    if isinstance(step, Generate):
        parts = {"template": step.template, "system": step.system, "prefill": step.prefill}
    for part, template in parts.items():
        if template is not None and not callable(template):
            template_fields(f"{step.name}.{part}", template)
    if not isinstance(step, Generate):
        return
    for index, binding in enumerate(step.tools):
        check_template(f"{step.name}.tools[{index}].answer", binding.answer, set(), ANSWER_FIELDS)
        for handler in binding.handler if isinstance(binding.handler, tuple) else (binding.handler,):
            if isinstance(handler, (Generate, CallTool)):
                _check_templates(handler)


def _fill(template: Template, values: Mapping[str, str], step: str) -> str:
    if callable(template):
        return str(template(values))
    try:
        return template.format_map(values)
    except KeyError as error:
        raise ValueError(f"step {step!r} needs the value {error.args[0]!r}; known: {sorted(values)}") from None


class Chain:
    """A program of steps; `run` executes it and returns a `ChainResult`.

    output: the name of the step whose output is the result (default: the last step).
    """

    def __init__(self, steps: Sequence[Generate | CallTool | Transform], output: str | None = None,
                 config: ChainConfig | None = None) -> None:
        self.steps, self.config = list(steps), config or ChainConfig()
        names = [step.name for step in self.steps]
        if not names or len(set(names)) != len(names) or not all(isinstance(n, str) and n for n in names):
            raise ValueError(f"steps must be a non-empty list with distinct, non-empty names; got {names}")
        self.output = names[-1] if output is None else output
        if self.output not in names:
            raise ValueError(f"output={output!r} is not the name of a step: {names}")
        for step in self.steps:
            _check_templates(step)

    def run(self, generator: Generator, inputs: Mapping[str, str], *, rng: torch.Generator | None = None) -> ChainResult:
        state = ChainRun(generator, self.config, rng)
        values = {str(key): str(value) for key, value in inputs.items()}
        candidates: dict[str, Completion] = {}
        for step in self.steps:
            candidate = state.step(step, values)
            values[step.name] = candidate.text
            candidates[step.name] = candidate
        return ChainResult(list(candidates.values()), cost=state.cost, chosen=candidates[self.output],
                           values=values, trace=state.trace)


class ChainRun:
    """The state of one run: the trace and the summed cost. `Chain.run` drives it through a fixed
    list of steps; a program whose steps depend on what the model wrote (DSP's hops, which end
    when the model says the passages suffice) drives `step` itself, in the same trace and Cost."""

    def __init__(self, generator: Generator, config: ChainConfig, rng: torch.Generator | None) -> None:
        self.generator, self.config, self.rng = generator, config, rng
        self.trace: list[TraceEntry] = []
        self.cost = Cost()

    def call(self, step: str, tool: Tool, text: str) -> str:
        start = time.perf_counter()
        output = tool(text)
        cost = Cost(wall_seconds=time.perf_counter() - start)
        if tool.last_cost is not None:  # what the tool's own model spent (a retriever's encoder)
            cost = replace(tool.last_cost, wall_seconds=cost.wall_seconds)
        self.cost += cost
        self.trace.append(TraceEntry(f"{step}/{tool.name}", "tool", text, output, cost))
        return output

    def step(self, step: Generate | CallTool | Transform, values: Mapping[str, str]) -> Completion:
        """Run one step on `values`; its output is the completion's text."""
        if isinstance(step, Generate):
            return self.generate(step, values)
        if isinstance(step, CallTool):
            output = self.call(step.name, step.tool, _fill(step.input, values, step.name))
            return Completion(output, finish_reason="tool")
        if isinstance(step, Transform):
            output = str(step.function(values))
            self.trace.append(TraceEntry(step.name, "transform", None, output, Cost()))
            return Completion(output, finish_reason="transform")
        raise TypeError(f"unknown step type {type(step).__name__}")

    def sample(self, step: Generate, values: Mapping[str, str], n: int) -> list[Completion]:
        """n samples of `step`'s request drawn in one `generate` call (shared prompt, as
        self-consistency draws its candidates), without tools: the completions, one trace entry
        (output: the samples' texts, numbered "[i] ") and the call's cost."""
        if step.tools:
            raise ValueError(f"step {step.name!r}: sampling n answers of one request takes no tools")
        params = replace(step.params or self.config.params, n=n)
        messages, prefill = _messages(step, values)
        prompt = messages + [{"role": "assistant", "content": prefill}] if prefill else messages
        result = self.generator.generate(prompt, params, generator=self.rng)
        self.cost += result.cost
        output = "\n".join(f"[{index}] {completion.text}" for index, completion in enumerate(result.completions, 1))
        self.trace.append(TraceEntry(step.name, "generate", prompt, output, result.cost))
        return result.completions

    def program(self, steps: Sequence[Generate | CallTool | Transform], values: Mapping[str, str]) -> str:
        """A handler's sub-program: its steps in order on a copy of `values`; the last one's output."""
        values, output = dict(values), ""
        for step in steps:
            output = values[step.name] = self.step(step, values).text
        return output

    def generate(self, step: Generate, values: Mapping[str, str]) -> Completion:
        """One generation, continued around tool calls (see the module docstring)."""
        params = replace(step.params or self.config.params, n=1)
        messages, prefill = _messages(step, values)
        closes = tuple(dict.fromkeys(binding.close for binding in step.tools))
        text, token_ids, logprobs, calls, budget, finish = "", [], [], 0, params.max_tokens, None
        for _ in range(2 * self.config.max_tool_calls + 1):  # a call may take two stops (open fence, close)
            use_tools = bool(closes) and calls < self.config.max_tool_calls
            request = replace(params, max_tokens=budget, stop=params.stop + closes if use_tools else params.stop)
            prompt = messages + [{"role": "assistant", "content": prefill + text}] if prefill or text else messages
            result = self.generator.generate(prompt, request, generator=self.rng)
            completion = result.completions[0]
            self.cost += result.cost
            self.trace.append(TraceEntry(step.name, "generate", prompt, completion.text, result.cost))
            text += completion.text
            token_ids = None if token_ids is None or completion.token_ids is None else token_ids + completion.token_ids
            logprobs += completion.logprobs
            budget -= result.generated_tokens  # n = 1: this completion's tokens (from the cost where ids are unknown)
            finish = completion.finish_reason
            if not use_tools or completion.stop_reason not in closes or budget <= 0:
                break
            text += completion.stop_reason
            call = _find_call(text, step.tools, completion.stop_reason)
            if call is None:
                continue
            binding, start, body = call
            raw_input = body.split(binding.input_separator)[0] if binding.input_separator else body
            if isinstance(binding.handler, Generate):
                output = self.generate(binding.handler, {**values, "input": raw_input.strip()}).text.strip()
            elif isinstance(binding.handler, tuple):
                output = self.program(binding.handler, {**values, "input": raw_input.strip()}).strip()
            else:
                output = self.call(step.name, binding.handler, raw_input.strip())
            if len(output) > self.config.max_tool_chars:
                output = output[: self.config.max_tool_chars] + " ..."
            text = text[:start] + binding.answer.format(open=binding.open, input=raw_input, close=binding.close,
                                                        output=output)
            calls += 1
        return Completion(text, token_ids, logprobs, finish_reason=finish)


def _messages(step: Generate, values: Mapping[str, str]) -> tuple[list[dict], str]:
    """The chat messages [system?, user] of `step` on `values`, and its filled prefill."""
    messages = [{"role": "user", "content": _fill(step.template, values, step.name)}]
    if step.system is not None:
        messages.insert(0, {"role": "system", "content": _fill(step.system, values, step.name)})
    return messages, _fill(step.prefill, values, step.name)


def _find_call(text: str, bindings: Sequence[ToolBinding], close: str) -> tuple[ToolBinding, int, str] | None:
    """The unanswered call that `text` ends with: (binding, where it opens, the text between)."""
    for binding in bindings:
        if binding.close != close:
            continue
        start = text.rfind(binding.open, 0, len(text) - len(close))
        body = text[start + len(binding.open): len(text) - len(close)]
        if start >= 0 and close not in body:
            return binding, start, body
    return None
