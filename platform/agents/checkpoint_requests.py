"""The controller's "checkpoint now" (a CheckpointRequest, before a suspension), handed to the workers.

The request is an etcd key every agent of the job watches (stalwart.store.keys.checkpoint_request);
the watch callback only enqueues, and `serve`, on the agent's loop, writes it to a file in the
node's folder (whole, by rename) whose path every worker has in STALWART_CHECKPOINT_REQUEST. The
worker SDK reads that file at its steps (worker_sdk.checkpoint_requested): a file, not a message,
so a worker that starts after the request, or a script that asks late, still sees it. A deleted key
(the save committed, the suspension withdrawn) removes the file.
"""

from __future__ import annotations

import os
import queue
from collections.abc import Callable
from pathlib import Path

from stalwart.logs import ContextLogger
from stalwart.store import keys
from stalwart.store.client import Store
from stalwart.store.records import CheckpointRequest

FILE_NAME = "checkpoint-request.json"


class CheckpointRequests:
    def __init__(
        self, store: Store, job: str, node_dir: Path, log: ContextLogger, wake: Callable[[], None] = lambda: None
    ) -> None:
        self.store, self.job, self.log, self.wake = store, job, log, wake
        self.path = node_dir / FILE_NAME
        self._pending: queue.Queue[CheckpointRequest | None] = queue.Queue()

    def watch(self) -> None:
        """Watch the key, then read it once: a request written before the watch is not replayed."""
        self.store.watch_prefix(keys.checkpoint_request(self.job), self._on_request)
        current = self.store.get(keys.checkpoint_request(self.job), CheckpointRequest)
        if current is not None:
            self._pending.put(current)
            self.wake()

    def _on_request(self, _key: str, value: bytes | None) -> None:
        self._pending.put(CheckpointRequest.loads(value) if value is not None else None)
        self.wake()

    def serve(self) -> None:
        """Bring the file to the newest request received (or remove it)."""
        newest: CheckpointRequest | None | bool = False
        while True:
            try:
                newest = self._pending.get_nowait()
            except queue.Empty:
                break
        if newest is False:
            return
        if newest is None:
            self.path.unlink(missing_ok=True)
            return
        assert isinstance(newest, CheckpointRequest)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_suffix(".partial")
        partial.write_text(newest.dumps())
        os.replace(partial, self.path)  # a worker never reads half a request
        self.log.info(
            "checkpoint requested of the workers",
            fields={"request": newest.id, "step": newest.step, "reason": newest.reason},
        )
