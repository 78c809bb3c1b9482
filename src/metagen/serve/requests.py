"""The server's request types. Parsed from a body: `ParsedRequest`, a request as the API gave it,
checked (built by `completion_request.parse_completion` and `chat_request.parse_chat`), which the
backends and the response builders read, and `StrategyRequest`, the strategy it asks for
(`strategy_request.parse_strategy`). Between the serving engine and its callers: a request
(`ServeRequest`: the input its submitter sets, with its `Lifetime`, and the outputs the engine
fills), the events it emits (`TokenEvent` per chosen token, one final `DoneEvent`), the engine's
counters (`EngineStats`, read by /metrics) and the errors `Engine.submit` raises. The engine's
own per-request state is `request_state.EngineRequest`; proxy mode's request is `proxy.ProxyRequest`."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from metagen.decoding.records import TokenRecord
from metagen.decoding.result import Completion
from metagen.decoding.rows import Row
from metagen.sampling import SamplingParams

if TYPE_CHECKING:
    from metagen.strategies.spec import StrategyOptions, StrategySpec


@dataclass(frozen=True)
class ParsedRequest:
    """One request as the API gave it, parsed and checked (never changed after): what the backends
    and the response builders need.

    chat: from /v1/chat/completions. logprobs: report per-token log-probabilities (the number of
    top alternatives is `params.logprobs`). include_usage: a final usage chunk when streaming.
    ignored: unknown fields dropped under --lenient.
    """

    chat: bool
    prompt_ids: list[int] | None  # None in proxy mode (the backend encodes the prompt)
    params: SamplingParams
    model: str
    echo_text: str | None = None  # echo: the prompt's text, put before each completion
    stream: bool = False
    include_usage: bool = False
    logprobs: bool = False
    token_ids_as_strings: bool = False
    ignored: tuple[str, ...] = ()
    strategy: StrategyRequest | None = None  # a meta-generation strategy runs (strategy_request.py)
    prompt: object = None  # the prompt as the strategy sees it: messages (chat), text or token ids
    healed: str = ""  # token_healing: the prompt text backed up, which the output must reproduce


@dataclass(frozen=True)
class StrategyRequest:
    """A strategy asked for by `metagen.strategy` or the model name `strategy:model`: its registry
    entry, its budget n, its StrategyOptions and its config overrides (validated by `spec.parse`)."""

    spec: StrategySpec
    n: int
    options: StrategyOptions
    overrides: dict


class QueueFullError(RuntimeError):
    """The engine's queue holds `max_queue` waiting requests: try again later."""


class RequestTooLargeError(ValueError):
    """A call whose requests could never all be queued at once (more than `max_queue` groups of
    `max_rows` rows): a client error, refused the same way on an idle server as on a busy one."""


class EngineStoppedError(RuntimeError):
    """The engine thread has ended (shut down, or a fault in its loop): no request can run."""


@dataclass
class TokenEvent:
    """One chosen token of completion `index` and the text it made safe to show (in proxy mode a
    piece of text as the backend streamed it: no token id or record)."""

    index: int
    text: str
    token_id: int | None
    record: TokenRecord | None
    finish_reason: str | None
    stop_reason: str | int | None = None  # the stop string or token id that ended the row (the backend's in proxy mode)


@dataclass
class DoneEvent:
    """Every row of the request has ended (`error` set: it failed, e.g. a processor emptied a row;
    `timed_out`: it ran past its deadline and was stopped). Proxy mode: `status` and `code` of the
    answer to a failure (a backend down: 503, failing: 502, refusing the request: 400) and `param`,
    the request field a refusal is about (None: not one field), and `usage` (prompt tokens,
    completion tokens, cached prompt tokens) as the backends reported it (None when they report
    none)."""

    error: str | None = None
    timed_out: bool = False
    status: int | None = None
    code: str | None = None
    param: str | None = None
    usage: tuple[int, int, int] | None = None

    @property
    def outcome(self) -> str:
        """"finished", "timed_out", "cancelled" or "failed": how the request ended."""
        if self.error is None:
            return "finished"
        if self.timed_out:
            return "timed_out"
        return "cancelled" if self.error == "cancelled" else "failed"


