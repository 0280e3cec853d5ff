"""On-demand reports: the workers' stacks and logs, when the controller or the CLI asks.

Requests are etcd keys every agent of the job watches (stalwart.store.keys); the watch callbacks only
enqueue, and `serve` answers on the agent's loop. Stacks are captured on a thread of their own
(seconds, and heartbeats must not wait for them) and carry the node's recent metric window.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from stalwart.agents.stacks import StackTarget, capture_stacks, recapture
from stalwart.agents.workers import WorkerGroup, tail_lines
from stalwart.logs import ContextLogger
from stalwart.store import keys
from stalwart.store.client import Store, StoreUnavailable
from stalwart.store.records import LogReport, LogRequest, StackReport, StackRequest, WorkerLog

STACK_TIMEOUT_SECONDS = 8.0
LOG_BYTES = 256 * 1024


class OnDemandReports:
    def __init__(
        self,
        store: Store,
        job: str,
        node: str,
        log: ContextLogger,
        workers: Callable[[], tuple[int, WorkerGroup | None, WorkerGroup | None]],
        metrics_window: Callable[[], list[dict[str, Any]]],
        wake: Callable[[], None] = lambda: None,
    ) -> None:
        """`workers()` gives (generation, running group, last group); `metrics_window()` the node's
        recent metric vectors, oldest first; `wake()` wakes the loop that calls `serve`."""
        self.store, self.job, self.node, self.log = store, job, node, log
        self.wake = wake
        self.workers = workers
        self.metrics_window = metrics_window
        self.stack_requests: queue.Queue[StackRequest] = queue.Queue()
        self.log_requests: queue.Queue[LogRequest] = queue.Queue()

    def watch(self) -> None:
        self.store.watch_prefix(keys.stack_request(self.job), self._on_stack_request)
        self.store.watch_prefix(keys.log_request(self.job), self._on_log_request)

    def _on_stack_request(self, _key: str, value: bytes | None) -> None:
        if value is not None:
            self.stack_requests.put(StackRequest.loads(value))
            self.wake()

    def _on_log_request(self, _key: str, value: bytes | None) -> None:
        if value is not None:
            self.log_requests.put(LogRequest.loads(value))
            self.wake()

    def serve(self) -> None:
        """Answer what has been asked since the last call."""
        while True:
            try:
                request = self.stack_requests.get_nowait()
            except queue.Empty:
                break
            generation, group, _ = self.workers()
            targets = [StackTarget(pid, rank, log) for pid, rank, log in (group.stack_targets() if group else [])]
            threading.Thread(
                target=self._capture_stacks, args=(request, generation, targets), name="stacks", daemon=True
            ).start()
        while True:
            try:
                log_request = self.log_requests.get_nowait()
            except queue.Empty:
                break
            self._report_logs(log_request)

    def _capture_stacks(self, request: StackRequest, generation: int, targets: list[StackTarget]) -> None:
        # A dump that cannot tell where its rank is gets a second, native py-spy capture first.
        dumps = recapture(capture_stacks(targets, timeout=STACK_TIMEOUT_SECONDS), targets)
        report = StackReport(
            request_id=request.id,
            node=self.node,
            generation=generation,
            captured_at=time.time(),
            stacks=[d.model_dump(mode="json") for d in dumps],
            metrics=self.metrics_window(),
        )
        try:
            self.store.put(keys.stack_report(self.job, request.id, self.node), report)
            self.log.info(
                "stacks captured",
                fields={
                    "request": request.id,
                    "workers": len(dumps),
                    "methods": sorted({d.method.value for d in dumps}),
                    "recaptured": sum(1 for d in dumps if d.recaptured),
                    "metric_samples": len(report.metrics),
                },
            )
        except StoreUnavailable as exc:
            self.log.warning("could not store stacks", fields={"request": request.id, "error": str(exc)})

    def _report_logs(self, request: LogRequest) -> None:
        """The tail of each worker's output (the running generation's, or the last one's)."""
        generation, group, last = self.workers()
        group = group or last
        workers = [
            WorkerLog(rank=w.rank, local_rank=w.local_rank, lines=tail_lines(w.log_path, request.lines, LOG_BYTES))
            for w in (group.workers if group else [])
            if request.rank is None or w.rank == request.rank
        ]
        report = LogReport(request_id=request.id, node=self.node, generation=generation, workers=workers)
        try:
            self.store.put(keys.log_report(self.job, request.id, self.node), report)
        except StoreUnavailable as exc:
            self.log.warning("could not store logs", fields={"request": request.id, "error": str(exc)})
