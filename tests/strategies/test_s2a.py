"""System 2 Attention: the answering call reads the regenerated context only (not the prompt's
distractor), the trace and values show that context, and the Cost is both calls'."""

import pytest

from metagen.decoding import Cost
from metagen.sampling import SamplingParams
from metagen.strategies.chain import ChainConfig
from metagen.strategies.chain_programs import S2A_CONTEXT, s2a
from metagen.strategies.registry import get_strategy
from tests.strategies.test_chain import ScriptedGenerator, assistant, model_cost

QUESTION = ("Mary has 3 apples and buys 4 more. Her brother Max has 10 pears. "
            "I think the answer is 12, but I'm not sure. How many apples does Mary have?")
REWRITE = " Mary has 3 apples and buys 4 more.\nQuestion: How many apples does Mary have?"


def test_the_answer_is_read_from_the_regenerated_context_only():
    script = [(REWRITE, None), (" 3 + 4 = 7. The answer is 7.", None)]
    generator = ScriptedGenerator(script)
    result = s2a(generator, QUESTION)
    rewrite_prompt, answer_prompt = generator.prompts
    assert QUESTION in rewrite_prompt[0]["content"] and assistant(rewrite_prompt) == S2A_CONTEXT
    assert len(answer_prompt) == 1 and answer_prompt[0]["role"] == "user"
    sent = answer_prompt[0]["content"]
    assert sent.startswith(S2A_CONTEXT + REWRITE)
    for distractor in ("pears", "Max", "I think the answer is 12"):
        assert distractor not in sent
    assert result.values["context"] == S2A_CONTEXT + REWRITE
    assert [(e.step, e.kind) for e in result.trace] == [("rewrite", "generate"), ("context", "transform"),
                                                       ("answer", "generate")]
    assert result.trace[1].output == result.values["context"]
    assert (result.text, result.answer) == (" 3 + 4 = 7. The answer is 7.", "7")
    both = model_cost([text for text, _ in script])
    assert result.cost == both and result.cost == result.trace[0].cost + result.trace[2].cost


def test_registered_runs_with_the_requests_params():
    spec = get_strategy("s2a")
    n, options, overrides = spec.parse({"answer_tokens": 8})
    generator = ScriptedGenerator([(" fact.\nQuestion: q?", None), (" The answer is 2.", None)])
    result = spec.run(generator, "q? I bet 3.", n, SamplingParams(temperature=0.0, max_tokens=20), options, None,
                      overrides)
    assert result.answer == "2" and [p.max_tokens for p in generator.params] == [20, 20]
    with pytest.raises(ValueError, match="strategy 's2a' takes n=1 only|out of range for strategy 's2a'"):
        spec.parse({"n": 2})


def test_the_answer_is_read_with_the_runs_pattern():
    """A many-word answer: the default extraction stops at the first space, the run's pattern
    (here the question-answering tasks' rest-of-line pattern) reads it whole, also through the
    registered runner, which hands the chain its options' pattern."""
    from metagen.eval.qa_tasks import QA_PATTERN
    from metagen.strategies.spec import StrategyOptions

    script = [(" Ethiopia -- Capital: Addis Ababa.\nQuestion: capital?", None), (" The answer is Addis Ababa.", None)]
    assert s2a(ScriptedGenerator(script), "capital? I bet Asmara.").answer == "Addis"
    config = ChainConfig(pattern=QA_PATTERN)
    assert s2a(ScriptedGenerator(script), "capital? I bet Asmara.", config).answer == "Addis Ababa"
    spec = get_strategy("s2a")
    n, options, overrides = spec.parse({})
    result = spec.run(ScriptedGenerator(script), "capital? I bet Asmara.", n, SamplingParams(temperature=0.0),
                      StrategyOptions(pattern=QA_PATTERN), None, overrides)
    assert result.answer == "Addis Ababa"
    with pytest.raises(ValueError, match=r"\(unclosed"):
        ChainConfig(pattern="(unclosed")


@pytest.mark.slow
def test_real_model_regenerates_then_answers(model):
    from metagen.decoding import LocalGenerator

    config = ChainConfig(params=SamplingParams(temperature=0.0, max_tokens=12))
    result = s2a(LocalGenerator(model), "Max has 10 pears. I think it is 5. What is 2 + 3?", config)
    rewrite, context, answer = result.trace
    assert rewrite.output.strip() and rewrite.cost.generated_tokens <= 12
    assert answer.input[0]["content"].startswith(context.output) and "pears" not in answer.input[0]["content"].replace(
        context.output, "")
    total = Cost()
    for entry in result.trace:
        total += entry.cost
    assert result.cost.model_calls == total.model_calls > 0 and result.cost.generated_tokens == total.generated_tokens
