"""The speculative decoding loop on the enumerable toy model: the emitted sequences follow the
target's distribution exactly (chi-square over whole sequences, many rows in one ragged batch),
greedy output equals plain greedy, and the loop's bookkeeping (stops, costs, errors) holds."""

from __future__ import annotations

import math

import pytest
import torch

from metagen.decoding import generate
from metagen.models.base import ForwardOutput
from metagen.sampling import SamplerChain, SamplingParams
from metagen.speculative import ModelDrafter, NgramDrafter, SpeculativeConfig, speculative_generate

from tests.decoding.helpers import assert_follows
from tests.decoding.toy_model import BOS, EOS, VOCAB, A, C, ToyModel, enumerate_sequences

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPT = [BOS, A, C, A]

# A different, context-dependent draft: flatter logits with a pull toward "c".
DRAFT_SHIFT = torch.tensor([0.3, -0.2, 0.1, 0.6, -0.5])


class DraftToyModel(ToyModel):
    """The toy chain with its logits halved and shifted: a draft that disagrees with the target."""

    name = "toy-draft"

    def forward(self, cache, tokens, *, logits="last", hidden=False) -> ForwardOutput:
        out = super().forward(cache, tokens, logits=logits, hidden=hidden)
        if out.logits is None:
            return out
        return ForwardOutput(out.logits * 0.5 + DRAFT_SHIFT, None, out.num_new)


def chain_distribution(params: SamplingParams, prompt: list[int], max_tokens: int) -> dict[tuple[int, ...], float]:
    """Exact probability of every completion when each token is drawn from the sampler chain's
    processed target logits (the chain's state following the sequence) — plain decoding's law."""
    from tests.decoding.toy_model import next_logits

    distribution = {}
    for sequence in enumerate_sequences(max_tokens):
        chain = SamplerChain.from_params(params, 1, VOCAB, prompt)
        context, logp = list(prompt), 0.0
        for token in sequence:
            processed = chain.process(next_logits(context)[None])
            logp += float(torch.log_softmax(processed.double(), dim=-1)[0, token])
            chain.accept(torch.tensor([token]))
            context.append(token)
        distribution[sequence] = math.exp(logp)
    return distribution


def drafters():
    return {
        "model": lambda: ModelDrafter(DraftToyModel()),
        "same-model": lambda: ModelDrafter(ToyModel()),
        "ngram": lambda: NgramDrafter(max_ngram=2),
    }


# ------------------------------------------------------------------ the output distribution


@pytest.mark.parametrize("verify", ["token", "block", "draw"])
@pytest.mark.parametrize("drafter", ["model", "ngram"])
@pytest.mark.parametrize("gamma", [1, 3])
def test_sequences_follow_the_target_distribution(verify, drafter, gamma):
    params = SamplingParams(n=3000, max_tokens=4, seed=11)
    result = speculative_generate(ToyModel(), drafters()[drafter](), PROMPT, params,
                                  SpeculativeConfig(num_draft_tokens=gamma, verify=verify))
    assert_follows((tuple(c.token_ids) for c in result.completions), chain_distribution(params, PROMPT, 4))
    assert result.cost.draft_tokens > 0


@pytest.mark.parametrize("verify", ["token", "block"])
@pytest.mark.parametrize(
    "fields",
    [
        {"temperature": 0.7, "top_k": 3},
        {"top_p": 0.8, "min_p": 0.05},
        {"repetition_penalty": 1.6, "presence_penalty": 0.5},
        {"no_repeat_ngram_size": 2, "logit_bias": {3: 1.5}},
    ],
    ids=["temperature-top_k", "top_p-min_p", "penalties", "ngram-ban-bias"],
)
def test_the_sampler_chain_is_applied_to_draft_and_target_alike(verify, fields):
    params = SamplingParams(n=3000, max_tokens=4, seed=3, **fields)
    result = speculative_generate(ToyModel(), ModelDrafter(DraftToyModel()), PROMPT, params,
                                  SpeculativeConfig(num_draft_tokens=3, verify=verify))
    assert_follows((tuple(c.token_ids) for c in result.completions), chain_distribution(params, PROMPT, 4))


def test_adaptive_length_and_confidence_stop_keep_the_distribution():
    params = SamplingParams(n=3000, max_tokens=4, seed=8)
    config = SpeculativeConfig(num_draft_tokens=2, adaptive=True, max_draft_tokens=5)
    result = speculative_generate(ToyModel(), ModelDrafter(DraftToyModel(), confidence=0.4), PROMPT, params, config)
    assert_follows((tuple(c.token_ids) for c in result.completions), chain_distribution(params, PROMPT, 4))


def test_identical_draft_is_always_accepted():
    params = SamplingParams(n=200, max_tokens=6, seed=1, ignore_eos=True)
    result = speculative_generate(ToyModel(), ModelDrafter(ToyModel()), PROMPT, params,
                                  SpeculativeConfig(num_draft_tokens=5))
    cost = result.cost
    assert cost.acceptance_rate == pytest.approx(1.0)
    # prefill gives token 1, one verification gives 2..6 (γ = 5 drafts minus the last: 4 + bonus)
    assert cost.target_steps == 2 * 200
    assert cost.block_efficiency == pytest.approx(3.0)
    assert all(len(c.token_ids) == 6 for c in result.completions)


