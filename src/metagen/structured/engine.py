"""llguidance, the engine behind metagen's constraints: imported lazily, fed metagen's tokenizer.

llguidance (Moskal et al., 2025) compiles a grammar into a lexer (derivatives of regular
expressions) plus an Earley parser, and computes the set of allowed next tokens by walking a
trie of the vocabulary's byte strings: tens of microseconds per mask at V = 49152, constant-time
fork (`deep_copy`) and rollback. It has no Python dependencies; `import metagen` does not
import it (about 85 ms); the structured modules import it on first use.

Tokenizer adapter (`engine_tokenizer`). llguidance reads the tokenizer's `tokenizer.json`
(`Tokenizer.to_json`): every token's bytes (byte-level BPE through GPT-2's byte alphabet,
SentencePiece "▁" and <0xNN> byte fallback), and the added tokens flagged special. Special
tokens get the marker byte 0xFF in the trie, which is not valid UTF-8, so no grammar over text
(a JSON string, a regex) can ever allow `<|im_start|>`, `<|im_end|>` or any other control token;
the end-of-sequence ids (`Tokenizer.eos_token_ids`) are declared as EOS and allowed only where
the grammar accepts. The adapter checks that every special token of the tokenizer is special for
llguidance too (llguidance also reserves a byte-fallback token for 0xFF, its marker byte, which
no UTF-8 text contains).
Built once per tokenizer object (~0.2 s for SmolLM2) and kept while the tokenizer lives.

`byte_tokenizer()`: a model-free vocabulary (the 256 bytes and an EOS) on which a spec is
compiled to validate it when a `SamplingParams` is built, before any model is involved.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from metagen.models.tokenizer import Tokenizer

_ENGINE_TOKENIZERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_STATE: dict[str, Any] = {}


def llguidance() -> Any:
    """The llguidance module, or ImportError with the install command."""
    module = _STATE.get("module")
    if module is None:
        try:
            import llguidance as module
        except ImportError as error:
            raise ImportError("structured outputs need the llguidance package: pip install llguidance") from error
        _STATE["module"] = module
    return module


def parser_limits() -> Any:
    """llguidance's default resource limits, with short error messages (no parser state dump)."""
    return llguidance().LLParserLimits(verbose_errors=False)


def executor() -> Any:
    """One shared `LLExecutor`: fills the masks of a batch of matchers in parallel (native threads)."""
    if "executor" not in _STATE:
        _STATE["executor"] = llguidance().LLExecutor()
    return _STATE["executor"]


def engine_tokenizer(tokenizer: Tokenizer) -> Any:
    """llguidance's `LLTokenizer` for a metagen `Tokenizer` (cached per tokenizer object).

    Raises ValueError when llguidance reads a different set of special tokens than the tokenizer
    declares (then masks could let a control token into the text, or forbid a plain one).
    """
    cached = _ENGINE_TOKENIZERS.get(tokenizer)
    if cached is not None:
        return cached
    eos = sorted(tokenizer.eos_token_ids)
    if not eos:
        raise ValueError("structured outputs need a tokenizer with an end-of-sequence token; this one has none")
    engine = llguidance().LLTokenizer(tokenizer.to_json(), n_vocab=tokenizer.vocab_size, eos_token=eos)
    missed = [token_id for token_id in sorted(tokenizer.special_token_ids) if not engine.is_special_token(token_id)]
    if missed:
        raise ValueError(f"llguidance reads the special tokens {missed[:8]} as text; structured outputs would not "
                         "keep these control tokens out of the output")
    _ENGINE_TOKENIZERS[tokenizer] = engine
    return engine


class _ByteVocabulary:
    """The 256 single bytes plus an EOS token (id 256): a vocabulary for model-free validation."""

    eos_token_id = 256
    bos_token_id = None
    tokens = [bytes([value]) for value in range(256)] + [b"<eos>"]
    special_token_ids = [256]

    def __call__(self, data: bytes) -> list[int]:
        return list(data)


def byte_tokenizer() -> Any:
    """An `LLTokenizer` over single bytes (+ EOS): compiles any spec without a model's vocabulary."""
    if "bytes" not in _STATE:
        module = llguidance()
        _STATE["bytes"] = module.LLTokenizer(module.TokenizerWrapper(_ByteVocabulary()))
    return _STATE["bytes"]


def token_bytes(tokenizer: Tokenizer) -> list[bytes | None]:
    """Each token's bytes as llguidance reads them (index = id); None for special tokens. Cached."""
    engine = engine_tokenizer(tokenizer)
    cache = _STATE.setdefault("token_bytes", weakref.WeakKeyDictionary())
    table = cache.get(tokenizer)
    if table is None:
        table = [None if engine.is_special_token(token_id) else engine.decode_bytes([token_id])
                 for token_id in range(engine.vocab_size)]
        cache[tokenizer] = table
    return table
