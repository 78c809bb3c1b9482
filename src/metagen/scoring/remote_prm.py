"""A process reward model served by vLLM: per-step scores from its pooling API.

vLLM serves a PRM as a pooling model (`vllm serve Qwen/Qwen2.5-Math-PRM-7B --runner pooling`;
`--task reward` before 0.10). Its STEP pooler keeps the rows of the token-level output at the
step marker (`step_tag_id`: 151651 = "<extra_0>" by default for Qwen2ForProcessRewardModel; for
Math-Shepherd set with `--pooler-config '{"pooling_type": "STEP", "step_tag_id": 12902,
"returned_token_ids": [648, 387]}'`, the ids of "ки", "+", "-") after a softmax:

    POST /pooling {"model"?, "messages": [...]}  or  {"model"?, "input": [text, ...]}
    -> {"object": "list", "data": [{"index": i, "object": "pooling",
                                    "data": [[p_0, p_1], ...one row per step...]}, ...],
        "usage": {"prompt_tokens": n, "total_tokens": n}}

kind "qwen": one request per solution with the conversation of `prm_formats.qwen_messages` (the
server renders its chat template; a chat request holds one conversation), score = row[1] (the
positive class). kind "shepherd": one request for all solutions with the texts of
`prm_formats.shepherd_text`, score = row[0] (P("+") when returned_token_ids lists "+" first).

Every answer is checked: one entry per input, one row per step, each row two probabilities
summing to 1; anything else is a `ServerError` saying what came back (a server pooling every
token — no step_tag_id — returns one row per token, not per step). Transport: `Transport` (its
timeouts and retries; /pooling is under the server's root, not /v1). Cost: model_calls =
requests, prompt_tokens_computed from `usage`, flops = 2 · parameter_count · tokens when the
parameter count is given, else unknown (None), as for any remote model.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from metagen.decoding.cost import Cost
from metagen.scoring.process_reward import ProcessRewardModel, Values
from metagen.scoring.prm_formats import QWEN, QWEN_SYSTEM, SEPARATOR, SHEPHERD, STEP_TAG, qwen_messages, shepherd_text


class PoolingPRM(ProcessRewardModel):
    """url: the server ("http://host:8000" or its "/v1"); kind: QWEN or SHEPHERD (the input
    format and the column read); model: the served model's name (None: the server's only one);
    positive_column: the row entry that is the step's score (None: 1 for qwen, 0 for shepherd);
    parameter_count: the served model's non-embedding parameters (for FLOPs; None: unknown);
    transport_options: `Transport` keyword arguments (timeout, max_retries, api_key_env, ...)."""

    def __init__(self, url: str, kind: str = QWEN, *, model: str | None = None, separator: str = SEPARATOR,
                 step_tag: str = STEP_TAG, system: str = QWEN_SYSTEM, positive_column: int | None = None,
                 parameter_count: float | None = None, **transport_options) -> None:
        if kind not in (QWEN, SHEPHERD):
            raise ValueError(f"kind={kind!r} is not known; choose from {QWEN}, {SHEPHERD}")
        if positive_column not in (None, 0, 1):
            raise ValueError(f"positive_column={positive_column!r} is out of range: 0 or 1")
        from metagen.remote.transport import Transport

        base = url.rstrip("/")
        self.transport = Transport(base if base.endswith(("/v1", "/v2")) else f"{base}/v1", **transport_options)
        self.kind, self.model = kind, model
        self.separator, self.step_tag, self.system = separator, step_tag, system
        self.column = positive_column if positive_column is not None else (1 if kind == QWEN else 0)
        self.parameter_count = parameter_count

    def close(self) -> None:
        self.transport.close()

    def score_steps(self, prompt: str, steps: Sequence[str]) -> Values:
        return self.score_many(prompt, [steps])[0]

    def score_many(self, prompt: str, solutions: Sequence[Sequence[str]]) -> list[Values]:
        if not solutions:
            return []
        named = {"model": self.model} if self.model is not None else {}
        if self.kind == QWEN:
            return [self._scores(self._pool({**named, "messages": qwen_messages(prompt, steps, self.separator,
                                                                                 self.system)}), [steps])[0]
                    for steps in solutions]
        texts = [shepherd_text(prompt, steps, self.step_tag) for steps in solutions]
        return self._scores(self._pool({**named, "input": texts}), solutions)

    def _pool(self, body: dict) -> tuple[dict, str]:
        return self.transport.post("/pooling", body, root=True), f"{self.transport.root}/pooling"

    def _scores(self, answer: tuple[dict, str], solutions: Sequence[Sequence[str]]) -> list[Values]:
        """Per-solution Values from one /pooling answer; ServerError on any shape but vLLM's."""
        from metagen.remote.transport import ServerError

        payload, url = answer

        def bad(message: str) -> ServerError:
            return ServerError(url, 200, f"not a step-pooling answer: {message}")

        entries = payload.get("data")
        if not isinstance(entries, list) or len(entries) != len(solutions):
            got = len(entries) if isinstance(entries, list) else type(entries).__name__
            raise bad(f"data holds {got} entries for {len(solutions)} inputs")
        try:
            entries = sorted(entries, key=lambda entry: entry["index"])
        except (TypeError, KeyError):
            raise bad("an entry of data has no index") from None
        tokens = _usage_tokens(payload.get("usage"), bad)
        out = []
        for position, (entry, steps) in enumerate(zip(entries, solutions)):
            rows = entry.get("data")
            if entry["index"] != position or not isinstance(rows, list):
                raise bad(f"entry {position} has index {entry['index']!r} and data of type {type(rows).__name__}")
            if len(rows) != len(steps):
                raise bad(f"entry {position} holds {len(rows)} rows for {len(steps)} steps (a server pooling every "
                          "token rather than the step marker's rows: set the pooler's step_tag_id)")
            scores = []
            for row in rows:
                if (not isinstance(row, list) or len(row) != 2
                        or not all(isinstance(p, (int, float)) and math.isfinite(p) and 0 <= p <= 1 for p in row)
                        or abs(sum(row) - 1.0) > 1e-3):
                    raise bad(f"entry {position} has the row {row!r}, not two class probabilities summing to 1")
                scores.append(float(row[self.column]))
            out.append(Values(scores))
        # the request's cost goes to its first solution (a request is one batched forward)
        flops = None if self.parameter_count is None else 2.0 * self.parameter_count * tokens
        out[0].cost = Cost(model_calls=1, prompt_tokens_computed=tokens, flops=flops, scorer_flops=flops)
        return out


def _usage_tokens(usage, bad) -> int:
    tokens = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 0:
        raise bad(f"usage.prompt_tokens is {tokens!r}, not a count")
    return tokens