# ------------------------------------------------------------------------- greedy and stops


@pytest.mark.parametrize("drafter", sorted(drafters()))
@pytest.mark.parametrize(
    "fields",
    [{}, {"repetition_penalty": 1.3}, {"stop": ["ca"]}, {"ignore_eos": True}, {"stop_token_ids": [A]}],
    ids=["plain", "penalty", "stop-string", "ignore-eos", "stop-token"],
)
@pytest.mark.parametrize("prompt", [[BOS], PROMPT, [BOS, C, A, C, A, C]])
def test_greedy_equals_plain_greedy(drafter, fields, prompt):
    params = SamplingParams(temperature=0, max_tokens=7, **fields)
    plain = generate(ToyModel(), prompt, params).completions[0]
    spec = speculative_generate(ToyModel(), drafters()[drafter](), prompt, params,
                                SpeculativeConfig(num_draft_tokens=3)).completions[0]
    assert spec.token_ids == plain.token_ids
    assert (spec.text, spec.finish_reason, spec.stop_reason) == (plain.text, plain.finish_reason, plain.stop_reason)
    assert spec.logprobs == pytest.approx(plain.logprobs, abs=1e-5)
    assert spec.certainties == pytest.approx(plain.certainties, abs=1e-5)


def test_records_match_plain_decoding_per_token():
    params = SamplingParams(temperature=0, max_tokens=6, logprobs=3, ignore_eos=True)
    plain = generate(ToyModel(), PROMPT, params).completions[0]
    spec = speculative_generate(ToyModel(), ModelDrafter(DraftToyModel()), PROMPT, params).completions[0]
    assert spec.token_ids == plain.token_ids
    assert spec.sampling_logprobs == plain.sampling_logprobs == [0.0] * 6
    for mine, theirs in zip(spec.top_logprobs, plain.top_logprobs):
        assert mine.keys() == theirs.keys()
        assert list(mine.values()) == pytest.approx(list(theirs.values()), abs=1e-5)


def test_max_tokens_is_never_exceeded_and_the_cache_stays_in_step():
    model = ToyModel()
    params = SamplingParams(n=50, max_tokens=5, seed=2, ignore_eos=True)
    result = speculative_generate(model, ModelDrafter(DraftToyModel()), PROMPT, params,
                                  SpeculativeConfig(num_draft_tokens=4))
    assert all(len(c.token_ids) == 5 and c.finish_reason == "length" for c in result.completions)
    # every verification forward fed the row's last token plus at most max_tokens − 1 − generated drafts
    assert all(count <= 4 for call in model.calls[1:] for count in call)


def test_costs_count_target_and_draft_work():
    params = SamplingParams(n=4, max_tokens=6, seed=0, ignore_eos=True)
    target = ToyModel()
    result = speculative_generate(target, ModelDrafter(DraftToyModel()), PROMPT, params, SpeculativeConfig(num_draft_tokens=2))
    cost = result.cost
    assert cost.generated_tokens == 24
    assert cost.target_steps == 4 + sum(len(call) for call in target.calls[1:])
    assert cost.generated_tokens == cost.accepted_tokens + cost.target_steps  # each step adds one token
    assert 0 <= cost.acceptance_rate <= 1
    assert cost.model_calls > len(target.calls)  # drafter forwards are counted too
    assert cost.prompt_tokens_computed == len(PROMPT) and cost.prompt_tokens_reused == 3 * len(PROMPT)
    assert cost.wall_seconds > 0


# ------------------------------------------------------------------------- draw verification


@pytest.mark.parametrize(
    "fields",
    [{}, {"repetition_penalty": 1.5, "top_k": 3}, {"mirostat_tau": 2.0}, {"stop": ["ca"], "logprobs": 2}],
    ids=["plain", "penalty-top_k", "mirostat", "stop-logprobs"],
)
def test_draw_verification_gives_plain_decodings_seeded_tokens(fields):
    """An n-gram draft draws no random numbers, so draw verification makes plain decoding's draws
    in plain decoding's order: for one row the same seed gives the same tokens and records. (With
    n > 1 rows whose drafts are kept to different lengths the rows share the generator in another
    order: the law is the same — the chi-square tests above — the seeded tokens are not.)"""
    accepted = 0
    for seed in range(12):
        params = SamplingParams(max_tokens=10, seed=seed, **fields)
        plain = generate(ToyModel(), PROMPT, params)
        spec = speculative_generate(ToyModel(), NgramDrafter(max_ngram=2), PROMPT, params,
                                    SpeculativeConfig(num_draft_tokens=3, verify="draw"))
        mine, theirs = spec.completions[0], plain.completions[0]
        assert mine.token_ids == theirs.token_ids, seed
        assert (mine.text, mine.finish_reason, mine.stop_reason) == (theirs.text, theirs.finish_reason,
                                                                     theirs.stop_reason)
        assert mine.logprobs == theirs.logprobs and mine.sampling_logprobs == theirs.sampling_logprobs
        assert mine.top_logprobs == theirs.top_logprobs
        cost = spec.cost
        assert cost.generated_tokens == cost.accepted_tokens + cost.target_steps  # one drawn token per step
        assert cost.model_calls == plain.cost.model_calls - cost.accepted_tokens
        accepted += cost.accepted_tokens
    assert accepted > 0  # drafts were kept, so forwards were saved


