"""The controller's clock, injected: the core never reads the time itself, so tests drive it."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def time(self) -> float:
        """Seconds since the epoch: every timestamp in etcd is one of these."""
        ...


class SystemClock:
    def time(self) -> float:
        return time.time()
