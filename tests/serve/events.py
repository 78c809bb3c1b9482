"""What the engine tests collect from one request: its events in order, a flag its DoneEvent
sets, and (`cancel_after`) a cancel once it has that many tokens."""

from __future__ import annotations

import threading

from metagen.serve.engine import DoneEvent, ServeRequest, TokenEvent


class Collector:
    """The events of one request; `cancel_after`: cancel `request` once it has that many tokens."""

    def __init__(self, cancel_after: int | None = None) -> None:
        self.events: list[object] = []
        self.done = threading.Event()
        self.cancel_after = cancel_after
        self.request: ServeRequest | None = None

    def __call__(self, event) -> None:
        self.events.append(event)
        if isinstance(event, DoneEvent):
            self.done.set()
        elif self.cancel_after is not None and len(self.tokens) == self.cancel_after:
            self.request.cancel()

    @property
    def tokens(self) -> list[int]:
        return [event.token_id for event in self.events if isinstance(event, TokenEvent)]

    def tokens_of(self, index: int) -> list[TokenEvent]:
        """The TokenEvents of choice `index`, in order."""
        return [event for event in self.events if isinstance(event, TokenEvent) and event.index == index]
