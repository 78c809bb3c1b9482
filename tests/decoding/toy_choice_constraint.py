"""The enumerable toy model with a tokenizer llguidance can read, and a choice constraint's exact
reference: which toy sequences it allows, and whether each is complete.

`StructuredToyModel` is `ToyModel` whose tokenizer also exports a `tokenizer.json` (byte-level
BPE, one character per token, EOS and BOS special), so the real `StructuredProcessor` runs on it.
`choice_sequences` is the constraint written out by hand (no llguidance): every sequence it
allows within max_tokens and whether it is complete.
"""

from __future__ import annotations

from collections.abc import Sequence

from tests.decoding.toy_model import EOS, PIECES, SPECIAL, ToyModel, ToyTokenizer


class StructuredToyTokenizer(ToyTokenizer):
    """ToyTokenizer with what the structured engine reads: `to_json` and `special_token_ids`."""

    special_token_ids = SPECIAL

    def to_json(self) -> str:
        from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

        backend = Tokenizer(models.BPE(vocab={piece: i for i, piece in enumerate(PIECES)}, merges=[]))
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        backend.decoder = decoders.ByteLevel()
        backend.add_special_tokens([AddedToken(PIECES[i], special=True) for i in sorted(SPECIAL)])
        return backend.to_str()


class StructuredToyModel(ToyModel):
    def __init__(self, max_context: int = 64) -> None:
        super().__init__(max_context)
        self.tokenizer = StructuredToyTokenizer()


def choice_sequences(choices: Sequence[str], max_tokens: int) -> dict[tuple[int, ...], bool]:
    """Every completion of at most `max_tokens` toy tokens the choice constraint allows, with
    whether it is complete, enumerated by hand (no llguidance):

    - a token may follow text t when t + its character is a prefix of a choice; EOS when t is
      a choice;
    - a row ends after EOS (complete), after a choice no other choice extends (the constraint
      admits nothing more: ended without EOS, complete), or at max_tokens (complete when its
      text is a whole choice, else cut: incomplete).
    """
    found: dict[tuple[int, ...], bool] = {}

    def walk(sequence: tuple[int, ...], text: str) -> None:
        if text in choices:
            found[(*sequence, EOS)] = True
        for token, piece in enumerate(PIECES):
            if token in SPECIAL or not any(choice.startswith(text + piece) for choice in choices):
                continue
            longer, grown = (*sequence, token), text + piece
            stopped = grown in choices and not any(c != grown and c.startswith(grown) for c in choices)
            if stopped or len(longer) == max_tokens:
                found[longer] = grown in choices
            else:
                walk(longer, grown)

    walk((), "")
    return {sequence: complete for sequence, complete in found.items() if len(sequence) <= max_tokens}
