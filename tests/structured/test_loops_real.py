"""Jump-forward, speculative decoding and token healing under constraints on the embedded model
(SmolLM2-135M). Kept short (tens of tokens per run): outputs are compared token for token.

    jump-forward on / off at T=0: the same tokens, fewer forwards (forced_tokens > 0)
    speculative (n-gram drafter) under a JSON schema at T=0: plain constrained greedy's tokens
    token healing: the example "The url is http:" (":" healed into "://", not repeated in
    the text), with a regex constraint, in a continued assistant message, refused under the chat
    template's assistant header, and the same under speculative decoding
"""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from metagen.decoding import generate, stream
from metagen.sampling import SamplingParams
from metagen.speculative import NgramDrafter, SpeculativeConfig, speculative_generate

pytestmark = pytest.mark.slow
PAID = {"type": "object", "properties": {"order_has_already_been_paid_in_full": {"type": "boolean"}},
        "required": ["order_has_already_been_paid_in_full"], "additionalProperties": False}
PROMPT = "Has the order been paid? Answer in JSON."
URL = "The url is http:"


@pytest.fixture(scope="module")
def plain_json(model):
    params = SamplingParams(temperature=0, max_tokens=40, structured_outputs={"json": PAID})
    return generate(model, PROMPT, params, jump_forward=False)


def test_jump_forward_gives_the_same_tokens_with_fewer_forwards(model, plain_json):
    params = SamplingParams(temperature=0, max_tokens=40, structured_outputs={"json": PAID})
    jumped = generate(model, PROMPT, params)
    assert jumped.completions[0].token_ids == plain_json.completions[0].token_ids
    assert jumped.completions[0].complete is True
    jsonschema.validate(json.loads(jumped.text), PAID)
    assert plain_json.forced_tokens == 0 and jumped.forced_tokens >= 5  # the long key, at least
    assert jumped.cost.model_calls == plain_json.cost.model_calls - jumped.forced_tokens
    assert jumped.completions[0].logprobs == pytest.approx(plain_json.completions[0].logprobs, abs=2e-2)


def test_speculative_under_a_schema_equals_plain_constrained_greedy(model, plain_json):
    params = SamplingParams(temperature=0, max_tokens=40, structured_outputs={"json": PAID})
    spec = speculative_generate(model, NgramDrafter(), PROMPT, params, SpeculativeConfig(num_draft_tokens=4))
    assert spec.completions[0].token_ids == plain_json.completions[0].token_ids
    assert spec.completions[0].complete is True
    assert spec.cost.draft_tokens > 0


def test_token_healing_on_the_seed_example(model):
    params = SamplingParams(temperature=0, max_tokens=6, token_healing=True)
    result = generate(model, URL, params, chat=False)
    completion = result.completions[0]
    tokenizer = model.tokenizer
    assert result.healed_text == ":"
    assert result.prompt_token_ids == tokenizer.encode(URL)[:-1]
    assert tokenizer.decode(completion.token_ids).startswith("://")  # the tokens cover the healed ":"
    assert completion.text.startswith("//")  # the text continues the prompt as given: ":" is not repeated
    assert completion.text == tokenizer.decode(completion.token_ids)[1:]
    events = "".join(event.text for event in stream(model, URL, params, chat=False))
    assert events == completion.text
    speculative = speculative_generate(model, NgramDrafter(), URL, params, chat=False)
    assert speculative.completions[0].token_ids == completion.token_ids
    assert speculative.completions[0].text == completion.text


def test_token_healing_with_a_constraint_and_in_a_continued_assistant_message(model):
    params = SamplingParams(temperature=0, max_tokens=8, token_healing=True,
                            structured_outputs={"regex": "//[a-z]+\\.com"})
    constrained = generate(model, URL, params, chat=False).completions[0]
    assert constrained.complete is True and re.fullmatch("//[a-z]+\\.com", constrained.text)
    messages = [{"role": "user", "content": "Where is the site?"}, {"role": "assistant", "content": URL}]
    continued = generate(model, messages, SamplingParams(temperature=0, max_tokens=4, token_healing=True))
    assert continued.healed_text == ":" and continued.completions[0].text.startswith("//")


def test_token_healing_after_the_assistant_header_is_refused(model):
    params = SamplingParams(max_tokens=4, token_healing=True)
    for prompt, chat in ((URL, True), ([{"role": "user", "content": URL}], None)):
        with pytest.raises(ValueError, match="token_healing=True needs a prompt that ends with its own text"):
            generate(model, prompt, params, chat=chat)


def test_constrained_greedy_is_the_argmax_over_allowed_tokens_step_by_step(model):
    """The loop (jump-forward on) against the rule written out with the real StructuredProcessor:
    at each step the argmax of the model's logits among the tokens the constraint allows."""
    import torch

    from metagen.sampling import StructuredProcessor
    from metagen.structured import StructuredOutputs

    spec = StructuredOutputs(regex="(yes|no), because [a-z]{2,12}")
    params = SamplingParams(temperature=0, max_tokens=10, structured_outputs=spec)
    prompt = "Is the sky blue? Answer yes or no with a reason."
    looped = generate(model, prompt, params).completions[0].token_ids
    processor = StructuredProcessor(spec, model.tokenizer, 1)
    ids = model.tokenizer.encode_chat([{"role": "user", "content": prompt}], add_generation_prompt=True)
    cache, out = model.prefill(ids)
    path = []
    for _ in range(10):
        allowed = processor.apply(out.logits)  # (1, V)
        assert torch.isfinite(allowed).sum() >= 1
        token = int(allowed.argmax(dim=-1))
        path.append(token)
        if token in model.eos_token_ids:
            break
        processor.accept(torch.tensor([token]))
        if processor.finished(0):  # nothing can follow: the loop ends the row here, without EOS
            break
        out = model.forward(cache, [[token]])
    assert looped == path
