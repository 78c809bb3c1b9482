"""Incremental detokenization and stop strings: deltas add up to the full decode; stops cut exactly."""

from __future__ import annotations

import random

import pytest
import tokenizers
from tokenizers import decoders, models, pre_tokenizers

from metagen.models.detokenize import IncrementalDetokenizer, StopStringMatcher
from metagen.models.tokenizer import Tokenizer

TEXTS = [
    "Hello world, this is a streaming test.",
    "emoji 😀🎉👍🏽 and a family 👨\u200d👩\u200d👧 done",
    "中文测试，日本語のテキスト、한국어 텍스트",
    "café naïve résumé façade Ångström",
    "def square(x):\n    return x ** 2  # comment\n\n\tprint(square(12))\n",
    "  leading and trailing  ",
    "<|im_start|>assistant\nSure!<|im_end|>",
]


def _stream(detokenizer, ids):
    deltas = [detokenizer.push(token_id) for token_id in ids]
    deltas.append(detokenizer.flush())
    return deltas


@pytest.fixture(scope="module")
def smollm2():
    import gguf

    from metagen.models.embedded import embedded_model_path

    return Tokenizer.from_gguf(gguf.GGUFReader(embedded_model_path()))


@pytest.mark.slow
@pytest.mark.parametrize("text", TEXTS)
def test_deltas_add_up_to_the_text(smollm2, text):
    ids = smollm2.encode(text)
    detokenizer = IncrementalDetokenizer(smollm2)
    deltas = _stream(detokenizer, ids)
    assert "".join(deltas) == text == detokenizer.text
    assert not any("\ufffd" in delta for delta in deltas)  # never a broken character


@pytest.mark.slow
def test_multibyte_characters_are_held_until_complete(smollm2):
    ids = smollm2.encode("😀")
    assert len(ids) > 1  # the emoji's four bytes span several tokens
    detokenizer = IncrementalDetokenizer(smollm2)
    assert [detokenizer.push(token_id) for token_id in ids] == [""] * (len(ids) - 1) + ["😀"]


@pytest.mark.slow
def test_random_token_sequences_match_decode(smollm2):
    rng = random.Random(1234)
    # Half the draws from tokens that are a lone non-ASCII byte, to stress incomplete characters.
    lone_bytes = [i for i in range(300) if smollm2.decode([i]) == "\ufffd"]
    assert lone_bytes
    for _ in range(200):
        ids = [
            rng.choice(lone_bytes) if rng.random() < 0.5 else rng.randrange(smollm2.vocab_size)
            for _ in range(rng.randrange(1, 30))
        ]
        for skip in (False, True):
            detokenizer = IncrementalDetokenizer(smollm2, skip_special_tokens=skip)
            assert "".join(_stream(detokenizer, ids)) == smollm2.decode(ids, skip_special_tokens=skip), ids


@pytest.mark.slow
def test_prompt_context_does_not_change_byte_level_text(smollm2):
    prompt_ids = smollm2.encode_chat([{"role": "user", "content": "Say hi"}])
    generated = smollm2.encode(" Hi there! 👋 Ça va?")
    detokenizer = IncrementalDetokenizer(smollm2, prompt_ids)
    assert "".join(_stream(detokenizer, generated)) == smollm2.decode(generated)


# -- toy tokenizers, no model file ------------------------------------------------------------------


def _byte_tokenizer():
    """One token per byte (GPT-2's byte alphabet, no merges): every multi-byte character is split."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    backend = tokenizers.Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    return Tokenizer(backend)


def _sentencepiece_tokenizer():
    """"▁" marks a space; the decoder drops the space of the text's first token."""
    vocab = {"<unk>": 0, "▁Hello": 1, "▁world": 2, "!": 3, "<0xE2>": 4, "<0x82>": 5, "<0xAC>": 6}
    backend = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True))
    backend.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    return Tokenizer(backend)


def test_euro_sign_split_in_three_bytes():
    tokenizer = _byte_tokenizer()
    ids = tokenizer.encode("a€b")
    assert len(ids) == 5  # a, E2, 82, AC, b
    detokenizer = IncrementalDetokenizer(tokenizer)
    assert _stream(detokenizer, ids) == ["a", "", "", "€", "b", ""]


def test_incomplete_character_at_the_end_comes_out_on_flush():
    tokenizer = _byte_tokenizer()
    ids = tokenizer.encode("ok€")[:-1]  # the euro sign's last byte never comes
    detokenizer = IncrementalDetokenizer(tokenizer)
    assert [detokenizer.push(token_id) for token_id in ids] == ["o", "k", "", ""]
    assert detokenizer.flush() == "\ufffd"  # one replacement character for the truncated sequence
    assert detokenizer.text == tokenizer.decode(ids) == "ok\ufffd"
    assert detokenizer.flush() == ""


