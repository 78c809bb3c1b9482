"""Beam search under a constraint (config.structured_outputs): exact against brute force on the
enumerable toy model, and JSON-schema validity on the real embedded model."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("llguidance")

from metagen.decoding import BeamSearchConfig, beam_search  # noqa: E402

from .toy_choice_constraint import StructuredToyModel, choice_sequences  # noqa: E402
from .toy_model import BOS, C, step_logprobs  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPT = [BOS]
# "ccc" is the model's favourite run (p(c c c) ≈ 0.15), but only "cccc" is a choice: cut at three
# tokens it is the highest-scoring sequence of all, and incomplete.
CHOICES = ("ab", "b", "bab", "cb", "cccc", "acb")


def brute_force(choices, max_tokens, alpha):
    """Every allowed sequence as (complete, score, logprob, sequence), in beam search's order:
    complete ones first, each group by score logp / len^α."""
    ranked = []
    for sequence, complete in choice_sequences(choices, max_tokens).items():
        logprob = sum(step_logprobs(PROMPT, sequence))
        ranked.append((complete, logprob / len(sequence) ** alpha, logprob, sequence))
    return sorted(ranked, reverse=True)


@pytest.mark.parametrize("alpha", [0.0, 1.0])
def test_a_beam_as_wide_as_the_valid_space_equals_the_brute_force_ranking(alpha):
    expected = brute_force(CHOICES, 3, alpha)
    assert any(not complete for complete, *_ in expected) and any(complete for complete, *_ in expected)
    width = len(expected)
    config = BeamSearchConfig(width=width, n_best=width, length_penalty=alpha, max_tokens=3,
                              structured_outputs={"choice": list(CHOICES)})
    hypotheses = beam_search(StructuredToyModel(), PROMPT, config).completions
    assert [tuple(h.token_ids) for h in hypotheses] == [sequence for *_, sequence in expected]
    assert [h.complete for h in hypotheses] == [complete for complete, *_ in expected]
    assert [h.score for h in hypotheses] == pytest.approx([score for _, score, _, _ in expected], abs=1e-5)
    assert [h.cumulative_logprob for h in hypotheses] == pytest.approx([logprob for _, _, logprob, _ in expected], abs=1e-5)
    for h in hypotheses:
        assert (h.text in CHOICES) == h.complete


def test_the_incomplete_best_scorer_is_never_ranked_first():
    # alpha = 1: "c c c" (cut, incomplete) has the best normalized score of every allowed sequence
    scored = sorted(brute_force(CHOICES, 3, 1.0), key=lambda entry: entry[1], reverse=True)
    assert scored[0][3] == (C, C, C) and scored[0][0] is False
    config = BeamSearchConfig(width=3, n_best=3, length_penalty=1.0, max_tokens=3,
                              structured_outputs={"choice": list(CHOICES)})
    best = beam_search(StructuredToyModel(), PROMPT, config).completions
    assert best[0].complete is True and best[0].text in CHOICES
    assert [h.complete for h in best] == sorted((h.complete for h in best), reverse=True)
    # with room to finish, "cccc" is complete and may win
    roomy = beam_search(StructuredToyModel(), PROMPT, BeamSearchConfig(
        width=3, length_penalty=1.0, max_tokens=6, structured_outputs={"choice": list(CHOICES)})).completions[0]
    assert roomy.complete is True and roomy.text in CHOICES


@pytest.mark.parametrize("width", [1, 2, 4])
def test_narrow_beams_return_only_allowed_sequences_with_the_constraints_verdict(width):
    allowed = choice_sequences(CHOICES, 4)
    config = BeamSearchConfig(width=width, n_best=width, length_penalty=0.5, max_tokens=4,
                              structured_outputs={"choice": list(CHOICES)})
    for h in beam_search(StructuredToyModel(), PROMPT, config).completions:
        assert allowed[tuple(h.token_ids)] == h.complete


def test_stochastic_beam_search_samples_allowed_sequences_only():
    import torch

    allowed = choice_sequences(CHOICES, 4)
    config = BeamSearchConfig(width=3, n_best=3, stochastic=True, max_tokens=4,
                              structured_outputs={"choice": list(CHOICES)})
    generator = torch.Generator().manual_seed(0)
    for _ in range(30):
        hypotheses = beam_search(StructuredToyModel(), PROMPT, config, generator=generator).completions
        for h in hypotheses:
            assert allowed[tuple(h.token_ids)] == h.complete
        assert [h.complete for h in hypotheses] == sorted((h.complete for h in hypotheses), reverse=True)


def test_config_checks_the_constraint_like_sampling_params():
    with pytest.raises(ValueError, match="structured_outputs.regex"):
        BeamSearchConfig(structured_outputs={"regex": "("})
    with pytest.raises(ValueError, match="ignore_eos=True cannot be combined with structured_outputs"):
        BeamSearchConfig(ignore_eos=True, structured_outputs={"choice": ["a"]})
    config = BeamSearchConfig(response_format={"type": "json_object"})
    assert config.structured_outputs.kind == "json_object" and config.response_format is None


@pytest.mark.slow
def test_json_schema_beam_search_on_the_real_model_validates(model):
    jsonschema = pytest.importorskip("jsonschema")
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                               "age": {"type": "integer", "minimum": 0, "maximum": 120}},
              "required": ["name", "age"], "additionalProperties": False}
    config = BeamSearchConfig(width=3, n_best=3, max_tokens=40, structured_outputs={"json": schema})
    hypotheses = beam_search(model, "Describe a person as JSON.", config).completions
    assert hypotheses[0].complete is True
    for h in hypotheses:
        if h.complete:
            jsonschema.validate(json.loads(h.text), schema)
