"""Tokenizer: GGUF and Hugging Face directory loading, checked against transformers on the same files."""

from __future__ import annotations

import json
import warnings

import gguf
import pytest
import tokenizers
from tokenizers import decoders, models, pre_tokenizers

from metagen.models.tokenizer import Tokenizer

# A varied set: spaces, newlines, tabs, digits, contractions, code, emoji, CJK, accents, special tokens.
TEXTS = [
    "Hello world",
    "The capital of France is",
    "  leading spaces",
    "trailing spaces   ",
    "multiple   inner    spaces",
    " ",
    "",
    "\n",
    "line one\nline two\n\n\nline five",
    "\ttab\tseparated\t\tvalues",
    "12345",
    "3.14159 and 1,000,000 and 2024-01-01",
    "I'm sure they'll say it's fine, don't you think? We've seen it. YOU'RE",
    "def square(x):\n    return x ** 2  # comment\n\nprint(square(12))",
    "if (a && b) { return a->c[0]; }",
    "emoji 😀🎉👍🏽 and a family 👨\u200d👩\u200d👧",
    "中文测试，日本語のテキスト、한국어 텍스트",
    "café naïve résumé façade Ångström",
    "e\u0301 combining accent",
    "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n",
    "text<|im_end|>more<|endoftext|>end",
    "<|im_start",
    "mixed123abc456def",
    "\u00a0non-breaking\u3000spaces",
    "ALL CAPS and MiXeD cAsE",
]
# Numerals beyond 0-9: SmolLM2 splits every \p{N} character on its own (see the test below).
NUMERALS = ["¹²³ ½ Ⅻ", "١٢٣ ٤٥", "x² + y² = z²"]


@pytest.fixture(scope="module")
def smollm2_reader():
    from metagen.models.embedded import embedded_model_path

    return gguf.GGUFReader(embedded_model_path())


@pytest.fixture(scope="module")
def smollm2(smollm2_reader):
    return Tokenizer.from_gguf(smollm2_reader)


@pytest.mark.slow
@pytest.mark.parametrize("text", TEXTS)
def test_encode_matches_transformers(smollm2, reference, text):
    assert smollm2.encode(text) == reference.encode(text)
    assert smollm2.encode(text, add_special_tokens=False) == reference.encode(text, add_special_tokens=False)


@pytest.mark.slow
@pytest.mark.parametrize("text", TEXTS + NUMERALS)
def test_decode_round_trip(smollm2, reference, text):
    ids = smollm2.encode(text)
    assert smollm2.decode(ids) == text
    assert smollm2.decode(ids) == reference.decode(ids)


@pytest.mark.slow
def test_smollm2_splits_every_numeral_like_its_original_tokenizer(smollm2, reference):
    # SmolLM2's own tokenizer.json splits with Digits(individual_digits=True) before the GPT-2 regex
    # (llama.cpp's "smollm" pre-tokenizer does the same with \p{N}). transformers' GGUF loader uses
    # only the GPT-2 regex, so it keeps " ½" or "١٢٣" together; rebuild the original to compare.
    original = tokenizers.Tokenizer.from_str(reference.backend_tokenizer.to_str())
    original.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    for text in TEXTS + NUMERALS:
        assert smollm2.encode(text) == original.encode(text).ids, text
    # One id per numeral, and a space alone before it: " ½" is [" ", "½"], never " ½".
    half = smollm2.encode(" ½")
    assert smollm2.decode(half[:1]) == " " and smollm2.decode(half[1:]) == "½"


@pytest.mark.slow
def test_smollm2_special_ids_and_flags(smollm2):
    # The GGUF says bos=1 (<|im_start|>), eos=2 (<|im_end|>), add_bos_token=false.
    assert smollm2.bos_token_id == 1 and smollm2.bos_token == "<|im_start|>"
    assert smollm2.eos_token_id == 2 and smollm2.eos_token == "<|im_end|>"
    assert smollm2.eos_token_ids == frozenset({2})
    assert smollm2.add_bos_token is False and smollm2.add_eos_token is False
    assert smollm2.encode("Hello") == [19556]  # no BOS, as in llama.cpp and transformers
    assert smollm2.vocab_size == 49152
    assert smollm2.chat_template is not None and "<|im_start|>" in smollm2.chat_template


