"""Reward models: a transformers sequence-classification checkpoint read as a scorer.

    s(x, y) = f_θ(text(x, y))                       # num_labels == 1: the single logit
    s(x, y) = f_θ(·)[1] − f_θ(·)[0]                 # num_labels == 2: log p(label 1) / p(label 0)

text(x, y): `template.format(prompt=x, response=y)` when given; else the tokenizer's chat
template over [user: x, assistant: y] when it has one (chat-message prompts keep all their
turns); else "x\n\ny". Candidates are scored in batches of `batch_size`, sorted by length so a
batch pads little, padded on the right (the classification head reads each row's last real
token, and right padding keeps real positions 0..L−1 for absolute-position models).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

from metagen.decoding.cost import Cost
from metagen.scoring.base import Scorer, Scores, prompt_text


class RewardModelScorer(Scorer):
    """Scores (prompt, response) pairs with a local sequence-classification checkpoint.

    path: a directory with the model and tokenizer (local files only, nothing downloaded).
    template: a format string with {prompt} and {response}, instead of the chat template.
    batch_size: candidates per forward pass. device: torch device of the model.
    max_length: truncate longer texts to this many tokens (None: no truncation).
    Time: ⌈N / batch_size⌉ forward passes. Cost: model_calls = batches, prompt_tokens_computed
    = real (non-padding) tokens, flops ≈ 2 · non-embedding params · those tokens.
    """

    name = "reward_model"

    def __init__(
        self,
        path: str,
        *,
        template: str | None = None,
        batch_size: int = 8,
        device: str = "cpu",
        max_length: int | None = None,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size} is out of range: must be >= 1")
        try:
            from transformers import AutoModelForSequenceClassification, AutoTokenizer
        except ImportError as error:
            from metagen.extras import missing

            raise missing("transformers", "reward models") from error
        self.tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        model = AutoModelForSequenceClassification.from_pretrained(path, local_files_only=True)
        self.model = model.to(device).eval()
        if self.model.config.num_labels not in (1, 2):
            raise ValueError(
                f"{path} has num_labels={self.model.config.num_labels}; "
                "a reward model needs 1 (a score) or 2 (bad/good)"
            )
        if self.tokenizer.pad_token is None:  # decoder-only checkpoints often ship without one
            self.tokenizer.pad_token = self.tokenizer.eos_token
        if self.model.config.pad_token_id is None:  # the head finds each row's last token by it
            self.model.config.pad_token_id = self.tokenizer.pad_token_id
        self.tokenizer.padding_side = "right"
        self.template = template
        self.batch_size = batch_size
        self.device = device
        self.max_length = max_length
        self.parameters = self.model.num_parameters(exclude_embeddings=True)

    def text(self, prompt, response: str) -> tuple[str, bool]:
        """The text the model reads for one pair, and whether it already holds special tokens."""
        if self.template is not None:
            return self.template.format(prompt=prompt_text(prompt), response=response), False
        if self.tokenizer.chat_template:
            items = [] if isinstance(prompt, str) else list(prompt)
            if items and all(isinstance(m, Mapping) for m in items):
                messages = [dict(m) for m in items]
            else:
                messages = [{"role": "user", "content": prompt_text(prompt)}]
            messages.append({"role": "assistant", "content": response})
            return self.tokenizer.apply_chat_template(messages, tokenize=False), True
        return f"{prompt_text(prompt)}\n\n{response}", False

    def score(self, prompt, candidates: Sequence) -> Scores:
        import torch

        start = time.perf_counter()
        encoded = []
        for candidate in candidates:
            text, has_special_tokens = self.text(prompt, candidate.text)
            encoded.append(self.tokenizer(text, add_special_tokens=not has_special_tokens,
                                          truncation=self.max_length is not None,
                                          max_length=self.max_length)["input_ids"])
        order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))  # similar lengths share a batch
        values, cost = [0.0] * len(encoded), Cost()
        for first in range(0, len(order), self.batch_size):
            rows = order[first:first + self.batch_size]
            batch = self.tokenizer.pad({"input_ids": [encoded[i] for i in rows]}, return_tensors="pt").to(self.device)
            with torch.inference_mode():
                logits = self.model(**batch).logits.float()  # (B, num_labels)
            batch_scores = logits[:, 0] if logits.shape[-1] == 1 else logits[:, 1] - logits[:, 0]  # (B,)
            for row, value in zip(rows, batch_scores.tolist()):
                values[row] = value
            tokens = int(batch["attention_mask"].sum())
            cost += Cost(model_calls=1, prompt_tokens_computed=tokens, flops=2.0 * self.parameters * tokens)
        cost.wall_seconds = time.perf_counter() - start
        return Scores(values, cost)
