"""metagen's tokenizer in llguidance's terms: token bytes, special tokens and EOS declared right."""

import pytest
import torch

from metagen.models.gguf_vocab import add_typed_tokens, sentencepiece_backend
from metagen.models.tokenizer import Tokenizer
from metagen.structured.bitmask import bitmask_to_bool
from metagen.structured.engine import engine_tokenizer, token_bytes
from metagen.sampling.constraint import StructuredProcessor
from metagen.structured.spec import StructuredOutputs


def test_every_token_reads_as_the_tokenizer_decodes_it(smollm2_tokenizer):
    tokenizer = smollm2_tokenizer
    table = token_bytes(tokenizer)
    assert len(table) == tokenizer.vocab_size == 49152
    texts = [tokenizer.decode([token_id]) for token_id in range(tokenizer.vocab_size)]
    for token_id, (data, text) in enumerate(zip(table, texts)):
        if token_id in tokenizer.special_token_ids:
            assert data is None, token_id
        else:
            try:
                assert data.decode("utf-8") == text, token_id
            except UnicodeDecodeError:  # part of a multi-byte character: not UTF-8 on its own
                assert "\ufffd" in text, token_id


def test_special_tokens_and_eos_are_declared(smollm2_tokenizer):
    engine = engine_tokenizer(smollm2_tokenizer)
    special = {token_id for token_id in range(engine.vocab_size) if engine.is_special_token(token_id)}
    assert special == set(smollm2_tokenizer.special_token_ids) == set(range(17))  # <|endoftext|> ... <empty_output>
    assert engine.eos_tokens == sorted(smollm2_tokenizer.eos_token_ids) == [2]  # <|im_end|>
    assert engine_tokenizer(smollm2_tokenizer) is engine  # cached per tokenizer


def test_canonical_tokenization_matches(smollm2_tokenizer):
    engine = engine_tokenizer(smollm2_tokenizer)
    for text in ["The url is http://x.com", '{"name": "Taylor Swift", "year": 1989}', "  spaces\n\nand 12345"]:
        assert engine.tokenize_str(text) == smollm2_tokenizer.encode(text, add_special_tokens=False)


SPACE = "\u2581"
PIECES = [SPACE, "h", "e", "l", "o", "w", "r", "d", SPACE + "h", "he", "ll", "lo", "llo", "hello", SPACE + "hello"]


@pytest.fixture
def sentencepiece_tokenizer():
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{byte:02X}>" for byte in range(256)] + PIECES
    token_types = [2, 3, 3] + [6] * 256 + [1] * len(PIECES)
    scores = [0.0] * 259 + [-float(rank) for rank in range(len(PIECES))]
    backend = sentencepiece_backend(tokens, scores, token_types, add_space_prefix=True)
    add_typed_tokens(backend, tokens, token_types)
    return Tokenizer(backend, bos_token_id=1, eos_token_id=2, add_bos_token=True)


def test_sentencepiece_bytes_spaces_and_byte_fallback(sentencepiece_tokenizer):
    table = token_bytes(sentencepiece_tokenizer)
    assert table[:3] == [None, None, None]  # <unk>, <s>, </s> are special
    assert table[3 + 0xFF] is None  # llguidance reserves the byte 0xFF (its special-token marker; never UTF-8)
    assert table[3 + 0xC3] == b"\xc3" and table[3 + 256] == b" " and table[3 + 256 + 14] == b" hello"
    # "héllo" must come out of byte-fallback tokens: a regex over text reaches them.
    processor = StructuredProcessor(StructuredOutputs(regex="héllo"), sentencepiece_tokenizer)
    allowed = bitmask_to_bool(processor.fill_bitmask(), sentencepiece_tokenizer.vocab_size)[0]
    assert allowed.nonzero().flatten().tolist() == [3 + 256 + 1]  # "h" only: "he", "hello" do not fit
    processor.accept(torch.tensor([3 + 256 + 1]))
    allowed = bitmask_to_bool(processor.fill_bitmask(), sentencepiece_tokenizer.vocab_size)[0]
    assert allowed.nonzero().flatten().tolist() == [3 + 0xC3]  # the first byte of "é"
