"""chain: exact control flow with a scripted generator (prompts sent, tool inputs, tool outputs in
the next prompt, summed costs), the ready programs, and a run on the real model."""

import pytest

from metagen.decoding import capabilities as caps
from metagen.decoding import Cost, Generator
from metagen.decoding.result import Completion, GenerationResult
from metagen.sampling import SamplingParams
from metagen.strategies.chain import CallTool, Chain, ChainConfig, Generate, ToolBinding, Transform
from metagen.strategies.chain_programs import (
    CALCULATOR_SYSTEM,
    COT_TRIGGER,
    _after_marker,
    calculator_binding,
    calculator_chain,
    chain_of_thought,
    python_binding,
    self_ask,
    tool_loop,
)
from metagen.tools import Calculator, FunctionTool


class ScriptedGenerator(Generator):
    """Answers each request with the next scripted (text, stop_reason) and records the requests.
    A stop_reason of None means the model ended by itself (EOS). One token per character, so
    the costs and token budgets are predictable."""

    capabilities = frozenset({caps.TOKEN_IDS, caps.LOGPROBS, caps.ASSISTANT_CONTINUATION})

    def __init__(self, script):
        self.script = list(script)
        self.prompts, self.params = [], []

    def generate(self, prompt, params, *, generator=None):
        self.prompts.append([dict(message) for message in prompt])
        self.params.append(params)
        text, stop_reason = self.script.pop(0)
        assert params.n == 1 and (stop_reason is None or stop_reason in params.stop)
        tokens = len(text)
        completion = Completion(text=text, token_ids=list(range(tokens)), logprobs=[-0.5] * tokens,
                                finish_reason="stop", stop_reason=stop_reason)
        cost = Cost(model_calls=tokens + 1, prompt_tokens_computed=10, generated_tokens=tokens, flops=100.0 * tokens)
        return GenerationResult([completion], [0] * 10, cost=cost)


def assistant(prompt):
    assert prompt[-1]["role"] == "assistant"
    return prompt[-1]["content"]


def model_cost(generator_calls):
    total = Cost()
    for text in generator_calls:
        total += Cost(model_calls=len(text) + 1, prompt_tokens_computed=10, generated_tokens=len(text), flops=100.0 * len(text))
    return total


def test_calculator_loop_runs_the_tool_and_continues_the_same_message():
    script = [("12 boxes cost 12*7 = <<12*7", ">>"), ("84, plus 16 is <<84+16=99", ">>"), ("100. The answer is 100.", None)]
    generator = ScriptedGenerator(script)
    result = calculator_chain(generator, "What do 12 boxes at 7 cost, plus 16?")

    first, second, third = generator.prompts
    assert first == [{"role": "system", "content": CALCULATOR_SYSTEM},
                     {"role": "user", "content": "What do 12 boxes at 7 cost, plus 16?"}]
    assert assistant(second) == "12 boxes cost 12*7 = <<12*7=84>>"
    assert assistant(third) == "12 boxes cost 12*7 = <<12*7=84>>84, plus 16 is <<84+16=100>>"  # the model's 99 recomputed
    assert second[:-1] == first and third[:-1] == first
    assert result.text == "12 boxes cost 12*7 = <<12*7=84>>84, plus 16 is <<84+16=100>>100. The answer is 100."
    assert result.answer == "100"

    assert [(e.step, e.kind) for e in result.trace] == [
        ("solution", "generate"), ("solution/calculator", "tool"), ("solution", "generate"),
        ("solution/calculator", "tool"), ("solution", "generate")]
    assert [(e.input, e.output) for e in result.trace if e.kind == "tool"] == [("12*7", "84"), ("84+16", "100")]
    assert all(">>" in p.stop for p in generator.params)
    # the token budget is shared by the segments: 256, then 256 - 27, then 256 - 27 - 25
    assert [p.max_tokens for p in generator.params] == [256, 229, 204]

    expected = model_cost([text for text, _ in script])
    tool_seconds = sum(e.cost.wall_seconds for e in result.trace if e.kind == "tool")
    assert result.cost.model_calls == expected.model_calls and result.cost.flops == expected.flops
    assert result.cost.generated_tokens == expected.generated_tokens == len(result.chosen.token_ids)
    assert result.cost.wall_seconds == pytest.approx(tool_seconds)  # the scripted model takes no time
    assert len(result.chosen.logprobs) == len(result.chosen.token_ids)