def test_mirostat_is_refused_by_the_rules_only():
    params = SamplingParams(mirostat_tau=3.0, max_tokens=4, seed=1)
    for verify in ("token", "block"):
        with pytest.raises(ValueError, match="mirostat_tau"):
            speculative_generate(ToyModel(), NgramDrafter(), PROMPT, params, SpeculativeConfig(verify=verify))
    speculative_generate(ToyModel(), NgramDrafter(), PROMPT, params, SpeculativeConfig(verify="draw"))


# ---------------------------------------------------------------------------------- errors


def test_mirostat_cannot_be_honoured():
    with pytest.raises(ValueError, match="mirostat_tau"):
        speculative_generate(ToyModel(), NgramDrafter(), PROMPT, SamplingParams(mirostat_tau=3.0))


def test_drafter_vocabulary_must_match():
    class WideDraft(DraftToyModel):
        @property
        def vocab_size(self) -> int:
            return VOCAB + 1

    with pytest.raises(ValueError, match="share a tokenizer"):
        speculative_generate(ToyModel(), ModelDrafter(WideDraft()), PROMPT, SamplingParams())


@pytest.mark.parametrize(
    "fields, message",
    [({"num_draft_tokens": 0}, "num_draft_tokens"), ({"verify": "tree"}, "verify"),
     ({"adaptive": True, "num_draft_tokens": 8, "max_draft_tokens": 4}, "max_draft_tokens")],
)
def test_config_validation(fields, message):
    with pytest.raises(ValueError, match=message):
        SpeculativeConfig(**fields)


def test_adaptive_schedule():
    config = SpeculativeConfig(num_draft_tokens=3, adaptive=True, max_draft_tokens=6)
    assert config.next_length(3, 3, 3) == 5
    assert config.next_length(5, 5, 5) == 6
    assert config.next_length(3, 3, 1) == 2
    assert config.next_length(1, 1, 0) == 1
    assert SpeculativeConfig(num_draft_tokens=3).next_length(3, 3, 3) == 3


def test_eos_inside_an_accepted_draft_ends_the_row():
    # After "b" the toy model says EOS with p = 0.78: the same-model draft proposes it and the
    # row must stop there even though later draft tokens were accepted too.
    params = SamplingParams(temperature=0, max_tokens=8)
    prompt = [BOS, 2]
    plain = generate(ToyModel(), prompt, params).completions[0]
    spec = speculative_generate(ToyModel(), ModelDrafter(ToyModel()), prompt, params,
                                SpeculativeConfig(num_draft_tokens=4)).completions[0]
    assert plain.token_ids[-1] == EOS
    assert spec.token_ids == plain.token_ids and spec.finish_reason == "stop"


# ------------------------------------------------------------------ stateful processors


@pytest.mark.parametrize("drafter", ["model", "ngram"])
def test_a_stateful_processor_is_rolled_back_with_rejected_drafts(drafter):
    """BanRepeats follows the draft while the target is verified and is rolled back where the
    cache is truncated: the emitted sequences follow plain decoding's law with the bans (a
    rejected draft token left in the state would ban a token the row never produced)."""
    from tests.decoding.ban_repeats import BanRepeats, distribution_without_repeats

    processor = BanRepeats()
    params = SamplingParams(n=3000, max_tokens=4, seed=5)
    result = speculative_generate(ToyModel(), drafters()[drafter](), PROMPT, params,
                                  SpeculativeConfig(num_draft_tokens=3), processors=[processor])
    assert_follows((tuple(c.token_ids) for c in result.completions), distribution_without_repeats(PROMPT, 4))
    assert "rollback" in processor.events and processor.histories == [[]]
    assert result.cost.accepted_tokens < result.cost.draft_tokens  # rejections happened


@pytest.mark.parametrize("drafter", sorted(drafters()))
@pytest.mark.parametrize("prompt", [[BOS], PROMPT, [BOS, C, A, C, A, C]])
def test_greedy_with_a_stateful_processor_equals_plain_greedy(drafter, prompt):
    from tests.decoding.ban_repeats import BanRepeats, EndAfter

    params = SamplingParams(temperature=0, max_tokens=7, ignore_eos=True)
    for processor in (BanRepeats(never_banned=[C]), EndAfter(stop_after=3, min_tokens=2)):
        plain = generate(ToyModel(), prompt, params, processors=[processor]).completions[0]
        spec = speculative_generate(ToyModel(), drafters()[drafter](), prompt, params,
                                    SpeculativeConfig(num_draft_tokens=3), processors=[processor]).completions[0]
        assert spec.token_ids == plain.token_ids
        assert (spec.finish_reason, spec.stop_reason, spec.complete) == \
               (plain.finish_reason, plain.stop_reason, plain.complete)
