"""The span constraint: exact allowed sets on a hand-made vocabulary, the index against the rule's
definition on every substring, UTF-8 boundaries, the processor's row protocol, the real SmolLM2
vocabulary against brute force, and greedy decoding on the real model whose every step is
checked against the rule."""

import random

import numpy as np
import pytest
import torch

from metagen.sampling.span import SpanProcessor, span_index
from metagen.structured import span_of
from metagen.structured.bitmask import bitmask_to_bool
from metagen.structured.span import SpanIndex, SuffixAutomaton

# id: 0 a, 1 b, 2 c, 3 ab, 4 bc, 5 ca, 6 abc, 7 x, 8 <eos> (a control token)
VOCABULARY = [b"a", b"b", b"c", b"ab", b"bc", b"ca", b"abc", b"x", None]
EOS = 8


def allowed_ids(index, state):
    return set(index.allowed(state).tolist())


def row_ids(index, state):
    mask = torch.from_numpy(index.row(state)[None].view(np.int32))
    return set(torch.nonzero(bitmask_to_bool(mask, index.vocab_size)[0]).flatten().tolist())


def walk(index, tokens):
    state = 0
    for token in tokens:
        state = index.step(state, token)
    return state


def test_exact_allowed_sets_on_a_hand_made_vocabulary():
    index = SpanIndex("abcab", VOCABULARY, [EOS])
    assert row_ids(index, 0) == {0, 1, 2, 3, 4, 5, 6}  # every token inside the passage; no EOS on empty text
    assert row_ids(index, walk(index, [0])) == {1, 4, EOS}  # "a" -> "ab", "abc"; may end
    assert row_ids(index, walk(index, [3])) == {2, 5, EOS}  # "ab" -> "abc", "abca"
    assert row_ids(index, walk(index, [6])) == {0, 3, EOS}  # "abc" -> "abca", "abcab"
    assert row_ids(index, walk(index, [2])) == {0, 3, EOS}  # "c" -> "ca", "cab"
    end = walk(index, [6, 3])  # "abcab": the whole passage, nothing can follow
    assert allowed_ids(index, end) == set() and row_ids(index, end) == {EOS}
    assert index.step(walk(index, [0]), 0) is None and index.step(0, 7) is None and index.step(0, EOS) is None


def test_the_index_matches_the_rule_on_every_substring_of_random_passages():
    rng = random.Random(0)
    for _ in range(20):
        passage = "".join(rng.choice("abc ") for _ in range(rng.randint(1, 30)))
        vocabulary = list({"".join(rng.choice("abc ") for _ in range(rng.randint(1, 4))).encode() for _ in range(40)})
        vocabulary.append(None)
        index = SpanIndex(passage, vocabulary, [len(vocabulary) - 1])
        data = passage.encode()
        texts = {data[i:j] for i in range(len(data)) for j in range(i, len(data) + 1)}
        for text in texts:
            state = index.automaton.walk(0, text)
            assert state is not None
            expected = {v for v, piece in enumerate(vocabulary) if piece and text + piece in data}
            assert allowed_ids(index, state) == expected, (passage, text)
            assert index.may_end(state) == bool(text)
        assert index.automaton.walk(0, b"d") is None
        assert len(index.automaton.edges) <= max(2 * len(data) - 1, 2)


def test_suffix_automaton_size_and_first_ends():
    automaton = SuffixAutomaton(b"abcbc")
    assert len(automaton.edges) <= 2 * 5 - 1
    state = automaton.walk(0, b"bc")
    assert automaton.first_end[state] == 2  # "bc" first ends at index 2


def test_utf8_spans_start_and_end_on_character_boundaries():
    # 0: c3, 1: a9 (a continuation byte), 2: "é" whole, 3: "x", 4: EOS
    index = SpanIndex("é x", [b"\xc3", b"\xa9", "é".encode(), b" x", None], [4])
    assert row_ids(index, 0) == {0, 2, 3}  # never a continuation byte first
    half = walk(index, [0])
    assert row_ids(index, half) == {1} and not index.may_end(half)  # "\xc3" cannot end
    assert row_ids(index, walk(index, [0, 1])) == {3, 4} == row_ids(index, walk(index, [2]))


def test_bad_passages_and_end_ids_are_refused():
    with pytest.raises(ValueError, match="passage='' is out of range"):
        span_of("")
    with pytest.raises(ValueError, match="end token 9 is out of range"):
        SpanIndex("ab", VOCABULARY, [9])