def test_tool_errors_are_text_and_the_call_limit_turns_tools_off():
    script = [("<<1/0", ">>"), (" so <<2+2", ">>"), ("4>> done", None)]
    generator = ScriptedGenerator(script)
    result = tool_loop(generator, "q", config=ChainConfig(max_tool_calls=2))
    assert assistant(generator.prompts[1]) == "<<1/0=error: division by zero>>"
    assert assistant(generator.prompts[2]) == "<<1/0=error: division by zero>> so <<2+2=4>>"

    limited = ScriptedGenerator([("<<2*3", ">>"), (" and <<5*5>> unanswered", None)])
    result = tool_loop(limited, "q", config=ChainConfig(max_tool_calls=1))
    assert ">>" in limited.params[0].stop and ">>" not in limited.params[1].stop
    assert result.text == "<<2*3=6>> and <<5*5>> unanswered"
    assert [e.kind for e in result.trace] == ["generate", "tool", "generate"]


def test_python_fence_loop_continues_past_the_opening_fence():
    seen = []
    python = FunctionTool(lambda code: seen.append(code) or "42", name="python")
    script = [("Let me compute.\n", "```"), ("python\nprint(6 * 7)\n", "```"), ("So it is 42.", None)]
    generator = ScriptedGenerator(script)
    result = tool_loop(generator, "6 times 7?", tools=[python_binding(python)], system="Use Python.")
    assert assistant(generator.prompts[1]) == "Let me compute.\n```"  # an opening fence is no call
    assert seen == ["print(6 * 7)"]
    assert assistant(generator.prompts[2]) == "Let me compute.\n```python\nprint(6 * 7)\n```\n```output\n42\n```\n"
    assert result.text.endswith("```output\n42\n```\nSo it is 42.") and result.answer == "42"


def test_python_binding_runs_the_sandbox():
    script = [("```", "```"), ("python\nprint(sum(range(10)))\n", "```"), ("Done.", None)]
    generator = ScriptedGenerator(script)
    result = tool_loop(generator, "q", tools=[python_binding()], system="s")
    assert "```output\n45\n```" in assistant(generator.prompts[2])
    assert [e.output for e in result.trace if e.kind == "tool"] == ["45"]


def test_chain_of_thought_prompts_and_answer():
    script = [(" 12 * 7 is 84, and 84 + 16 is 100.", None), (" 100.", "\n")]
    generator = ScriptedGenerator(script)
    result = chain_of_thought(generator, "What is 12 * 7 + 16?")
    reasoning_prompt, answer_prompt = generator.prompts
    assert reasoning_prompt == [{"role": "user", "content": "What is 12 * 7 + 16?"},
                                {"role": "assistant", "content": COT_TRIGGER}]
    assert assistant(answer_prompt) == COT_TRIGGER + " 12 * 7 is 84, and 84 + 16 is 100.\nTherefore, the final answer is"
    assert generator.params[1].max_tokens == 32 and generator.params[1].stop == ("\n",)
    assert generator.params[0].max_tokens == 256 and generator.params[0].greedy
    assert result.values["reasoning"] == " 12 * 7 is 84, and 84 + 16 is 100."
    assert (result.text, result.answer) == (" 100.", "100")
    assert [c.text for c in result.completions] == [" 12 * 7 is 84, and 84 + 16 is 100.", " 100."]
    assert result.cost == model_cost([text for text, _ in script])


@pytest.mark.parametrize("decomposition, answer", [
    ("Follow up: When?\nIntermediate answer: 1889.\nSo the final answer is: the tower", "the tower"),
    ("No.\nThe final answer is Paris.", "Paris."),
    ("Yes.\nFinal Answer: 42\n", "42"),
    ("final answer is - 1886", "1886"),
    ("So the final answer is: A\nFinal answer: B", "B"),  # the last marker
    ("So the final answer is:\nthe bridge\nmore text", "the bridge"),  # the answer on the next line
    ("So the final answer is:\n", ""),  # a marker with nothing after it: no answer
    ("Yes.\nThe tower is older.", "The tower is older."),  # no marker: the last line
    ("To reach the final answer we compare.\nThe tower.", "The tower."),  # prose, no marker
])
def test_self_ask_reads_the_answer_after_the_forms_of_the_final_answer_line(decomposition, answer):
    assert _after_marker(decomposition) == answer


def test_self_ask_answers_follow_up_questions_with_the_model():
    script = [
        (" Yes.\nFollow up: When was the bridge built?\n", "Intermediate answer:"),
        ("In 1932.", None),  # the follow-up answered by a separate model call
        ("Follow up: When was the tower built?\n", "Intermediate answer:"),
        ("In 1889.", None),
        ("So the final answer is: the tower.\n", "\nQuestion:"),
    ]
    generator = ScriptedGenerator(script)
    result = self_ask(generator, "Which is older, the bridge or the tower?")
    prompts = generator.prompts
    assert prompts[0][0]["content"].endswith("Question: Which is older, the bridge or the tower?")
    assert assistant(prompts[0]) == "Are follow up questions needed here:"
    assert prompts[1] == [{"role": "user", "content": "Answer in a few words.\nQuestion: When was the bridge built?"}]
    assert assistant(prompts[2]).endswith("Follow up: When was the bridge built?\nIntermediate answer: In 1932.\n")
    assert prompts[3][0]["content"].endswith("Question: When was the tower built?")
    assert assistant(prompts[4]).endswith("Intermediate answer: In 1889.\n")
    assert "\nQuestion:" in generator.params[0].stop and "Intermediate answer:" in generator.params[0].stop
    assert result.answer == "the tower"
    assert [e.step for e in result.trace] == ["decomposition", "intermediate", "decomposition", "intermediate",
                                              "decomposition", "answer"]
    assert result.cost == model_cost([text for text, _ in script])


