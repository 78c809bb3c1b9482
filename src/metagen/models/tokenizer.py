"""Text <-> token ids for a metagen model, with its chat template.

`Tokenizer` wraps a Hugging Face `tokenizers.Tokenizer` (Rust, fast) built from either

- GGUF metadata (`Tokenizer.from_gguf`): the vocabulary, merges and token types that llama.cpp
  stores under `tokenizer.ggml.*`. `tokenizer.ggml.model = "gpt2"` is byte-level BPE, split first
  by the pre-tokenizer regexes named by `tokenizer.ggml.pre`; `"llama"` is SentencePiece-style BPE
  with byte fallback, whose merges are recovered from the token scores;
- a Hugging Face tokenizer directory (`Tokenizer.from_hf_dir`): `tokenizer.json`, plus
  `tokenizer_config.json`, `chat_template.jinja` and `generation_config.json` when present.

Special tokens. GGUF tokens of type CONTROL (3) and UNKNOWN (2) become special added tokens and
USER_DEFINED (4) plain added tokens: all are matched whole in the input text, never split, so
`"<|im_start|>"` in a string encodes to its single id (as in the reference tokenizers).
`decode(..., skip_special_tokens=True)` drops the special ones.

BOS / EOS. `encode(text, add_special_tokens=True)` adds BOS when `tokenizer.ggml.add_bos_token` is
true (EOS likewise with `add_eos_token`). When the key is absent we use llama.cpp's default: true
for SentencePiece vocabularies and the Llama-3 pre-tokenizer family, false otherwise. SmolLM2's GGUF
says false, and both llama.cpp and transformers (loading the same GGUF) add nothing, so neither do
we; its chat template writes `<|im_start|>` itself. `encode_chat` never adds BOS/EOS: the template
owns them (transformers' `apply_chat_template` encodes with `add_special_tokens=False` too).

`eos_token_ids` is the set of ids that end a generation: the metadata EOS (plus the GGUF's
`eot_token_id` / `eom_token_id`, or `generation_config.json`'s `eos_token_id` list), plus the special
token the chat template writes right after an assistant message (`<|im_end|>` for ChatML,
`<|eot_id|>` for Llama 3, `<end_of_turn>` for Gemma), found by rendering a probe conversation.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import tokenizers
from tokenizers import AddedToken

from metagen.models import checks
from metagen.models.chat import render_chat_template
from metagen.models.gguf_vocab import (
    ADD_BOS_BY_DEFAULT,
    TOKEN_TYPE_NORMAL,
    add_typed_tokens,
    byte_level_backend,
    sentencepiece_backend,
)

if TYPE_CHECKING:
    import gguf


def _field(reader: gguf.GGUFReader, key: str, default: Any = None) -> Any:
    field = reader.fields.get(key)
    return default if field is None else field.contents()


class Tokenizer:
    """A model's tokenizer: `encode` / `decode`, special token ids and the chat template.

    Build it with `Tokenizer.from_gguf(reader)` or `Tokenizer.from_hf_dir(path)`; the constructor takes
    a ready `tokenizers.Tokenizer` (`backend`, not modified) and the facts the backend does not carry.

    add_bos_token / add_eos_token: None keeps what the backend's post-processor does on
        `encode(add_special_tokens=True)`; a bool overrides it (the backend is then asked for no
        special tokens and metagen adds BOS / EOS itself).
    extra_eos_token_ids: more ids that end a generation, besides `eos_token_id` and the chat
        template's end-of-turn token.
    """

    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        *,
        bos_token_id: int | None = None,
        eos_token_id: int | None = None,
        chat_template: str | None = None,
        add_bos_token: bool | None = None,
        add_eos_token: bool | None = None,
        extra_eos_token_ids: Sequence[int] = (),
    ) -> None:
        self._backend = backend
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_id
        self.chat_template = chat_template
        self.bos_token = None if bos_token_id is None else backend.id_to_token(bos_token_id)
        self.eos_token = None if eos_token_id is None else backend.id_to_token(eos_token_id)
        self._special_tokens = {
            token.content: token_id for token_id, token in backend.get_added_tokens_decoder().items() if token.special
        }

        # BOS / EOS on encode(add_special_tokens=True): ours when told, else the backend's.
        self._backend_adds_special = add_bos_token is None and add_eos_token is None
        self._prefix_ids = [bos_token_id] if add_bos_token and bos_token_id is not None else []
        self._suffix_ids = [eos_token_id] if add_eos_token and eos_token_id is not None else []
        if self._backend_adds_special:  # read the post-processor's behaviour off an empty text
            probe = backend.encode("", add_special_tokens=True).ids
            self.add_bos_token = bos_token_id is not None and probe[:1] == [bos_token_id]
            after_bos = probe[1:] if self.add_bos_token else probe
            self.add_eos_token = eos_token_id is not None and after_bos[-1:] == [eos_token_id]
        else:
            self.add_bos_token, self.add_eos_token = bool(self._prefix_ids), bool(self._suffix_ids)

        eos_ids = {int(i) for i in extra_eos_token_ids}
        if eos_token_id is not None:
            eos_ids.add(eos_token_id)
        end_of_turn = self._end_of_turn_token_id()
        if end_of_turn is not None:
            eos_ids.add(end_of_turn)
        self.eos_token_ids: frozenset[int] = frozenset(eos_ids)

    # -- construction -------------------------------------------------------------------------------

    @classmethod
    def from_gguf(cls, reader: gguf.GGUFReader) -> Tokenizer:
        """Build the tokenizer a GGUF file describes (see the module docstring for the rules).

        Raises NotImplementedError for a `tokenizer.ggml.model` other than "gpt2" or "llama".
        An unknown `tokenizer.ggml.pre` falls back to the GPT-2 regex with a warning.
        """
        model_type = _field(reader, "tokenizer.ggml.model")
        tokens: list[str] = _field(reader, "tokenizer.ggml.tokens")
        token_types: list[int] = _field(reader, "tokenizer.ggml.token_type") or [TOKEN_TYPE_NORMAL] * len(tokens)
        pre_type = _field(reader, "tokenizer.ggml.pre")
        if model_type == "gpt2":
            backend = byte_level_backend(tokens, _field(reader, "tokenizer.ggml.merges"), pre_type)
            add_bos_default = pre_type in ADD_BOS_BY_DEFAULT
        elif model_type == "llama":
            scores = _field(reader, "tokenizer.ggml.scores") or [0.0] * len(tokens)
            add_space_prefix = bool(_field(reader, "tokenizer.ggml.add_space_prefix", True))
            backend = sentencepiece_backend(tokens, scores, token_types, add_space_prefix)
            add_bos_default = True
        else:
            raise NotImplementedError(
                f"metagen cannot build a tokenizer for tokenizer.ggml.model = {model_type!r}; "
                "supported: 'gpt2' (byte-level BPE) and 'llama' (SentencePiece BPE)"
            )
        add_typed_tokens(backend, tokens, token_types)

        extra_eos = [
            token_id
            for key in ("tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")
            if (token_id := _field(reader, key)) is not None
        ]
        return cls(
            backend,
            bos_token_id=_field(reader, "tokenizer.ggml.bos_token_id"),
            eos_token_id=_field(reader, "tokenizer.ggml.eos_token_id"),
            chat_template=_field(reader, "tokenizer.chat_template"),
            add_bos_token=bool(_field(reader, "tokenizer.ggml.add_bos_token", add_bos_default)),
            add_eos_token=bool(_field(reader, "tokenizer.ggml.add_eos_token", False)),
            extra_eos_token_ids=extra_eos,
        )

    @classmethod
    def from_hf_dir(cls, path: str | Path) -> Tokenizer:
        """Build from a Hugging Face tokenizer directory.

        Reads `tokenizer.json` (required); from `tokenizer_config.json` the `bos_token` / `eos_token`,
        `add_bos_token` / `add_eos_token` (which override the post-processor, as transformers does),
        missing `added_tokens_decoder` entries and `chat_template`; a `chat_template.jinja` file wins
        over the config's template; `generation_config.json`'s `eos_token_id` (int or list) adds ids
        to `eos_token_ids`.
        """
        path = Path(path)
        backend = tokenizers.Tokenizer.from_file(str(path / "tokenizer.json"))
        config = _read_json(path / "tokenizer_config.json")
        generation_config = _read_json(path / "generation_config.json")

        for token in config.get("added_tokens_decoder", {}).values():
            if backend.token_to_id(token["content"]) is None:
                added = AddedToken(token["content"], special=bool(token.get("special")), normalized=False)
                (backend.add_special_tokens if added.special else backend.add_tokens)([added])

        chat_template = config.get("chat_template")
        if isinstance(chat_template, list):  # named templates: [{"name": ..., "template": ...}]
            named = {entry["name"]: entry["template"] for entry in chat_template}
            chat_template = named.get("default")
        if (path / "chat_template.jinja").is_file():
            chat_template = (path / "chat_template.jinja").read_text(encoding="utf-8")

        bos_token_id = _special_id(backend, config.get("bos_token"), generation_config.get("bos_token_id"))
        eos_token_id = _special_id(backend, config.get("eos_token"), None)
        generation_eos = generation_config.get("eos_token_id")
        extra_eos = generation_eos if isinstance(generation_eos, list) else [generation_eos]
        extra_eos = [int(token_id) for token_id in extra_eos if token_id is not None]
        if eos_token_id is None and extra_eos:
            eos_token_id = extra_eos[0]

        explicit = "add_bos_token" in config or "add_eos_token" in config
        return cls(
            backend,
            bos_token_id=bos_token_id,
            eos_token_id=eos_token_id,
            chat_template=chat_template,
            add_bos_token=bool(config.get("add_bos_token", False)) if explicit else None,
            add_eos_token=bool(config.get("add_eos_token", False)) if explicit else None,
            extra_eos_token_ids=extra_eos,
        )

    def save(self, directory: str | Path) -> None:
        """Write the tokenizer to `directory` (tokenizer.json + metagen_tokenizer.json) for `load`."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self._backend.save(str(directory / "tokenizer.json"))
        facts = {
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_id,
            "chat_template": self.chat_template,
            "add_bos_token": self.add_bos_token,
            "add_eos_token": self.add_eos_token,
            "eos_token_ids": sorted(self.eos_token_ids),
        }
        (directory / "metagen_tokenizer.json").write_text(json.dumps(facts), encoding="utf-8")

    @classmethod
    def load(cls, directory: str | Path) -> Tokenizer:
        """Read a tokenizer written by `save` (used by the converted-model cache)."""
        directory = Path(directory)
        backend = tokenizers.Tokenizer.from_file(str(directory / "tokenizer.json"))
        facts = json.loads((directory / "metagen_tokenizer.json").read_text(encoding="utf-8"))
        return cls(
            backend,
            bos_token_id=facts["bos_token_id"],
            eos_token_id=facts["eos_token_id"],
            chat_template=facts["chat_template"],
            add_bos_token=facts["add_bos_token"],
            add_eos_token=facts["add_eos_token"],
            extra_eos_token_ids=facts["eos_token_ids"],
        )

    # -- ids <-> text -------------------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        """Number of token ids, added tokens included (ids are `0 .. vocab_size - 1`)."""
        return self._backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`: (T,). Special tokens written in `text` map to their single ids.

        `add_special_tokens` adds BOS / EOS when the model wants them (`add_bos_token`, `add_eos_token`).
        Raises TypeError for a non-str and ValueError for a lone surrogate (bytes that were not UTF-8).
        """
        if not isinstance(text, str):
            raise TypeError(f"encode expects a str, got {type(text).__name__}")
        checks.utf8_text("text", text)
        ids = self._backend.encode(text, add_special_tokens=add_special_tokens and self._backend_adds_special).ids
        if add_special_tokens and (self._prefix_ids or self._suffix_ids):
            ids = self._prefix_ids + ids + self._suffix_ids
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """Text of token ids (T,). Bytes that do not form valid UTF-8 become U+FFFD."""
        if type(ids) is not list:
            ids = ids.tolist() if hasattr(ids, "tolist") else list(ids)
        try:
            return self._backend.decode(ids, skip_special_tokens=skip_special_tokens)
        except (OverflowError, TypeError):  # a negative id, or an item that is not an int
            bad = next((i for i in ids if isinstance(i, bool) or not isinstance(i, int) or i < 0), None)
            raise ValueError(f"cannot decode token id {bad!r}: ids must be ints >= 0") from None

    @property
    def special_token_ids(self) -> frozenset[int]:
        """Ids of the special tokens (control markers such as `<|im_start|>`, BOS, EOS)."""
        return frozenset(self._special_tokens.values())

    def to_json(self) -> str:
        """The backend as Hugging Face `tokenizer.json` text (vocabulary, merges, added tokens)."""
        return self._backend.to_str()

    def token_to_id(self, token: str) -> int | None:
        """Id of a vocabulary entry spelled as stored (byte-level: "Ġworld"), or None."""
        return self._backend.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        """Vocabulary entry of an id, spelled as stored (byte-level: "Ġworld"), or None if out of range."""
        return self._backend.id_to_token(token_id)

    def convert_ids_to_tokens(self, ids: Sequence[int]) -> list[str | None]:
        """`id_to_token` over a sequence of ids."""
        return [self._backend.id_to_token(int(token_id)) for token_id in ids]

    # -- chat ---------------------------------------------------------------------------------------

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        **variables: Any,
    ) -> str:
        """Render `messages` (dicts with `role`, `content`) to prompt text with the model's template.

        continue_final_message: end the text inside the final message (no end-of-turn marker), so
        generation continues it; needs add_generation_prompt=False (see `render_chat_template`).
        Raises ValueError for malformed messages, or when the model has no chat template.
        """
        if self.chat_template is None:
            raise ValueError(
                "this model has no chat template; encode a plain prompt with encode(text) instead of messages"
            )
        return render_chat_template(
            self.chat_template,
            messages,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
            bos_token=self.bos_token,
            eos_token=self.eos_token,
            **variables,
        )

    def encode_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        **variables: Any,
    ) -> list[int]:
        """Token ids (T,) of the rendered chat; BOS / EOS come from the template only."""
        text = self.apply_chat_template(
            messages, add_generation_prompt=add_generation_prompt, continue_final_message=continue_final_message,
            **variables,
        )
        return self.encode(text, add_special_tokens=False)

    def _end_of_turn_token_id(self) -> int | None:
        """The special token the chat template writes right after an assistant message, if any."""
        if self.chat_template is None or not self._special_tokens:
            return None
        marker = "metagenEndOfTurnProbe"
        turns = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": marker}]
        text = None
        for probe in (turns, [{"role": "system", "content": "Be brief."}, *turns]):
            try:
                text = self.apply_chat_template(probe, add_generation_prompt=False)
                break
            except Exception:  # templates may reject a conversation in any way; try the next one
                continue
        position = -1 if text is None else text.rfind(marker)
        if position < 0:
            return None
        after = text[position + len(marker) :].lstrip()
        matches = [token for token in self._special_tokens if after.startswith(token)]
        return self._special_tokens[max(matches, key=len)] if matches else None

    def __repr__(self) -> str:
        return (
            f"Tokenizer(vocab_size={self.vocab_size}, bos_token={self.bos_token!r}, "
            f"eos_token_ids={sorted(self.eos_token_ids)}, add_bos_token={self.add_bos_token}, "
            f"chat_template={'yes' if self.chat_template else 'no'})"
        )


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def _special_id(backend: tokenizers.Tokenizer, token: str | dict | None, fallback: int | None) -> int | None:
    # tokenizer_config.json spells a special token as "<s>" or {"content": "<s>", ...}.
    if isinstance(token, dict):
        token = token.get("content")
    token_id = backend.token_to_id(token) if token else None
    return token_id if token_id is not None else fallback
