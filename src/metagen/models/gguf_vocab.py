"""Building `tokenizers` backends from llama.cpp's GGUF vocabulary metadata.

`tokenizer.ggml.model = "gpt2"`: byte-level BPE over the vocabulary and merges, split first by
the pre-tokenizer regexes named by `tokenizer.ggml.pre` (as llama.cpp does). `"llama"`:
SentencePiece-style BPE with byte fallback, merges recovered from the token scores. Token types
(`tokenizer.ggml.token_type`) decide which tokens are special and never split.

tests/models/test_sentencepiece_gguf.py compares the SentencePiece ids with llama.cpp's own
tokenizer on a vocabulary written as a GGUF (plain, spaced, multi-line, unicode and byte-fallback
text, with and without `tokenizer.ggml.add_space_prefix`). One case a ranked BPE cannot express:
two pieces with exactly the same score competing for overlapping pairs (llama.cpp takes the
leftmost pair, the BPE the merge ranked first); real vocabularies score pieces distinctly.
"""

from __future__ import annotations

import warnings

import tokenizers
from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers
# llama.cpp token types (`tokenizer.ggml.token_type`).
TOKEN_TYPE_NORMAL = 1
TOKEN_TYPE_UNKNOWN = 2
TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4
TOKEN_TYPE_UNUSED = 5
TOKEN_TYPE_BYTE = 6

# Pre-tokenizer regexes. Each splits every piece the previous one produced, keeping both the matches
# and the text between them ("isolated"), as llama.cpp's BPE tokenizer does.
GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
DIGIT_SPLIT = r"\p{N}"  # every digit its own piece: "12345" -> 1 2 3 4 5
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
GPT4O_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

_GPT2_FAMILY = ("gpt2", "gpt-2", "phi-2", "mpt", "olmo", "jais", "jina-es", "jina-de", "jina-v2-es", "jina-v2-de")
_SMOLLM_FAMILY = ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b")
_LLAMA3_FAMILY = ("llama3", "llama-v3", "llama-bpe", "falcon3", "pixtral", "dbrx", "smaug-bpe")
_QWEN2_FAMILY = ("qwen2", "deepseek-r1-qwen", "stablelm2", "megrez", "hunyuan")
_GPT4O_FAMILY = ("gpt-4o", "llama4")

PRE_TOKENIZER_SPLITS: dict[str, tuple[str, ...]] = {
    **{name: (GPT2_SPLIT,) for name in _GPT2_FAMILY},
    **{name: (DIGIT_SPLIT, GPT2_SPLIT) for name in _SMOLLM_FAMILY},
    **{name: (LLAMA3_SPLIT,) for name in _LLAMA3_FAMILY},
    **{name: (QWEN2_SPLIT,) for name in _QWEN2_FAMILY},
    **{name: (GPT4O_SPLIT,) for name in _GPT4O_FAMILY},
}
# Vocabularies whose BPE emits a whole pre-token as one id when it is in the vocabulary, before any
# merge (`ignore_merges` in Llama 3's tokenizer.json and in llama.cpp); with llama.cpp's BOS default.
_WHOLE_WORD_FIRST = frozenset(("llama3", "llama-v3", "llama-bpe", "falcon3", "pixtral"))
ADD_BOS_BY_DEFAULT = _WHOLE_WORD_FIRST

SENTENCEPIECE_SPACE = "\u2581"  # "▁", SentencePiece's spelling of a space


