"""StructuredProcessor on the real tokenizer: every walk through its masks is valid output, special
tokens never appear inside text, and rollback / fork / select / reset restore exact states."""

import json
import re

import jsonschema
import numpy as np
import pytest
import torch

from metagen.sampling.constraint import StructuredProcessor
from metagen.structured.spec import StructuredOutputs

from .walk import allowed_tokens, closing_tokens, random_walk

SCHEMAS = {
    "nested": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 12},
            "address": {"type": "object", "properties": {"city": {"type": "string"},
                                                         "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                        "required": ["city", "zip"]},
        },
        "required": ["name", "address"],
    },
    "array": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "minItems": 1, "maxItems": 4},
    "enums": {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]},
                                               "size": {"type": "string", "enum": ["S", "M", "L"]}},
              "required": ["color", "size"]},
    "pattern": {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"}},
                "required": ["code"]},
    "optional": {"type": "object", "properties": {"a": {"type": "boolean"}, "b": {"type": "null"},
                                                  "c": {"type": "string", "maxLength": 5}},
                 "required": ["a"], "additionalProperties": False},
    "bounded_numbers": {"type": "object", "properties": {
        "x": {"type": "number", "minimum": -1.5, "maximum": 2.25},
        "n": {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 100}}, "required": ["x", "n"]},
    "any_of": {"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 3}]},
    "taylor_swift": {"type": "object", "properties": {
        "name": {"type": "string"},
        "birthday": {"type": "object", "properties": {
            "month": {"type": "string", "enum": ["January", "February", "March", "April", "May", "June", "July",
                                                 "August", "September", "October", "November", "December"]},
            "day": {"type": "integer", "minimum": 1, "maximum": 31},
            "year": {"type": "integer", "minimum": 1900, "maximum": 2100}},
            "required": ["month", "day", "year"], "additionalProperties": False}},
        "required": ["name", "birthday"], "additionalProperties": False},
}
ROWS = 8


@pytest.fixture(scope="module")
def closing(smollm2_tokenizer):
    return closing_tokens(smollm2_tokenizer)


def no_special_token_inside(tokenizer):
    """on_step check: a special token is allowed only where the row may stop, and then only EOS."""
    special = sorted(tokenizer.special_token_ids)
    eos = tokenizer.eos_token_ids

    def check(allowed, processor):
        for row in range(processor.batch_size):
            allowed_special = {token for token in special if allowed[row, token]}
            assert allowed_special <= eos, allowed_special
            assert not allowed_special or processor.allows_stop(row)
    return check


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_every_walk_through_a_schema_validates(smollm2_tokenizer, closing, name):
    schema = SCHEMAS[name]
    processor = StructuredProcessor(StructuredOutputs(json=schema), smollm2_tokenizer, ROWS)
    rows = random_walk(processor, smollm2_tokenizer, seed=0, closing=closing,
                       on_step=no_special_token_inside(smollm2_tokenizer))
    for tokens in rows:
        jsonschema.validate(json.loads(smollm2_tokenizer.decode(tokens)), schema)


def test_any_json_object(smollm2_tokenizer, closing):
    processor = StructuredProcessor(StructuredOutputs(json_object=True), smollm2_tokenizer, ROWS)
    for tokens in random_walk(processor, smollm2_tokenizer, seed=1, closing=closing):
        assert isinstance(json.loads(smollm2_tokenizer.decode(tokens)), dict)


@pytest.mark.parametrize("pattern", [r"[a-z]+@[a-z]+\.(com|org)", r"\d{3}-\d{4}", r"(yes|no)( maybe)?",
                                     r"[\s\S]{1,12}", r"(.|\n){0,15}x"])
def test_every_walk_through_a_regex_matches(smollm2_tokenizer, closing, pattern):
    processor = StructuredProcessor(StructuredOutputs(regex=pattern), smollm2_tokenizer, ROWS)
    for tokens in random_walk(processor, smollm2_tokenizer, seed=2, closing=closing,
                              on_step=no_special_token_inside(smollm2_tokenizer)):
        text = smollm2_tokenizer.decode(tokens)
        assert re.fullmatch(pattern, text), text
        assert not any(marker in text for marker in ("<|im_start|>", "<|im_end|>", "<|endoftext|>"))


def test_every_walk_through_a_choice_is_a_choice(smollm2_tokenizer, closing):
    choices = ["positive", "negative", "neutral", 'say "hi"\n', "héllo 😀"]
    processor = StructuredProcessor(StructuredOutputs(choice=choices), smollm2_tokenizer, ROWS)
    texts = [smollm2_tokenizer.decode(tokens)
             for tokens in random_walk(processor, smollm2_tokenizer, seed=3, closing=closing, stop_probability=1.0)]
    assert set(texts) <= set(choices) and len(set(texts)) > 1