@pytest.mark.slow
def test_special_tokens_are_matched_whole_and_skippable(smollm2):
    assert smollm2.encode("<|im_start|>") == [1]
    assert smollm2.encode("a<|im_end|>b") == [
        smollm2.token_to_id("a"),
        2,
        smollm2.token_to_id("b"),
    ]
    ids = smollm2.encode("<|im_start|>Hello<|im_end|>")
    assert smollm2.decode(ids, skip_special_tokens=True) == "Hello"
    assert smollm2.decode(ids) == "<|im_start|>Hello<|im_end|>"


@pytest.mark.slow
def test_token_lookups(smollm2):
    assert smollm2.token_to_id("<|im_end|>") == 2
    assert smollm2.token_to_id("Hello") == 19556
    assert smollm2.id_to_token(19556) == "Hello"
    assert smollm2.token_to_id("no such token anywhere") is None
    ids = smollm2.encode("Hello world")
    assert smollm2.convert_ids_to_tokens(ids) == ["Hello", "Ġworld"]  # byte-level spelling of the space
    assert smollm2.id_to_token(smollm2.vocab_size) is None


@pytest.mark.slow
@pytest.mark.parametrize("ids", [[-1], [5, -3], [1.5], ["7"]])
def test_decoding_an_id_that_is_not_a_token_is_a_value_error(smollm2, ids):
    """Regression: the backend raised OverflowError for a negative id."""
    with pytest.raises(ValueError, match=r"cannot decode token id .*: ids must be ints >= 0"):
        smollm2.decode(ids)


@pytest.mark.slow
def test_text_with_a_lone_surrogate_is_a_value_error(smollm2):
    """Regression: the backend raised "TypeError: TextInputSequence must be str"."""
    with pytest.raises(ValueError, match=r"text is not valid Unicode text: character 1 is the lone surrogate"):
        smollm2.encode("a\udcff b")
    with pytest.raises(ValueError, match=r"lone surrogate '\\ud800'"):  # found in the rendered chat
        smollm2.encode_chat([{"role": "user", "content": "\ud800"}])


@pytest.mark.slow
def test_decode_accepts_tensors(smollm2):
    torch = pytest.importorskip("torch")
    ids = smollm2.encode("Hello world")
    assert smollm2.decode(torch.tensor(ids)) == "Hello world"


@pytest.mark.slow
def test_from_hf_dir_matches_transformers(reference, smollm2, tmp_path):
    reference.save_pretrained(tmp_path)
    loaded = Tokenizer.from_hf_dir(tmp_path)
    for text in TEXTS + NUMERALS:
        assert loaded.encode(text) == reference.encode(text), text
    assert loaded.chat_template == smollm2.chat_template
    assert loaded.bos_token_id == 1 and loaded.eos_token_ids == frozenset({2})
    assert loaded.add_bos_token is False
    messages = [{"role": "user", "content": "Hi there"}]
    assert loaded.encode_chat(messages) == reference.apply_chat_template(
        messages, tokenize=True, add_generation_prompt=True, return_dict=False
    )


# -- synthetic tokenizers: no model file ------------------------------------------------------------

# A byte-level vocabulary: GPT-2's 256-character byte alphabet, then a few merged words.
ALPHABET = sorted(pre_tokenizers.ByteLevel.alphabet())
WORDS = ["he", "ll", "hell", "hello", "Ġw", "or", "Ġwor", "Ġworl", "Ġworld"]
MERGES = ["h e", "l l", "he ll", "hell o", "Ġ w", "o r", "Ġw or", "Ġwor l", "Ġworl d"]