@dataclass(kw_only=True)
class Lifetime:
    """What every submitted request carries, whichever backend runs it: its arrival, its deadline
    (`timeout` seconds from arrival, queueing included; None: no limit) and its cancellation."""

    timeout: float | None = None
    submitted: float = field(default_factory=time.monotonic)
    cancelled: threading.Event = field(default_factory=threading.Event)

    def cancel(self) -> None:
        """Stop the request at the next step boundary (a client that went away)."""
        self.cancelled.set()

    def stopped(self, now: float) -> DoneEvent | None:
        """The event ending a request that was cancelled or ran out of time, else None."""
        if self.cancelled.is_set():
            return DoneEvent("cancelled")
        if self.timeout is not None and now - self.submitted > self.timeout:
            return DoneEvent(f"the request took longer than its {self.timeout:g} s timeout", timed_out=True)
        return None


@dataclass
class ServeRequest(Lifetime):
    """One request to the engine: `params.n` rows of one prompt. The submitter sets the input;
    the engine keeps its own state apart (`request_state.EngineRequest`) and fills the outputs.

    emit: called on the engine thread with each `TokenEvent` and a final `DoneEvent`; it must
        not block (the HTTP layer posts the events to its event loop).
    echo: also score the prompt: each piece of its prefill returns logits at every position
        ("all"), scored as they come (`PromptScorer`), and `prompt_records[t]` is the record of
        prompt token t+1 given tokens 0..t (the first token has none). The next-token logits then
        come from the last forward's last position.
    generator: the submitter's `torch.Generator` (a strategy's); None: from params.seed or fresh.

    Outputs, read after the `DoneEvent`: `rows` (one `Row` per completion; `completions`),
    `prompt_records` (echo) and `cached_tokens` (prompt tokens taken from the prefix cache).
    """

    prompt_ids: list[int]
    params: SamplingParams
    emit: Callable[[object], None]
    echo: bool = False
    healed: str = ""  # token healing: the prompt text backed up (`rows.heal_request`), reproduced first
    generator: torch.Generator | None = None
    # Outputs (set by the engine).
    rows: list[Row] = field(default_factory=list)
    prompt_records: list[TokenRecord] | None = None  # records of prompt tokens 1..T-1 (echo)
    cached_tokens: int = 0

    @property
    def completions(self) -> list[Completion]:
        return [row.completion for row in self.rows]


@dataclass
class EngineStats:
    """Counters read by /metrics (written by the engine thread; ints, read without a lock)."""

    requests_finished: int = 0
    requests_failed: int = 0
    requests_cancelled: int = 0
    requests_timed_out: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0
    steps: int = 0
    step_rows: int = 0  # sum over decode steps of the rows in the batch
    max_batch_rows: int = 0
    batch_rows: int = 0  # rows in the running batch now
    running_requests: int = 0
    prefix_hits: int = 0  # requests that reused a cached prefix
    prefix_tokens_reused: int = 0  # prompt tokens taken from the prefix cache
    prefix_tokens_cached: int = 0  # tokens the prefix cache holds now
    prefix_tokens_evicted: int = 0
    drafts: int = 0  # speculation: rows given a draft, over all steps
    draft_tokens: int = 0  # speculation: draft tokens scored (tree nodes included)
    accepted_tokens: int = 0  # speculation: draft tokens taken

    def count(self, event: DoneEvent) -> None:
        """Count a request that ended with `event` under its outcome."""
        outcome = event.outcome
        if outcome == "finished":
            self.requests_finished += 1
        elif outcome == "timed_out":
            self.requests_timed_out += 1
        elif outcome == "cancelled":
            self.requests_cancelled += 1
        else:
            self.requests_failed += 1
