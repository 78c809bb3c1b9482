"""SentencePiece-style vocabularies (`tokenizer.ggml.model = "llama"`: Llama 2, Mistral, Gemma) from
a GGUF file, without downloads: a SentencePiece BPE trained with `tokenizers` on a small corpus is
written as llama.cpp stores it (pieces, scores, token types, 256 <0xNN> byte tokens, control and
user-defined tokens, add_space_prefix) next to a tiny Llama model. metagen's tokenizer must give
llama.cpp's ids (the reference for GGUF files), decode back to the text, stream the same text
through the incremental detokenizer, and load with the model."""

from __future__ import annotations

import json

import gguf
import numpy as np
import pytest
import torch

from metagen.models.detokenize import IncrementalDetokenizer
from metagen.models.tokenizer import Tokenizer

SPACE = "\u2581"
CORPUS = [
    "The quick brown fox jumps over the lazy dog.", "Hello world! Hello again, world.",
    "def add(a, b):\n    return a + b\n", "Numbers: 12345 and 3.14159, dates 2024-01-02.",
    "Café, naïve, façade — Ünïcödé text; 東京 is Tokyo.", "  leading spaces and\ttabs\n\nnew paragraphs",
    "the theory of the thing that they think there", "speculative decoding samples tokens from a draft",
]
# (piece, llama.cpp token type): Gemma-style turn markers, a whitespace run, a newline run
EXTRA = [("<start_of_turn>", 4), ("<end_of_turn>", 3), (SPACE * 2, 4), ("\n\n\n", 4)]
PLAIN_TEXTS = [
    "Hello world", "hello world", " Hello world", "  two leading", "The quick brown fox.", "line one\nline two\n\n",
    "tab\there", "Café naïve", "東京タワー", "emoji 🦊 fox", "trailing space ", "x", "", "12345 + 678",
    "über-Straße", "\n", " ", "def f(x):\n    return x*2", "ÿ", "mixed\r\nCRLF", "a  b   c    d",
]
SPECIAL_TEXTS = ["x\n\n\ny", "<start_of_turn>user\nhi<end_of_turn>\n", " <start_of_turn>model", "x<end_of_turn>y", "</s>x"]


def sentencepiece_vocabulary() -> tuple[list[str], list[float], list[int]]:
    """llama.cpp's layout: <unk>, <s>, </s>, <0x00>..<0xFF>, merged pieces by score (the i-th
    merge scores -(i + 1)), single characters below every merge, then `EXTRA` at score 0."""
    from tokenizers import SentencePieceBPETokenizer

    trained = SentencePieceBPETokenizer(add_prefix_space=True)
    trained.train_from_iterator(CORPUS * 20, vocab_size=400, min_frequency=2,
                                special_tokens=["<unk>", "<s>", "</s>"], show_progress=False)
    model = json.loads(trained._tokenizer.to_str())["model"]
    merged = list(dict.fromkeys("".join(m if isinstance(m, list) else m.split(" ")) for m in model["merges"]))
    characters = [t for t in sorted(model["vocab"], key=model["vocab"].get)
                  if t not in ("<unk>", "<s>", "</s>") and t not in set(merged)]
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{byte:02X}>" for byte in range(256)] + merged + characters
    scores = [0.0] * 259 + [-float(rank + 1) for rank in range(len(merged) + len(characters))]
    types = [2, 3, 3] + [6] * 256 + [1] * (len(merged) + len(characters))
    tokens += [piece for piece, _ in EXTRA]
    scores += [0.0] * len(EXTRA)
    types += [kind for _, kind in EXTRA]
    return tokens, scores, types