@pytest.mark.parametrize("grammar", [
    'start: item ("," item)*\nitem: /[0-9]+/ | "x"',  # Lark
    'root ::= item ("," item)*\nitem ::= [0-9]+ | "x"',  # GBNF, converted by llguidance
])
def test_every_walk_through_a_grammar_parses(smollm2_tokenizer, closing, grammar):
    processor = StructuredProcessor(StructuredOutputs(grammar=grammar), smollm2_tokenizer, ROWS)
    for tokens in random_walk(processor, smollm2_tokenizer, seed=4, closing=closing):
        assert re.fullmatch(r"([0-9]+|x)(,([0-9]+|x))*", smollm2_tokenizer.decode(tokens))


def test_no_special_token_inside_a_string(smollm2_tokenizer):
    # Inside a JSON string, and inside a regex that matches any character: no control token, no EOS.
    for spec, text in [(StructuredOutputs(json={"type": "string"}), '"abc'),
                       (StructuredOutputs(regex=r"[\s\S]*<"), "abc"),
                       (StructuredOutputs(regex=r".*"), "<|im_")]:
        processor = StructuredProcessor(spec, smollm2_tokenizer)
        processor.accept(torch.tensor(smollm2_tokenizer.encode(text, add_special_tokens=False)[:1]))
        allowed = _masks(processor, smollm2_tokenizer.vocab_size)[0]
        assert allowed.sum() > 40000  # nearly every text token fits
        assert not allowed[sorted(smollm2_tokenizer.special_token_ids)].any() or spec.regex == ".*"
    # A regex that accepts the empty tail allows EOS there, and still no other special token.
    processor = StructuredProcessor(StructuredOutputs(regex=r".*"), smollm2_tokenizer)
    allowed = _masks(processor, smollm2_tokenizer.vocab_size)[0]
    assert np.flatnonzero(allowed[sorted(smollm2_tokenizer.special_token_ids)]).tolist() == [2]


def _masks(processor, vocab):
    return allowed_tokens(processor, vocab)  # (B, V) bool


def _walk_tokens(tokenizer, text):
    return tokenizer.encode(text, add_special_tokens=False)


def _accept_text(processor, tokenizer, text):
    """Accept the tokens of `text` in row 0 of a one-row processor, one step each."""
    for token in _walk_tokens(tokenizer, text):
        processor.accept(torch.tensor([token]))


def test_rollback_restores_the_exact_state(smollm2_tokenizer):
    vocab = smollm2_tokenizer.vocab_size
    processor = StructuredProcessor(StructuredOutputs(json=SCHEMAS["taylor_swift"]), smollm2_tokenizer)
    tokens = _walk_tokens(smollm2_tokenizer, '{"name": "Taylor Swift", "birthday": {"month": "December", '
                                             '"day": 13, "year": 1989}}')
    masks = [_masks(processor, vocab)]
    for token in tokens:
        processor.accept(torch.tensor([token]))
        masks.append(_masks(processor, vocab))
    assert processor.allows_stop(0)  # properties in the schema's order: the object is complete
    processor.accept(torch.tensor([2]))  # EOS, then only end tokens are allowed
    assert processor.finished(0) and np.flatnonzero(_masks(processor, vocab)[0]).tolist() == [2]
    processor.rollback(torch.tensor([1]))
    assert np.array_equal(_masks(processor, vocab), masks[-1])
    for back in (3, 5, 1):
        processor.rollback(torch.tensor([back]))
        tokens_left = len(masks) - 1 - back
        masks = masks[: tokens_left + 1]
        assert np.array_equal(_masks(processor, vocab), masks[-1])
    processor.rollback(torch.tensor([len(masks) - 1]))  # back to the start: the fresh state
    assert np.array_equal(_masks(processor, vocab), masks[0])
    with pytest.raises(ValueError, match="rollback of 1 tokens in row 0, which accepted 0"):
        processor.rollback(torch.tensor([1]))


def test_fork_select_and_reset(smollm2_tokenizer):
    vocab = smollm2_tokenizer.vocab_size
    spec = StructuredOutputs(json=SCHEMAS["enums"])
    processor = StructuredProcessor(spec, smollm2_tokenizer, 2)
    fresh = _masks(processor, vocab)[0]
    first, second = _walk_tokens(smollm2_tokenizer, '{"color": "red", "size": "M"}')[:2]
    processor.accept(torch.tensor([first, -1]))  # row 1 skipped
    after_first = _masks(processor, vocab)
    assert np.array_equal(after_first[1], fresh) and not np.array_equal(after_first[0], fresh)

    fork = processor.fork(torch.tensor([0]))
    processor.accept(torch.tensor([second, first]))
    assert np.array_equal(_masks(fork, vocab)[0], after_first[0])  # the fork did not move
    fork.accept(torch.tensor([second]))
    assert np.array_equal(_masks(fork, vocab)[0], _masks(processor, vocab)[0])

    processor.select(torch.tensor([1, 1, 0]))  # row 1 twice: the second is a copy, not an alias
    masks = _masks(processor, vocab)
    assert processor.batch_size == 3 and np.array_equal(masks[0], masks[1]) and np.array_equal(masks[0], after_first[0])
    processor.accept(torch.tensor([second, -1, -1]))
    masks = _masks(processor, vocab)
    assert not np.array_equal(masks[0], masks[1]) and np.array_equal(masks[1], after_first[0])

    processor.reset()
    assert all(np.array_equal(row, fresh) for row in _masks(processor, vocab))