def test_general_program_with_tool_and_transform_steps():
    generator = ScriptedGenerator([(" 3 * 14", None), (" It is 42.", None)])
    program = Chain([
        Generate("expression", "Write {a} times {b} as an expression."),
        CallTool("value", Calculator(), "{expression}"),
        Generate("sentence", lambda values: f"Say that the value is {values['value']}.",
                 params=SamplingParams(temperature=0.0, max_tokens=8), system="Be brief."),
        Transform("shout", lambda values: values["sentence"].upper()),
    ], output="sentence")
    result = program.run(generator, {"a": "3", "b": "14"})
    assert generator.prompts[0] == [{"role": "user", "content": "Write 3 times 14 as an expression."}]
    assert generator.prompts[1] == [{"role": "system", "content": "Be brief."},
                                    {"role": "user", "content": "Say that the value is 42."}]
    assert generator.params[1].max_tokens == 8
    assert result.values == {"a": "3", "b": "14", "expression": " 3 * 14", "value": "42",
                             "sentence": " It is 42.", "shout": " IT IS 42."}
    assert result.text == " It is 42." and [c.finish_reason for c in result.completions] == ["stop", "tool", "stop", "transform"]
    assert [(e.step, e.kind) for e in result.trace] == [("expression", "generate"), ("value/calculator", "tool"),
                                                       ("sentence", "generate"), ("shout", "transform")]


def test_validation_names_the_problem():
    with pytest.raises(ValueError, match="max_tool_calls=65 is out of range"):
        ChainConfig(max_tool_calls=65)
    with pytest.raises(ValueError, match="answer_tokens=0 is out of range"):
        ChainConfig(answer_tokens=0)
    with pytest.raises(ValueError, match="distinct"):
        Chain([Transform("x", str), Transform("x", str)])
    with pytest.raises(ValueError, match="output='y'"):
        Chain([Transform("x", str)], output="y")
    with pytest.raises(ValueError, match="needs the value 'missing'"):
        Chain([Generate("x", "{missing}")]).run(ScriptedGenerator([]), {})
    binding = calculator_binding()
    assert isinstance(binding, ToolBinding) and (binding.open, binding.close) == ("<<", ">>")


@pytest.mark.slow
def test_real_model_continues_its_message_and_costs_add_up(model):
    from metagen.decoding import LocalGenerator
    from metagen.decoding.prompts import encode_prompt

    generator = LocalGenerator(model)
    config = ChainConfig(params=SamplingParams(temperature=0.0, max_tokens=16), answer_tokens=6)
    result = chain_of_thought(generator, "What is 12 * 7?", config)
    reasoning, answer = result.trace
    assert reasoning.output == result.values["reasoning"] and reasoning.output.strip()
    assert answer.input[-1]["content"].startswith(COT_TRIGGER + reasoning.output)
    ids = encode_prompt(model.tokenizer, answer.input)
    assert model.tokenizer.decode(ids).endswith("Therefore, the final answer is")  # continued, not closed
    assert result.cost.model_calls == reasoning.cost.model_calls + answer.cost.model_calls > 0
    assert result.cost.flops > 0 and len(result.completions) == 2

    looped = calculator_chain(generator, "A box holds 12 eggs. How many eggs are in 7 boxes?", config)
    generates = [e for e in looped.trace if e.kind == "generate"]
    tools = [e for e in looped.trace if e.kind == "tool"]
    assert 1 <= len(generates) <= 2 * config.max_tool_calls + 1 and len(tools) <= config.max_tool_calls
    for index, entry in enumerate(looped.trace[:-1]):
        if entry.kind == "tool":  # the next model call continues the text that now holds the result
            assert f"={entry.output}>>" in looped.trace[index + 1].input[-1]["content"]
    total = Cost()
    for entry in looped.trace:
        total += entry.cost
    assert looped.cost.model_calls == total.model_calls and looped.cost.generated_tokens == total.generated_tokens
    assert looped.cost.generated_tokens == len(looped.chosen.token_ids) <= 16
