"""The warm standby pool in simulated time: taken on eviction, refilled in the background.

Its target size comes from the controller's `standbys_for`. A standby taken starts a replacement
that is ready `replenish_seconds` later (provisioning + pre-flight). An eviction that finds the pool
empty waits for the earliest replacement already on its way, or provisions one from scratch: a
cold replacement.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field


@dataclass
class StandbyPool:
    target: int
    replenish_seconds: float
    ready: int = -1
    pending: list[float] = field(default_factory=list)  # times at which replacements become ready
    cold: int = 0  # evictions that found no warm standby

    def __post_init__(self) -> None:
        if self.ready < 0:
            self.ready = self.target

    def advance(self, now: float) -> None:
        while self.pending and self.pending[0] <= now:
            heapq.heappop(self.pending)
            self.ready += 1

    def take(self, count: int, now: float) -> float:
        """Replace `count` evicted nodes at `now`; returns how long the job waits for them."""
        self.advance(now)
        wait = 0.0
        for _ in range(count):
            if self.ready > 0:
                self.ready -= 1
            elif self.pending:
                wait = max(wait, heapq.heappop(self.pending) - now)
                self.cold += 1
            else:
                wait = max(wait, self.replenish_seconds)
                self.cold += 1
            while self.ready + len(self.pending) < self.target:
                heapq.heappush(self.pending, now + self.replenish_seconds)
        return wait