def test_mask_after_the_matcher_stopped_allows_only_eos(smollm2_tokenizer):
    processor = StructuredProcessor(StructuredOutputs(choice=["yes", "no"]), smollm2_tokenizer)
    _accept_text(processor, smollm2_tokenizer, "yes")
    assert processor.finished(0) and processor.allows_stop(0) and processor.forced(0) == []
    for _ in range(3):  # asked again and again: EOS, never an exception
        logits = processor.apply(torch.zeros(1, smollm2_tokenizer.vocab_size))
        assert (logits[0] == 0).nonzero().flatten().tolist() == [2]
        processor.accept(torch.tensor([2]))
    with pytest.raises(ValueError, match="after the constraint ended"):
        processor.accept(torch.tensor([100]))
    processor.rollback(torch.tensor([3]))  # the three EOS
    assert processor.allows_stop(0)


def test_forbidden_token_is_refused_and_leaves_the_row_unchanged(smollm2_tokenizer):
    vocab = smollm2_tokenizer.vocab_size
    processor = StructuredProcessor(StructuredOutputs(regex="ab+"), smollm2_tokenizer)
    before = _masks(processor, vocab)
    with pytest.raises(ValueError, match=r"row 0: token \d+ \('z'\) is not allowed"):
        processor.accept(torch.tensor(_walk_tokens(smollm2_tokenizer, "z")))
    with pytest.raises(ValueError, match="end token 2 where the constraint is not complete"):
        processor.accept(torch.tensor([2]))
    assert np.array_equal(_masks(processor, vocab), before) and processor.error(0) == ""


def test_stop_token_ids_only_where_the_constraint_accepts(smollm2_tokenizer):
    newline = _walk_tokens(smollm2_tokenizer, "\n")[0]
    processor = StructuredProcessor(StructuredOutputs(json={"type": "array", "items": {"type": "integer"}}),
                                    smollm2_tokenizer, stop_token_ids=[newline])
    _accept_text(processor, smollm2_tokenizer, "[1,")
    assert not _masks(processor, smollm2_tokenizer.vocab_size)[0, newline]  # JSON whitespace, but a stop token
    _accept_text(processor, smollm2_tokenizer, "2]")
    assert _masks(processor, smollm2_tokenizer.vocab_size)[0, newline]
    processor.accept(torch.tensor([newline]))
    assert processor.finished(0) and processor.allows_stop(0)


def test_whitespace_is_bounded(smollm2_tokenizer):
    space = _walk_tokens(smollm2_tokenizer, " ")[0]
    for bound in (0, 3, 8):
        processor = StructuredProcessor(StructuredOutputs(json_object=True, max_whitespace=bound), smollm2_tokenizer)
        _accept_text(processor, smollm2_tokenizer, "{")
        taken = 0
        while _masks(processor, smollm2_tokenizer.vocab_size)[0, space]:
            processor.accept(torch.tensor([space]))
            taken += 1
            assert taken <= 20
        assert taken == bound


def test_forced_tokens_jump_forward(smollm2_tokenizer):
    processor = StructuredProcessor(StructuredOutputs(regex=r"The answer is (yes|no)\."), smollm2_tokenizer)
    forced = processor.forced(0)
    assert smollm2_tokenizer.decode(forced) in ("The answer is", "The answer")  # the tail may merge with more
    for token in forced:
        processor.accept(torch.tensor([token]))
    assert not processor.finished(0)


def test_a_failed_matcher_ends_the_row_as_incomplete(smollm2_tokenizer):
    # llguidance can fail mid-decode (a resource limit); simulated by feeding the matcher a token its
    # mask forbids behind the processor's back. The row then gets EOS only, and never counts as valid.
    processor = StructuredProcessor(StructuredOutputs(regex="ab+"), smollm2_tokenizer, 2)
    processor._matchers[0].consume_token(_walk_tokens(smollm2_tokenizer, "z")[0])
    assert processor.error(0) and processor.finished(0) and not processor.allows_stop(0)
    masks = _masks(processor, smollm2_tokenizer.vocab_size)
    assert np.flatnonzero(masks[0]).tolist() == [2] and masks[1].sum() > 0
    processor.accept(torch.tensor([2, -1]))  # the loop ends it with EOS: no exception
    assert not processor.allows_stop(0) and processor.error(1) == ""