def write_model(path, add_space_prefix: bool, add_eos: bool = False) -> str:
    """A GGUF with the vocabulary and a random 1-layer Llama (hidden 32) over it."""
    tokens, scores, types = sentencepiece_vocabulary()
    writer = gguf.GGUFWriter(str(path), arch="llama")
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_add_space_prefix(add_space_prefix)
    writer.add_add_eos_token(add_eos)
    hidden, ffn, vocab = 32, 64, len(tokens)
    writer.add_block_count(1)
    writer.add_context_length(128)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    rng = np.random.default_rng(0)
    shapes = {"token_embd": (vocab, hidden), "output": (vocab, hidden), "output_norm": (hidden,),
              "blk.0.attn_norm": (hidden,), "blk.0.ffn_norm": (hidden,), "blk.0.attn_q": (hidden, hidden),
              "blk.0.attn_k": (16, hidden), "blk.0.attn_v": (16, hidden), "blk.0.attn_output": (hidden, hidden),
              "blk.0.ffn_gate": (ffn, hidden), "blk.0.ffn_up": (ffn, hidden), "blk.0.ffn_down": (hidden, ffn)}
    for name, shape in shapes.items():
        values = 1 + rng.standard_normal(shape) * 0.1 if name.endswith("norm") else rng.standard_normal(shape) * 0.1
        writer.add_tensor(f"{name}.weight", values.astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return str(path)


@pytest.fixture(scope="module", params=[True, False], ids=["space-prefix", "no-space-prefix(gemma)"])
def spm_file(request, tmp_path_factory):
    return write_model(tmp_path_factory.mktemp("spm") / "spm.gguf", add_space_prefix=request.param), request.param


def test_ids_are_llama_cpps(spm_file):
    llama_cpp = pytest.importorskip("llama_cpp")
    path, _ = spm_file
    tokenizer = Tokenizer.from_gguf(gguf.GGUFReader(path))
    reference = llama_cpp.Llama(path, vocab_only=True, verbose=False)
    for text in PLAIN_TEXTS + SPECIAL_TEXTS:
        expected = reference.tokenize(text.encode(), add_bos=False, special=True)
        assert tokenizer.encode(text, add_special_tokens=False) == expected, text
    assert tokenizer.encode("Hello") == reference.tokenize(b"Hello", add_bos=True, special=True)  # BOS by default


def test_text_round_trips_through_pieces_and_byte_fallback(spm_file):
    path, add_space_prefix = spm_file
    tokenizer = Tokenizer.from_gguf(gguf.GGUFReader(path))
    pieces = tokenizer.convert_ids_to_tokens(tokenizer.encode("東京タワー", add_special_tokens=False))
    assert "<0xE3>" in pieces  # タ is not a piece: its UTF-8 bytes are byte tokens
    first = tokenizer.convert_ids_to_tokens(tokenizer.encode("Hello world", add_special_tokens=False))[0]
    assert first.startswith(SPACE) == add_space_prefix
    for text in PLAIN_TEXTS:
        assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text


def test_transformers_gguf_loader_agrees_where_its_space_rule_does(spm_file):
    """transformers prefixes "▁" only at the start of a text without a leading space, and always
    (it ignores add_space_prefix = false); llama.cpp — and metagen — follow the file."""
    pytest.importorskip("transformers")
    from transformers.integrations.gguf import convert_gguf_tokenizer, get_gguf_tokenizer

    path, add_space_prefix = spm_file
    architecture, tokenizer_dict, _ = get_gguf_tokenizer(path)
    reference, _ = convert_gguf_tokenizer(architecture, tokenizer_dict)
    tokenizer = Tokenizer.from_gguf(gguf.GGUFReader(path))
    compared = 0
    for text in PLAIN_TEXTS:
        ours = tokenizer.encode(text, add_special_tokens=False)
        theirs = reference.encode(text, add_special_tokens=False).ids
        if add_space_prefix and not text.startswith(" "):
            assert ours == theirs, text
            compared += 1
        assert reference.decode(ours).lstrip(" ") == text.lstrip(" ")  # its decoder drops one leading space
    assert compared >= 15 or not add_space_prefix


def test_incremental_detokenizer_streams_the_decoded_text(spm_file):
    path, _ = spm_file
    tokenizer = Tokenizer.from_gguf(gguf.GGUFReader(path))
    prompt = tokenizer.encode("Q: ")
    for text in PLAIN_TEXTS:
        ids = tokenizer.encode(text, add_special_tokens=False)
        detokenizer = IncrementalDetokenizer(tokenizer, prompt)
        deltas = [detokenizer.push(token_id) for token_id in ids] + [detokenizer.flush()]
        assert "".join(deltas) == tokenizer.decode(prompt + ids)[len(tokenizer.decode(prompt)):], text
        assert not any("\ufffd" in delta for delta in deltas)  # split UTF-8 characters are held back whole


def test_model_and_tokenizer_load_from_the_file(tmp_path):
    from metagen.decoding import generate
    from metagen.models import load
    from metagen.sampling import SamplingParams

    model = load(write_model(tmp_path / "eos.gguf", add_space_prefix=True, add_eos=True), dtype="fp32",
                 use_cache=False)
    ids = model.tokenizer.encode("Hello world")
    assert ids[0] == 1 and ids[-1] == 2  # add_bos (llama.cpp's default) and add_eos from the file
    assert model.vocab_size == model.tokenizer.vocab_size == len(sentencepiece_vocabulary()[0])
    result = generate(model, "Hello world", SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
    assert result.prompt_token_ids == ids and len(result.completions[0].token_ids) == 6
    logits = model.forward(model.new_cache(1), [ids]).logits[0]  # (V,)
    assert torch.isfinite(logits).all() and result.completions[0].token_ids[0] == int(logits.argmax())