def _write_gguf(path, *, model="gpt2", pre="gpt-2", tokens, token_types, merges=None, scores=None, **keys):
    writer = gguf.GGUFWriter(str(path), arch="llama")
    writer.add_tokenizer_model(model)
    if pre is not None:
        writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(token_types)
    if merges is not None:
        writer.add_token_merges(merges)
    if scores is not None:
        writer.add_token_scores(scores)
    for name, value in keys.items():
        getattr(writer, f"add_{name}")(value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return gguf.GGUFReader(str(path))


LLAMA3_SPECIALS = ("<|endoftext|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")


def _byte_level_gguf(path, *, pre="gpt-2", specials=LLAMA3_SPECIALS, special_type=3, **keys):
    tokens = [*specials, *ALPHABET, *WORDS]
    token_types = [special_type] * len(specials) + [1] * (len(ALPHABET) + len(WORDS))
    return _write_gguf(path, pre=pre, tokens=tokens, token_types=token_types, merges=MERGES, **keys)


LLAMA3_STYLE_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
    " + message['content'] | trim + '<|eot_id|>' }}"
    "{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)


def test_gguf_byte_level_flags_and_end_of_turn(tmp_path):
    reader = _byte_level_gguf(
        tmp_path / "t.gguf",
        chat_template=LLAMA3_STYLE_TEMPLATE,
        bos_token_id=0,
        eos_token_id=0,
        add_bos_token=True,
        add_eos_token=True,
    )
    tok = Tokenizer.from_gguf(reader)
    hello, world = tok.token_to_id("hello"), tok.token_to_id("Ġworld")
    assert tok.encode("hello world") == [0, hello, world, 0]
    assert tok.encode("hello world", add_special_tokens=False) == [hello, world]
    assert tok.add_bos_token and tok.add_eos_token
    # The template ends an assistant turn with <|eot_id|> (id 3): it ends generation too.
    assert tok.eos_token_ids == frozenset({0, 3})
    # encode_chat: BOS only from the template's {{ bos_token }}, no EOS appended.
    text = "<|endoftext|><|start_header_id|>user<|end_header_id|>\n\nhello<|eot_id|>"
    text += "<|start_header_id|>assistant<|end_header_id|>\n\n"
    assert tok.apply_chat_template([{"role": "user", "content": " hello "}]) == text
    assert tok.encode_chat([{"role": "user", "content": "hello"}]) == tok.encode(text, add_special_tokens=False)
    assert tok.encode_chat([{"role": "user", "content": "hello"}])[:2] == [0, 1]


def test_gguf_eot_metadata_joins_eos_ids(tmp_path):
    tok = Tokenizer.from_gguf(_byte_level_gguf(tmp_path / "t.gguf", eos_token_id=0, eot_token_id=3))
    assert tok.eos_token_ids == frozenset({0, 3})
    assert tok.chat_template is None
    with pytest.raises(ValueError, match="no chat template.*plain prompt"):
        tok.apply_chat_template([{"role": "user", "content": "hi"}])


def test_gguf_add_bos_default_follows_llama_cpp(tmp_path):
    # No add_bos_token key: llama.cpp adds BOS for the Llama-3 pre-tokenizer family, not for GPT-2's.
    llama3 = Tokenizer.from_gguf(_byte_level_gguf(tmp_path / "a.gguf", pre="llama-bpe", bos_token_id=0))
    gpt2 = Tokenizer.from_gguf(_byte_level_gguf(tmp_path / "b.gguf", pre="gpt-2", bos_token_id=0))
    assert llama3.encode("hello") == [0, llama3.token_to_id("hello")] and llama3.add_bos_token
    assert gpt2.encode("hello") == [gpt2.token_to_id("hello")] and not gpt2.add_bos_token


def test_user_defined_tokens_are_never_split(tmp_path):
    tok = Tokenizer.from_gguf(_byte_level_gguf(tmp_path / "t.gguf", specials=("<think>",), special_type=4))
    assert tok.encode("<think>hello") == [0, tok.token_to_id("hello")]
    # User-defined tokens are not special: skipping special tokens keeps them.
    assert tok.decode([0, tok.token_to_id("hello")], skip_special_tokens=True) == "<think>hello"


def test_unknown_pre_tokenizer_falls_back_to_gpt2_with_warning(tmp_path):
    with pytest.warns(UserWarning, match="'mystery-pre'"):
        tok = Tokenizer.from_gguf(_byte_level_gguf(tmp_path / "t.gguf", pre="mystery-pre"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gpt2 = Tokenizer.from_gguf(_byte_level_gguf(tmp_path / "g.gguf", pre="gpt-2"))
    for text in ["hello world", "  hello\n\nworld  "]:
        assert tok.encode(text) == gpt2.encode(text)


def test_pre_tokenizer_families_split_digits_differently(tmp_path):
    # Only single digits are in this vocabulary, so the ids show where the regexes cut:
    # gpt2 keeps " 123" as one piece ("Ġ" then digits), smollm cuts every digit, llama3 groups three.
    tokens = ["<|endoftext|>", "Ġ", "1", "2", "3", "4", "Ġ1", "12", "123", "1234"]
    merges = ["Ġ 1", "1 2", "12 3", "123 4"]
    ids = {}
    for pre in ("gpt-2", "smollm", "llama-bpe", "qwen2"):
        reader = _write_gguf(tmp_path / f"{pre}.gguf", pre=pre, tokens=tokens, token_types=[3] + [1] * 9, merges=merges)
        tok = Tokenizer.from_gguf(reader)
        ids[pre] = tok.convert_ids_to_tokens(tok.encode(" 1234", add_special_tokens=False))
    assert ids["gpt-2"] == ["Ġ1", "2", "3", "4"]
    assert ids["smollm"] == ["Ġ", "1", "2", "3", "4"]
    assert ids["llama-bpe"] == ["Ġ", "123", "4"]
    assert ids["qwen2"] == ["Ġ", "1", "2", "3", "4"]


def test_unsupported_model_type_is_named(tmp_path):
    reader = _write_gguf(tmp_path / "t.gguf", model="rwkv", pre=None, tokens=["a", "b"], token_types=[1, 1])
    with pytest.raises(NotImplementedError, match="'rwkv'"):
        Tokenizer.from_gguf(reader)


# SentencePiece ("llama") vocabulary: <unk>, <s>, </s>, 256 byte tokens, then pieces by score.
SPACE = "\u2581"
PIECES = [SPACE, "h", "e", "l", "o", "w", "r", "d", SPACE + "h", "he", "ll", "lo", "llo", "hello", SPACE + "hello"]
PIECES += [SPACE + "w", "or", "wor", "world", SPACE + "world", "el", "hel", "hell"]


@pytest.fixture()
def sentencepiece_reader(tmp_path):
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{byte:02X}>" for byte in range(256)] + PIECES
    token_types = [2, 3, 3] + [6] * 256 + [1] * len(PIECES)
    scores = [0.0] * 259 + [-float(rank) for rank in range(len(PIECES))]
    return _write_gguf(
        tmp_path / "spm.gguf",
        model="llama",
        pre=None,
        tokens=tokens,
        token_types=token_types,
        scores=scores,
        bos_token_id=1,
        eos_token_id=2,
    )


def test_sentencepiece_gguf_by_hand(sentencepiece_reader):
    tok = Tokenizer.from_gguf(sentencepiece_reader)
    pieces = lambda text: tok.convert_ids_to_tokens(tok.encode(text, add_special_tokens=False))  # noqa: E731
    # Highest-scoring merge first: "▁h" (rank 8) beats "he" (rank 9), so "hello" is not reached.
    assert pieces("hello world") == [SPACE + "h", "e", "llo", SPACE + "w", "or", "l", "d"]
    # é is not in the vocabulary: its UTF-8 bytes C3 A9 fall back to byte tokens.
    assert pieces("héllo") == [SPACE + "h", "<0xC3>", "<0xA9>", "llo"]
    # llama.cpp's space prefix: also before a leading space, and after a special token.
    assert pieces(" hello") == [SPACE, SPACE + "h", "e", "llo"]
    assert pieces("</s>hello") == ["</s>", SPACE + "h", "e", "llo"]
    assert tok.encode("hello")[0] == 1 and tok.add_bos_token  # SentencePiece default: BOS on
    assert tok.decode(tok.encode("héllo  world\n", add_special_tokens=False)) == "héllo  world\n"
    assert tok.decode(tok.encode("hello"), skip_special_tokens=True) == "hello"


def test_sentencepiece_gguf_matches_transformers(sentencepiece_reader):
    pytest.importorskip("transformers")
    from transformers.integrations.gguf import convert_gguf_tokenizer, get_gguf_tokenizer

    architecture, tokenizer_dict, _ = get_gguf_tokenizer(sentencepiece_reader.data.filename)
    reference, _ = convert_gguf_tokenizer(architecture, tokenizer_dict)
    tok = Tokenizer.from_gguf(sentencepiece_reader)
    # Texts without a leading space or special tokens, where the two space-prefix rules agree.
    for text in ["hello world", "world hello", "héllo", "hello  world", "\nhello\n", "held", "hellohello"]:
        assert tok.encode(text, add_special_tokens=False) == reference.encode(text, add_special_tokens=False).ids
        ids = tok.encode(text, add_special_tokens=False)
        assert tok.decode(ids) == reference.decode(ids) == text


# -- from_hf_dir on a hand-made tokenizer.json ------------------------------------------------------


def _write_hf_dir(path, config=None, generation_config=None, template_file=None):
    path.mkdir(parents=True, exist_ok=True)
    vocab = {token: index for index, token in enumerate(["<s>", "</s>", "<|end|>", *ALPHABET, "he", "hel"])}
    backend = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=[("h", "e"), ("he", "l")]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(["<s>", "</s>", "<|end|>"])
    backend.save(str(path / "tokenizer.json"))
    if config is not None:
        (path / "tokenizer_config.json").write_text(json.dumps(config))
    if generation_config is not None:
        (path / "generation_config.json").write_text(json.dumps(generation_config))
    if template_file is not None:
        (path / "chat_template.jinja").write_text(template_file)
    return path


SIMPLE_TEMPLATE = "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"


def test_from_hf_dir_config_flags_template_and_generation_eos(tmp_path):
    config = {
        "bos_token": {"content": "<s>", "special": True},
        "eos_token": "</s>",
        "add_bos_token": True,
        "chat_template": [{"name": "default", "template": SIMPLE_TEMPLATE}, {"name": "rag", "template": "x"}],
        "added_tokens_decoder": {"20": {"content": "<tool>", "special": False}},
    }
    tok = Tokenizer.from_hf_dir(_write_hf_dir(tmp_path, config, generation_config={"eos_token_id": [1, 2]}))
    assert tok.bos_token_id == 0 and tok.eos_token_id == 1
    assert tok.add_bos_token and not tok.add_eos_token
    assert tok.encode("hel") == [0, tok.token_to_id("hel")]
    assert tok.chat_template == SIMPLE_TEMPLATE
    assert tok.eos_token_ids == frozenset({1, 2})  # </s>, generation_config's list, <|end|> ends turns
    assert tok.encode("<tool>", add_special_tokens=False) == [tok.token_to_id("<tool>")]


def test_from_hf_dir_template_file_wins_and_no_config(tmp_path):
    config = {"chat_template": "ignored", "eos_token": "</s>"}
    tok = Tokenizer.from_hf_dir(_write_hf_dir(tmp_path / "a", config, template_file=SIMPLE_TEMPLATE))
    assert tok.chat_template == SIMPLE_TEMPLATE
    assert tok.bos_token_id is None and tok.eos_token_ids == frozenset({1, 2})
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}]) == "<|user|>hi<|end|>"
    bare = Tokenizer.from_hf_dir(_write_hf_dir(tmp_path / "b"))
    assert bare.chat_template is None and bare.eos_token_ids == frozenset()
    assert bare.encode("hello") == bare.encode("hello", add_special_tokens=False)
    assert bare.decode(bare.encode("hello world")) == "hello world"


