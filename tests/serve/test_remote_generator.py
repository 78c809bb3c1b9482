"""metagen's own remote generator (`metagen.remote.OpenAIGenerator`) over `metagen serve`: the probe
finds every feature, and its completions equal the local sampling loop's."""

from __future__ import annotations

import pytest

from metagen.decoding import capabilities as caps
from metagen.decoding import generate
from metagen.sampling import SamplingParams

pytest.importorskip("httpx")
pytestmark = pytest.mark.slow


def test_openai_generator_over_metagen_serve(server, model):
    from metagen.remote import OpenAIGenerator

    generator = OpenAIGenerator(server.url + "/v1", tokenizer=model.tokenizer, chat=False)
    try:
        params = SamplingParams(temperature=0.8, seed=4, n=2, max_tokens=12, logprobs=2, top_k=50)
        result = generator.generate("The weather today is", params)
        profile = generator.profile
        assert profile.engine.name == "metagen" and profile.native_n and profile.returns_token_ids
        assert profile.max_model_len == model.max_context
        assert {caps.LOGPROBS, caps.TOP_LOGPROBS, caps.TOKEN_IDS, caps.TOKEN_PROMPTS,
                caps.STRUCTURED_OUTPUT} <= generator.capabilities
        local = generate(model, "The weather today is", params, chat=False)
        assert [c.token_ids for c in result.completions] == [c.token_ids for c in local.completions]
        assert [c.text for c in result.completions] == [c.text for c in local.completions]
        for remote, mine in zip(result.completions, local.completions):
            assert remote.logprobs == pytest.approx(mine.logprobs, abs=1e-5)
        constrained = generator.generate("Pick one:", SamplingParams(temperature=0, max_tokens=5,
                                                                     structured_outputs={"choice": ["yes", "no"]}))
        assert constrained.completions[0].text in ("yes", "no")
        mirostat = SamplingParams(mirostat_tau=3.0, mirostat_eta=0.2, seed=5, max_tokens=10)
        assert generator.generate("Once upon a time", mirostat).completions[0].token_ids == \
            generate(model, "Once upon a time", mirostat, chat=False).completions[0].token_ids
    finally:
        generator.close()
