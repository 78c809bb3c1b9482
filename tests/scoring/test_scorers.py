"""The scorer interface, the logprob scorers and self-certainty's per-token values."""

import math

import pytest
import torch

from metagen.decoding import Cost
from metagen.decoding.sample_loop import generate
from metagen.sampling import SamplingParams
from metagen.scoring import (
    FunctionScorer,
    Scorer,
    Scores,
    Verdict,
    Verifier,
    as_scorer,
    mean_logprob,
    prompt_text,
    self_certainty,
    sum_logprob,
)
from metagen.strategies import BestOfNConfig, best_of_n
from metagen.strategies.borda_voting import borda_weights
from metagen.decoding.result import Completion
from tests.decoding.toy_model import BOS, ToyModel, next_logits
from tests.strategies.test_voting_strategies import OUTPUTS, CannedGenerator


def test_logprob_scorers_and_self_certainty_values():
    a = Completion("x", [1, 2], [-0.5, -1.5], certainties=[2.0, 4.0])
    b = Completion("", [], [])
    assert sum_logprob("q", [a, b]).values == [-2.0, 0.0]
    assert mean_logprob("q", [a, b]).values == [-1.0, float("-inf")]
    assert self_certainty("q", [a, b]).values == [3.0, float("-inf")]
    assert sum_logprob("q", [a]).cost == Cost()
    with pytest.raises(ValueError, match="full next-token distribution"):
        self_certainty("q", [Completion("x", [1], [-0.1])])


def test_certainties_are_kl_from_uniform_of_the_raw_distribution(one_thread):
    model = ToyModel()
    params = SamplingParams(temperature=0.7, top_k=3, max_tokens=5, seed=1, n=3, ignore_eos=True)
    result = generate(model, [BOS], params)
    for completion in result.completions:
        assert len(completion.certainties) == len(completion.token_ids)
        context = [BOS]
        for token, value in zip(completion.token_ids, completion.certainties):
            log_p = torch.log_softmax(next_logits(context).double(), dim=-1)
            expected = float((torch.exp(torch.full_like(log_p, -math.log(5))) * (-math.log(5) - log_p)).sum())
            assert value == pytest.approx(expected, abs=1e-5)  # KL(U || p), untouched by temperature/top-k
            assert value >= 0
            context.append(token)


class CountingScorer(Scorer):
    name = "counting"

    def score(self, prompt, candidates):
        return Scores([float(len(c.text)) for c in candidates], Cost(model_calls=2, flops=10.0))


def test_strategies_add_the_scorers_cost():
    generator = CannedGenerator(OUTPUTS)
    result = best_of_n(generator, "q", BestOfNConfig(n=5), scorer=CountingScorer())
    assert result.text == "I get \\boxed{\\frac{1}{2}}"
    assert result.cost.model_calls == 3 + 2 and result.cost.flops == 10.0
    by_function = best_of_n(CannedGenerator(OUTPUTS), "q", BestOfNConfig(n=5), scorer=lambda p, c: -len(c.text))
    assert by_function.text == "it is 3"


def test_a_scorer_returning_the_wrong_count_is_an_error():
    class Broken(Scorer):
        def score(self, prompt, candidates):
            return Scores([1.0])

    with pytest.raises(ValueError, match="1 scores for 2 candidates"):
        Broken()("q", [Completion("a"), Completion("b")])
    with pytest.raises(TypeError, match="Scorer or a function"):
        as_scorer(3)


def test_a_verifier_scores_with_its_verdicts():
    class Even(Verifier):
        def verify(self, prompt, candidate):
            ok = len(candidate.text) % 2 == 0
            return Verdict(ok, 1.0 if ok else 0.25, "" if ok else "odd length", Cost(model_calls=1))

    scores = Even()("q", [Completion("ab"), Completion("abc")])
    assert scores.values == [1.0, 0.25] and scores.cost.model_calls == 2
    assert isinstance(as_scorer(mean_logprob), FunctionScorer)


def test_prompt_text():
    assert prompt_text("hi") == "hi"
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "u1"},
                {"role": "assistant", "content": "a"}, {"role": "user", "content": "u2"}]
    assert prompt_text(messages) == "u2"
    assert prompt_text([1, 2, 3]) == ""


def test_borda_weights():
    assert borda_weights([0.1, 0.9, 0.5], 1.0) == [1.0, 3.0, 2.0]
    assert borda_weights([0.1, 0.9, 0.5], 0.0) == [1.0, 1.0, 1.0]
    assert borda_weights([0.5, 0.5, 0.1], 1.0) == [2.5, 2.5, 1.0]
    assert borda_weights([0.3, 0.2], 0.5) == pytest.approx([math.sqrt(2), 1.0])


def test_exact_answer_verifier():
    from metagen.scoring import ExactAnswerVerifier

    verifier = ExactAnswerVerifier("1/2")
    good, bad, none = Completion("so it is \\boxed{0.5}"), Completion("it is 3"), Completion("no idea")
    verdicts = verifier.verify_all("q", [good, bad, none])
    assert [v.passed for v in verdicts] == [True, False, False]
    assert "3 is incorrect" in verdicts[1].feedback and "No final answer" in verdicts[2].feedback
    assert verifier("q", [good, bad]).values == [1.0, 0.0]
    assert not ExactAnswerVerifier("1/2", math=False).verify("q", good).passed
    assert ExactAnswerVerifier("yes", pattern=r"A: (\w+)").verify("q", Completion("A: yes")).passed


def test_scoring_reads_the_decoding_floors_completion_and_imports_no_strategy():
    """Scorers and verifiers take `Completion`s (decoding/result.py), the type strategies return,
    so no scoring module imports metagen.strategies (not even for type checking): no cycle."""
    import ast
    from pathlib import Path

    import metagen.scoring

    upward = []
    for path in sorted(Path(metagen.scoring.__file__).parent.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else \
                [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
            upward += [f"{path.name}: {name}" for name in names if name.startswith("metagen.strategies")]
    assert upward == []
