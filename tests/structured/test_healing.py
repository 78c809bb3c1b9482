"""Token healing: the prompt's ragged tail is backed up and the first tokens must reproduce it."""

import re

import numpy as np
import pytest
import torch

from metagen.structured.engine import token_bytes
from metagen.sampling.constraint import StructuredProcessor
from metagen.sampling.token_healing import TokenHealingProcessor
from metagen.structured.healing import heal_prompt, strip_healed_prefix
from metagen.structured.spec import StructuredOutputs

from .walk import allowed_tokens, closing_tokens, random_walk

SEED_PROMPT = "The url is http:"


def brute_force_allowed(tokenizer, remaining: bytes) -> set[int]:
    """Tokens that start with `remaining` or are a non-empty proper prefix of it, by a scan of the vocabulary."""
    return {token_id for token_id, data in enumerate(token_bytes(tokenizer))
            if data and (data.startswith(remaining) or (len(data) < len(remaining) and remaining.startswith(data)))}


def test_seed_example_backs_up_the_colon(smollm2_tokenizer):
    ids = smollm2_tokenizer.encode(SEED_PROMPT)
    assert smollm2_tokenizer.convert_ids_to_tokens(ids[-2:]) == ["Ġhttp", ":"]  # ":" alone, though "://" is a token
    shorter, removed = heal_prompt(smollm2_tokenizer, ids)
    assert shorter == ids[:-1] and removed == ":"
    processor = TokenHealingProcessor(smollm2_tokenizer, removed)
    allowed = set(np.flatnonzero(allowed_tokens(processor, smollm2_tokenizer.vocab_size)[0]).tolist())
    assert allowed == brute_force_allowed(smollm2_tokenizer, b":")
    assert smollm2_tokenizer.token_to_id("://") in allowed and smollm2_tokenizer.token_to_id("Ġhttp") not in allowed
    assert not allowed & smollm2_tokenizer.special_token_ids and not processor.allows_stop(0)


def test_nothing_heals_at_a_token_no_other_token_extends(smollm2_tokenizer):
    ids = smollm2_tokenizer.encode("The url is http://")  # "://" is not the start of a longer token
    assert heal_prompt(smollm2_tokenizer, ids) == (ids, "")
    chat = smollm2_tokenizer.encode("<|im_start|>")  # a special token is never backed up
    assert heal_prompt(smollm2_tokenizer, [*ids, *chat]) == ([*ids, *chat], "")
    one = smollm2_tokenizer.encode(":")  # nor the whole prompt
    assert heal_prompt(smollm2_tokenizer, one) == (one, "")


def test_a_removed_text_spanning_tokens_is_reproduced_by_prefixes(smollm2_tokenizer):
    processor = TokenHealingProcessor(smollm2_tokenizer, " http:", batch_size=2)
    vocab = smollm2_tokenizer.vocab_size
    first = set(np.flatnonzero(allowed_tokens(processor, vocab)[0]).tolist())
    assert first == brute_force_allowed(smollm2_tokenizer, b" http:")
    http, slash = smollm2_tokenizer.token_to_id("Ġhttp"), smollm2_tokenizer.token_to_id("://")
    assert http in first and smollm2_tokenizer.token_to_id("Ġ") in first
    processor.accept(torch.tensor([http, -1]))
    masks = allowed_tokens(processor, vocab)
    assert set(np.flatnonzero(masks[0]).tolist()) == brute_force_allowed(smollm2_tokenizer, b":")
    assert set(np.flatnonzero(masks[1]).tolist()) == first  # the skipped row did not move
    with pytest.raises(ValueError, match="does not continue the healed prompt text"):
        processor.accept(torch.tensor([http, -1]))
    processor.accept(torch.tensor([slash, -1]))
    assert processor.allows_stop(0) and not processor.allows_stop(1)
    logits = torch.randn(2, vocab)
    out = processor.apply(logits)
    assert torch.equal(out[0], logits[0])  # row 0 is free again
    assert set(torch.isfinite(out[1]).nonzero().flatten().tolist()) == first


def test_rollback_fork_select_reset(smollm2_tokenizer):
    vocab = smollm2_tokenizer.vocab_size
    processor = TokenHealingProcessor(smollm2_tokenizer, " http:")
    fresh = allowed_tokens(processor, vocab)
    processor.accept(torch.tensor([smollm2_tokenizer.token_to_id("Ġhttp")]))
    after = allowed_tokens(processor, vocab)
    fork = processor.fork(torch.tensor([0, 0]))
    processor.rollback(torch.tensor([1]))
    assert np.array_equal(allowed_tokens(processor, vocab), fresh)
    assert np.array_equal(allowed_tokens(fork, vocab), np.concatenate([after, after]))
    fork.select(torch.tensor([1]))
    fork.reset()
    assert np.array_equal(allowed_tokens(fork, vocab), fresh)


def test_composes_with_a_structured_constraint(smollm2_tokenizer):
    # The structured processor takes the removed text as a prefix of its grammar; chained with the
    # healing processor, every walk reproduces ":" and then matches the regex.
    vocab = smollm2_tokenizer.vocab_size
    pattern = r"//[a-z]{1,8}\.(com|org)"
    structured = StructuredProcessor(StructuredOutputs(regex=pattern), smollm2_tokenizer, 4, prefix=":")
    healing = TokenHealingProcessor(smollm2_tokenizer, ":", 4)
    assert not (allowed_tokens(structured, vocab) & ~allowed_tokens(healing, vocab)).any()  # a subset

    class Chain:  # the two masks intersect; both follow every accepted token
        batch_size = 4

        def fill_bitmask(self):
            return structured.fill_bitmask() & healing.fill_bitmask()

        def allows_stop(self, row):
            return structured.allows_stop(row) and healing.allows_stop(row)

        def accept(self, tokens):
            structured.accept(tokens)
            healing.accept(tokens)

    for tokens in random_walk(Chain(), smollm2_tokenizer, seed=5, closing=closing_tokens(smollm2_tokenizer)):
        text = smollm2_tokenizer.decode(tokens)
        assert re.fullmatch(pattern, strip_healed_prefix(text, ":")), text


def test_strip_healed_prefix():
    assert strip_healed_prefix("://example.com", ":") == "//example.com"
    with pytest.raises(ValueError, match="does not start with the healed prefix"):
        strip_healed_prefix("//example.com", ":")


@pytest.mark.slow
def test_seed_example_on_the_model(model):
    # Greedy on the embedded model: the raw prompt continues "8080/..."; healed, the model picks "://".
    def greedy(ids, processor=None, steps=4):
        cache, out = model.prefill(ids)
        tokens = []
        for _ in range(steps):
            logits = out.logits if processor is None else processor.apply(out.logits)
            token = int(logits.argmax(-1))
            tokens.append(token)
            if processor is not None:
                processor.accept(torch.tensor([token]))
            out = model.forward(cache, [[token]])
        return tokens

    tokenizer = model.tokenizer
    ids = tokenizer.encode(SEED_PROMPT)
    shorter, removed = heal_prompt(tokenizer, ids)
    healed = greedy(shorter, TokenHealingProcessor(tokenizer, removed))
    assert tokenizer.decode(healed[:1]) == "://"
    assert strip_healed_prefix(tokenizer.decode(healed), removed).startswith("//")
    assert not tokenizer.decode(greedy(ids)).startswith("//")  # what healing fixes