def test_sentencepiece_spaces_from_the_window():
    tokenizer = _sentencepiece_tokenizer()
    assert tokenizer.decode([2]) == "world"  # alone, the leading space is stripped...
    detokenizer = IncrementalDetokenizer(tokenizer)
    assert _stream(detokenizer, [1, 2, 3]) == ["Hello", " world", "!", ""]  # ...but not after "Hello"
    # With the prompt as left context, the first generated token keeps its space.
    detokenizer = IncrementalDetokenizer(tokenizer, prompt_ids=[1])
    assert _stream(detokenizer, [2, 3]) == [" world", "!", ""]
    # Byte-fallback tokens of one character are held until it is complete.
    detokenizer = IncrementalDetokenizer(tokenizer)
    assert _stream(detokenizer, [1, 4, 5, 6, 3]) == ["Hello", "", "", "€", "!", ""]


# -- stop strings -----------------------------------------------------------------------------------


def _run(matcher, deltas):
    """Feed deltas until a stop; return (all emitted text, stopped)."""
    out = []
    for delta in deltas:
        text, stopped = matcher.feed(delta)
        out.append(text)
        if stopped:
            return "".join(out), True
    return "".join(out) + matcher.flush(), False


def test_stop_inside_one_delta():
    matcher = StopStringMatcher(["</s>"])
    assert matcher.feed("Hello") == ("Hello", False)
    assert matcher.feed(" world</s> and more") == (" world", True)
    assert matcher.feed("after") == ("", True)
    assert matcher.flush() == ""


def test_stop_split_across_deltas_is_held_then_cut():
    matcher = StopStringMatcher(["</s>"])
    assert matcher.feed("Hi <") == ("Hi ", False)  # "<" could start "</s>"
    assert matcher.feed("/") == ("", False)
    assert matcher.feed("s") == ("", False)
    assert matcher.feed(">tail") == ("", True)


def test_stop_that_never_completes_is_released():
    matcher = StopStringMatcher(["</end>"])
    assert matcher.feed("a </") == ("a ", False)
    assert matcher.feed("en") == ("", False)
    assert matcher.feed("x") == ("</enx", False)  # no longer a possible start: released
    assert matcher.feed("</e") == ("", False)
    assert matcher.flush() == "</e"  # end of stream: the held text was never a stop
    assert matcher.stopped is False


def test_overlapping_prefix_keeps_the_right_suffix():
    matcher = StopStringMatcher(["abcabd"])
    assert matcher.feed("abcab") == ("", False)
    assert matcher.feed("c") == ("abc", False)  # "abcabc": only the last "abc" can still start the stop
    assert matcher.feed("abd!") == ("", True)


def test_first_stop_to_complete_wins():
    # "bc" completes before "abcd" does, even when both arrive in one delta.
    assert _run(StopStringMatcher(["abcd", "bc"]), ["xabcd"]) == ("xa", True)
    assert _run(StopStringMatcher(["abcd", "bc"]), ["x", "a", "b", "c", "d"]) == ("xa", True)
    # Same end: the longer stop, which starts earlier.
    assert _run(StopStringMatcher(["cd", "bcd"]), ["abcde"]) == ("a", True)
    assert _run(StopStringMatcher("STOP"), ["STOP"]) == ("", True)


def test_result_does_not_depend_on_how_the_stream_is_cut():
    rng = random.Random(7)
    for _ in range(500):
        text = "".join(rng.choice("ab c") for _ in range(rng.randrange(0, 25)))
        stops = ["".join(rng.choice("ab c") for _ in range(rng.randrange(1, 4))) for _ in range(rng.randrange(1, 3))]
        # Reference on the whole text: cut before the stop that ends first (ties: starts first).
        found = [(text.find(s) + len(s), text.find(s)) for s in stops if s in text]
        expected = (text[: min(found)[1]], True) if found else (text, False)
        cuts = sorted(rng.sample(range(len(text) + 1), k=min(len(text) + 1, rng.randrange(0, 6))))
        deltas = [text[i:j] for i, j in zip([0, *cuts], [*cuts, len(text)])]
        assert _run(StopStringMatcher(stops), deltas) == expected, (text, stops, deltas)


@pytest.mark.parametrize("stops", [[""], ["ok", ""], [None], [3]])
def test_invalid_stops_name_the_field(stops):
    with pytest.raises(ValueError, match="stop"):
        StopStringMatcher(stops)


@pytest.mark.slow
def test_detokenizer_and_stop_together(smollm2):
    ids = smollm2.encode("The answer is 42.\nUser: next question<|im_end|>")
    detokenizer = IncrementalDetokenizer(smollm2)
    matcher = StopStringMatcher(["\nUser:"])
    emitted = []
    for token_id in ids:
        text, stopped = matcher.feed(detokenizer.push(token_id))
        emitted.append(text)
        if stopped:
            break
    assert stopped and "".join(emitted) == "The answer is 42."


def test_accepts_tensor_prompt_and_tensor_token_ids():
    torch = pytest.importorskip("torch")
    tokenizer = _sentencepiece_tokenizer()
    detokenizer = IncrementalDetokenizer(tokenizer, prompt_ids=torch.tensor([1]))
    assert detokenizer.push(torch.tensor(2)) == " world"


def test_stop_matcher_reports_which_stop_string_ended_the_stream():
    matcher = StopStringMatcher(["END", "\n\n"])
    assert matcher.feed("one\n") == ("one", False)
    assert matcher.matched is None
    assert matcher.feed("\nEND") == ("", True)
    assert matcher.matched == "\n\n"
