"""A time-ordered event queue: the simulator's clock only ever jumps to the next event.

Ties are broken by insertion order, so a run is a pure function of its trace and strategy.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from enum import Enum


class Kind(str, Enum):
    FAILURE = "failure"  # an arrival from the trace (a failure class or a planned update)
    RECURRENCE = "recurrence"  # a deterministic user-code error hit again by the retry
    UPDATE_DEADLINE = "update_deadline"  # a pending code update must now be forced


@dataclass(frozen=True)
class Event:
    time: float
    seq: int
    kind: Kind
    arrival: int = -1  # index into the trace's arrivals
    token: int = -1  # which pending update a deadline belongs to


class EventQueue:
    """A min-heap of events with a hard cap on how many it will ever hand out (bounded loops)."""

    def __init__(self, max_events: int) -> None:
        self._heap: list[tuple[float, int, Event]] = []
        self._seq = 0
        self._left = max_events

    def push(self, time: float, kind: Kind, *, arrival: int = -1, token: int = -1) -> None:
        heapq.heappush(self._heap, (time, self._seq, Event(time, self._seq, kind, arrival, token)))
        self._seq += 1

    def pop(self) -> Event | None:
        """The next event, or None when the queue is empty or the cap is reached."""
        if not self._heap or self._left <= 0:
            return None
        self._left -= 1
        return heapq.heappop(self._heap)[2]

    def __len__(self) -> int:
        return len(self._heap)
