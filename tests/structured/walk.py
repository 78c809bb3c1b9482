"""Random walks through a processor's masks: only allowed tokens, until the constraint accepts.

The walk works on numpy arrays: small torch ops wait for an intra-op thread on a busy machine.
"""

from __future__ import annotations

import random

import numpy as np
import torch

CLOSING = '"}],'  # characters that end strings, objects, arrays and items


def allowed_tokens(processor, vocab_size: int) -> np.ndarray:
    """(B, V) bool: the processor's bitmask unpacked (bit v % 32 of word v // 32)."""
    words = processor.fill_bitmask().numpy()  # (B, W) int32, little-endian bytes
    return np.unpackbits(words.view(np.uint8), axis=1, bitorder="little")[:, :vocab_size].astype(bool)


def closing_tokens(tokenizer) -> np.ndarray:
    """(V,) bool: tokens whose text holds a closing character or is one byte long (they end
    strings, arrays and regex runs sooner than a uniform choice among long words would)."""
    texts = [tokenizer.decode([token_id]) for token_id in range(tokenizer.vocab_size)]
    return np.array([any(char in text for char in CLOSING) or len(text.encode()) == 1 for text in texts])


def random_walk(processor, tokenizer, seed: int, closing: np.ndarray, max_steps: int = 400,
                stop_probability: float = 0.8, on_step=None) -> list[list[int]]:
    """Drive every row of `processor` with random allowed tokens until each ends with EOS.

    Each step: the rows' masks; a row whose constraint accepts takes EOS with `stop_probability`
    (always when nothing else is allowed); otherwise a uniform allowed token, 60% of the time one
    of the `closing` tokens when any is allowed (so strings and arrays end). `on_step(allowed,
    processor)` sees every mask (B, V) bool. Returns the tokens of each row, EOS excluded.
    """
    rng = random.Random(seed)
    eos = sorted(tokenizer.eos_token_ids)
    rows = [[] for _ in range(processor.batch_size)]
    done = [False] * processor.batch_size
    for _ in range(max_steps):
        if all(done):
            return rows
        allowed = allowed_tokens(processor, tokenizer.vocab_size)
        if on_step is not None:
            on_step(allowed, processor)
        tokens = []
        for row in range(processor.batch_size):
            if done[row]:
                tokens.append(-1)
                continue
            candidates = allowed[row].copy()
            candidates[eos] = False
            if processor.allows_stop(row) and (rng.random() < stop_probability or not candidates.any()):
                tokens.append(eos[0])
                done[row] = True
                continue
            closers = candidates & closing
            pool = np.flatnonzero(closers if closers.any() and rng.random() < 0.6 else candidates)
            token = int(pool[rng.randrange(len(pool))])
            tokens.append(token)
            rows[row].append(token)
        processor.accept(torch.tensor(tokens))
    unfinished = [tokenizer.decode(tokens[:60]) for tokens, ended in zip(rows, done) if not ended]
    raise AssertionError(f"random walk did not end in {max_steps} steps; rows begin {unfinished}")
