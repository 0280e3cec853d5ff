"""The node's recent metric vectors: the window Minder-style diagnosis compares across nodes.

One vector per heartbeat, the newest `size` kept, each with the generation it was taken in. The
agent returns the current generation's part of the window with every stack report, so a hang or a
slowdown is judged from the minute before it, not from one sample, and never from a standby's idle
time or the previous generation's workers.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any

from stalwart.health.node_vector import NodeMetricVector

WINDOW = 60  # samples: a minute at the default heartbeat interval


class MetricsHistory:
    def __init__(self, size: int = WINDOW) -> None:
        self._samples: deque[tuple[int, NodeMetricVector]] = deque(maxlen=size)
        self._lock = threading.Lock()

    def add(self, vector: NodeMetricVector, generation: int) -> None:
        with self._lock:
            self._samples.append((generation, vector))

    def window(self, generation: int | None = None) -> list[NodeMetricVector]:
        """Oldest first; only the given generation's samples when one is given."""
        with self._lock:
            return [v for g, v in self._samples if generation is None or g == generation]

    def as_records(self, generation: int | None = None) -> list[dict[str, Any]]:
        """The window as it travels in a StackReport (oldest first)."""
        return [v.model_dump(mode="json") for v in self.window(generation)]
