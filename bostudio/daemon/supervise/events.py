"""The event bus behind /bostudio/events: state changes and stats, fanned out to every subscriber.
One event loop, no locks; a slow subscriber loses its oldest events rather than slowing the daemon."""

from __future__ import annotations

import asyncio
import time
from collections import deque

QUEUE_SIZE = 256


class EventBus:
    def __init__(self, history: int = 64) -> None:
        self._subscribers: set[asyncio.Queue] = set()
        self.recent: deque[dict] = deque(maxlen=history)
        self.seq = 0

    def publish(self, type_: str, **data: object) -> dict:
        self.seq += 1
        event = {"seq": self.seq, "time": time.time(), "type": type_, **data}
        self.recent.append(event)
        for q in self._subscribers:
            if q.full():
                q.get_nowait()
            q.put_nowait(event)
        return event

    def subscribe(self) -> asyncio.Queue:
        q: asyncio.Queue = asyncio.Queue(QUEUE_SIZE)
        self._subscribers.add(q)
        return q

    def unsubscribe(self, q: asyncio.Queue) -> None:
        self._subscribers.discard(q)