def test_end_of_turn_found_when_the_template_demands_a_system_message(tmp_path):
    template = (
        "{% if messages[0]['role'] != 'system' %}{{ raise_exception('system first') }}{% endif %}"
        "{% for m in messages %}<|start_header_id|>{{ m['content'] }}<|eot_id|>{% endfor %}"
    )
    tok = Tokenizer.from_gguf(_byte_level_gguf(tmp_path / "t.gguf", eos_token_id=0, chat_template=template))
    assert tok.eos_token_ids == frozenset({0, 3})


def test_save_and_load_round_trip(tmp_path):
    reader = _byte_level_gguf(
        tmp_path / "t.gguf", chat_template=LLAMA3_STYLE_TEMPLATE, bos_token_id=0, eos_token_id=0, add_bos_token=True
    )
    tok = Tokenizer.from_gguf(reader)
    tok.save(tmp_path / "saved")
    loaded = Tokenizer.load(tmp_path / "saved")
    for text in ["hello world", "<|eot_id|>hello  world\n"]:
        assert loaded.encode(text) == tok.encode(text)
        assert loaded.encode(text, add_special_tokens=False) == tok.encode(text, add_special_tokens=False)
    assert (loaded.add_bos_token, loaded.add_eos_token) == (True, False)
    assert loaded.eos_token_ids == tok.eos_token_ids == frozenset({0, 3})
    assert loaded.chat_template == tok.chat_template


def test_add_flags_read_from_the_backend_post_processor(tmp_path):
    from tokenizers import processors

    tok = Tokenizer.from_hf_dir(_write_hf_dir(tmp_path, {"bos_token": "<s>", "eos_token": "</s>"}))
    assert (tok.add_bos_token, tok.add_eos_token) == (False, False)
    backend = tokenizers.Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    backend.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", special_tokens=[("<s>", 0), ("</s>", 1)]
    )
    both = Tokenizer(backend, bos_token_id=0, eos_token_id=1)
    assert (both.add_bos_token, both.add_eos_token) == (True, True)
    assert both.encode("he") == [0, both.token_to_id("he"), 1]