def test_the_processor_masks_accepts_rolls_back_and_forks_rows():
    index = SpanIndex("abcab", VOCABULARY, [EOS])
    processor = SpanProcessor(index, batch_size=2)
    logits = torch.zeros(2, len(VOCABULARY))
    logits[:, EOS] = 100.0  # the model would end at once
    out = processor.apply(logits)
    assert torch.isinf(out[:, EOS]).all() and torch.isinf(out[:, 7]).all()  # EOS blocked on empty output
    assert logits[0, EOS] == 100.0  # input untouched
    assert not processor.allows_stop(0) and not processor.finished(0)
    processor.accept(torch.tensor([6, 0]))  # row 0 "abc", row 1 "a"
    with pytest.raises(ValueError, match="row 1: token 2 would leave the passage"):
        processor.accept(torch.tensor([-1, 2]))
    assert processor.state(1) == walk(index, [0])  # the refused token changed nothing
    assert processor.allows_stop(0) and processor.allows_stop(1)
    processor.accept(torch.tensor([3, EOS]))  # row 0 "abcab", row 1 ends
    assert processor.finished(0) and processor.finished(1)
    bits = bitmask_to_bool(processor.fill_bitmask(), len(VOCABULARY))
    assert set(torch.nonzero(bits[1]).flatten().tolist()) == {EOS}  # only end tokens after the end
    fork = processor.fork(torch.tensor([0, 0]))
    processor.rollback(torch.tensor([1, 1]))  # row 0 back to "abc", row 1 un-ended
    assert processor.state(0) == walk(index, [6]) and not processor.finished(1)
    assert fork.state(0) == fork.state(1) == walk(index, [6, 3])  # the fork kept its own rows
    joined = SpanProcessor.concat([processor, fork])
    assert joined.batch_size == 4 and joined.state(2) == walk(index, [6, 3])
    with pytest.raises(ValueError, match="rollback of 3 tokens in row 1"):
        processor.rollback(torch.tensor([0, 3]))
    processor.reset()
    assert processor.state(0) == processor.state(1) == 0


def test_real_vocabulary_allowed_sets_equal_brute_force(smollm2_tokenizer):
    from metagen.structured.engine import token_bytes

    passage = "The Nile flows north through Egypt into the Mediterranean Sea. Its length is 6,650 km."
    index = span_index(span_of(passage), smollm2_tokenizer)
    vocabulary, data = token_bytes(smollm2_tokenizer), passage.encode()
    for text in (b"", b"The", b"Nile flows", b" Egypt", b"6,6", b"Sea."):
        state = index.automaton.walk(0, text)
        expected = {v for v, piece in enumerate(vocabulary) if piece and text + piece in data
                    and not (text == b"" and piece[0] & 0xC0 == 0x80) and v not in index.end_ids}
        assert allowed_ids(index, state) == expected, text
        assert (set(index.end_ids) <= row_ids(index, state)) == bool(text)


def check_steps(index, token_ids, data):
    """Every step of a decoded row obeyed the rule: each token was allowed after the text before
    it, the text stayed inside the passage, and the allowed set was exactly the rule's."""
    state, text = 0, b""
    for token in token_ids:
        if token in index.end_ids:
            assert index.may_end(state)
            return
        expected = {v for v, piece in enumerate(index.vocabulary) if piece and text + piece in data
                    and not (text == b"" and piece[0] & 0xC0 == 0x80) and v not in index.end_ids}
        assert allowed_ids(index, state) == expected and token in expected
        state, text = index.step(state, token), text + index.vocabulary[token]
        assert text in data


@pytest.mark.slow
def test_greedy_decoding_on_the_real_model_outputs_spans_of_the_passage(model):
    from metagen.decoding import generate
    from metagen.sampling import SamplingParams

    passage = ("Ada Lovelace wrote the first published algorithm for Charles Babbage's Analytical Engine in 1843. "
               "She was born in London, the daughter of the poet Lord Byron.")
    processor = SpanProcessor(span_of(passage), model.tokenizer)
    for question in ("Who designed the Analytical Engine?", "In which year was the algorithm published?",
                     "Where was Ada Lovelace born?", "Who was her father?"):
        result = generate(model, f"{passage}\n\nQuestion: {question}\nAnswer:", SamplingParams(temperature=0,
                          max_tokens=24), processors=[processor])
        completion = result.completions[0]
        assert completion.text and completion.text in passage, (question, completion.text)
        check_steps(processor.index, completion.token_ids, passage.encode())
    assert processor.state(0) == 0  # the given processor is untouched: the loop forks it


@pytest.mark.slow
def test_sampled_rows_fork_the_processor_and_each_stays_inside_the_passage(model):
    from metagen.decoding import generate
    from metagen.sampling import SamplingParams

    passage = "Mount Everest, at 8,849 metres, is the highest mountain above sea level; it lies in the Himalayas."
    processor = SpanProcessor(passage, model.tokenizer)  # the passage's text is taken too
    result = generate(model, f"{passage}\n\nHow high is Mount Everest?", SamplingParams(temperature=1.0, n=4,
                      max_tokens=12, seed=0), processors=[processor])
    for completion in result.completions:
        assert completion.text in passage  # cut rows (max_tokens) too: a prefix of a span is a span
        check_steps(processor.index, completion.token_ids, passage.encode())
        index = processor.index
        spanned = [token for token in completion.token_ids if token not in index.end_ids]
        assert completion.complete == index.may_end(walk(index, spanned))  # accepted where a span may end
