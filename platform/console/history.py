"""Loss, throughput and ETTR over time, sampled by this console process while it runs.

etcd holds a job's current state, not its past: the console samples every unfinished job every few
seconds and keeps a bounded series per job in memory. The pages say so: a console started after a
job has no samples from before it started, and a restarted console starts over (Prometheus and the
Grafana dashboard keep the long history).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque

from pydantic import BaseModel

from stalwart.logs import get_logger
from stalwart.runner.summary import snapshot
from stalwart.store.client import Store, StoreUnavailable

log = get_logger("stalwart.console.history")

MAX_JOBS = 200  # series kept; the least recently sampled job's goes first


class Sample(BaseModel):
    at: float
    step: int | None
    loss: float | None
    tokens_per_second: float | None
    ettr: float | None
    phase: str


class History:
    """Bounded series per job; `sample_once` is what the thread runs (tests call it directly)."""

    def __init__(self, store: Store, interval: float = 2.0, points: int = 1800) -> None:
        self.store = store
        self.interval = interval
        self.points = points
        self.started_at = time.time()
        self._series: OrderedDict[str, deque[Sample]] = OrderedDict()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def series(self, job: str) -> list[Sample]:
        with self._lock:
            return list(self._series.get(job, ()))

    def record(self, job: str, sample: Sample) -> None:
        with self._lock:
            kept = self._series.get(job)
            if kept is None:
                kept = self._series[job] = deque(maxlen=self.points)
            self._series.move_to_end(job)
            if kept and kept[-1].at >= sample.at:
                return
            kept.append(sample)
            while len(self._series) > MAX_JOBS:
                self._series.popitem(last=False)

    def sample_once(self) -> None:
        from stalwart.ops.lookup import job_names

        now = time.time()
        for job in job_names(self.store):
            snap = snapshot(self.store, job, now)
            if snap is None:
                continue
            last = self.series(job)[-1:]
            if snap.phase.terminal and last and last[0].phase == snap.phase.value:
                continue  # a finished job: one sample of its end is enough
            self.record(
                job,
                Sample(
                    at=now,
                    step=snap.step,
                    loss=snap.loss,
                    tokens_per_second=snap.tokens_per_second,
                    ettr=snap.ettr.ettr,
                    phase=snap.phase.value,
                ),
            )

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.sample_once()
            except StoreUnavailable as exc:
                log.warning("history: etcd did not answer", fields={"error": str(exc)})
            except Exception as exc:  # one bad record must not stop the sampling of every job
                log.warning("history: sampling failed", fields={"error": f"{type(exc).__name__}: {exc}"})

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="console-history", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