def byte_level_backend(tokens: list[str], merges: list[str], pre_type: str | None) -> tokenizers.Tokenizer:
    """Byte-level BPE: text -> UTF-8 bytes spelled with GPT-2's printable alphabet -> merges."""
    splits = PRE_TOKENIZER_SPLITS.get(pre_type)
    if splits is None:
        warnings.warn(
            f"unknown tokenizer.ggml.pre {pre_type!r}: splitting text with the GPT-2 regex, "
            "which may tokenize differently from the model's reference tokenizer",
            stacklevel=3,
        )
        splits = (GPT2_SPLIT,)
    vocab = {token: token_id for token_id, token in enumerate(tokens)}
    model = models.BPE(
        vocab=vocab,
        merges=[_split_merge(merge) for merge in merges],
        ignore_merges=pre_type in _WHOLE_WORD_FIRST,
    )
    backend = tokenizers.Tokenizer(model)
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(split), behavior="isolated") for split in splits]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    backend.decoder = decoders.ByteLevel()
    return backend


def _split_merge(merge: str) -> tuple[str, str]:
    # "Ġ t" -> ("Ġ", "t"); the first space after position 0 separates the pair (llama.cpp's rule).
    cut = merge.find(" ", 1)
    return merge[:cut], merge[cut + 1 :]


def sentencepiece_backend(
    tokens: list[str], scores: list[float], token_types: list[int], add_space_prefix: bool
) -> tokenizers.Tokenizer:
    """SentencePiece BPE: spaces spelled "▁", merges by score, unknown characters as <0xNN> bytes.

    SentencePiece merges the adjacent pair whose joined piece has the highest score. A BPE with the
    merges ranked by that score does the same, so we recover the merges: every split of every normal
    piece into two pieces of the vocabulary, best score first (ties: longer left part first, then
    vocabulary order, as transformers ranks them). Time complexity: O(sum of piece lengths) lookups,
    then a sort of the merges.

    Like llama.cpp (and SentencePiece's "legacy" Hugging Face conversion), a space is prefixed to the
    text and to each run of text after a special token, even one that already starts with a space;
    transformers' GGUF loader prefixes only the start of the text, and only without a leading space.
    """
    vocab = {token: token_id for token_id, token in enumerate(tokens)}
    mergeable = {
        token: token_id
        for token_id, token in enumerate(tokens)
        if token_types[token_id] in (TOKEN_TYPE_NORMAL, TOKEN_TYPE_USER_DEFINED)
    }
    ranked = []
    for token, token_id in mergeable.items():
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in mergeable and right in mergeable:
                ranked.append((-scores[token_id], -len(left), -len(right), token_id, left, right))
    ranked.sort()
    unknown = next((t for t, kind in zip(tokens, token_types) if kind == TOKEN_TYPE_UNKNOWN), None)
    model = models.BPE(
        vocab=vocab,
        merges=[(left, right) for *_, left, right in ranked],
        unk_token=unknown,
        fuse_unk=True,
        byte_fallback=True,
    )
    backend = tokenizers.Tokenizer(model)
    # llama.cpp prefixes a space to the text and to each piece after a special token ("legacy" SPM).
    steps = [normalizers.Prepend(SENTENCEPIECE_SPACE)] if add_space_prefix else []
    backend.normalizer = normalizers.Sequence(steps + [normalizers.Replace(" ", SENTENCEPIECE_SPACE)])
    decode_steps = [decoders.Replace(SENTENCEPIECE_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if add_space_prefix:
        decode_steps.append(decoders.Strip(content=" ", left=1, right=0))
    backend.decoder = decoders.Sequence(decode_steps)
    return backend


def add_typed_tokens(backend: tokenizers.Tokenizer, tokens: list[str], token_types: list[int]) -> None:
    """Control and unknown tokens become special added tokens, user-defined ones plain added tokens."""
    special = [
        AddedToken(token, special=True, normalized=False)
        for token, kind in zip(tokens, token_types)
        if kind in (TOKEN_TYPE_CONTROL, TOKEN_TYPE_UNKNOWN) and token
    ]
    user_defined = [
        AddedToken(token, special=False, normalized=False)
        for token, kind in zip(tokens, token_types)
        if kind == TOKEN_TYPE_USER_DEFINED and token
    ]
    if special:
        backend.add_special_tokens(special)
    if user_defined:
        backend.add_tokens(user_defined)
