"""What a node does while it waits as a warm standby, so that taking over a failed node's ranks is fast.

- Imports what starting workers needs the first time (peer choice, the signature database).
- Keeps the job's newest in-memory checkpoint in its own memory store (standbys.preloadCheckpoint):
  the ranks it takes over then load locally (stalwart.checkpoint.memory_mirror).
- Remembers the data loader's state at each checkpoint the job's workers report (the SDK's
  `report_checkpoint(step, data_state=loader.state_delta())`): when it is promoted, its shadow
  loader starts on the first batches at once, while its workers are still starting.

It works only while the node is a standby, and only when there is something new: once when it
becomes one, then at each new entry of the job's checkpoint catalog (a watch on the catalog, held
while it is a standby), and again a second later after a round etcd or a memory store cut short.
No periodic reads: the job's state and the nodes' records are O(nodes), and a standby reading
them every second is O(nodes) per standby per second.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from stalwart.checkpoint.storage.base import StorageError
from stalwart.logs import ContextLogger
from stalwart.spec import TrainingJob
from stalwart.store import keys
from stalwart.store.client import Store, StoreUnavailable
from stalwart.store.prefix_watch import PrefixWatch
from stalwart.store.records import Assignment, Heartbeat, JobState

RETRY_SECONDS = 1.0  # after a round that etcd or a memory store cut short
KEPT_LOADER_STATES = 8
LOADER_STATE_READS = 8  # slot heartbeats a round reads at most, for the newest checkpoint's loader state


def prewarm_imports() -> None:
    """Load now what starting workers needs the first time: a standby pays it while it waits, not
    while the job waits for it. Neither imports torch."""
    from stalwart.checkpoint.peers import choose_peers  # noqa: F401
    from stalwart.signatures import default_database

    default_database()


class StandbyDuty:
    def __init__(
        self,
        store: Store,
        job: TrainingJob,
        node: str,
        log: ContextLogger,
        listed: Callable[[], bool],
        token: Callable[[], str],
    ) -> None:
        """`listed()` tells whether the job's state lists this node as a standby now; `token()` is the
        job's checkpoint token, which the memory stores ask of the mirror."""
        self.store, self.job, self.node, self.log = store, job, node, log
        self.token = token
        self.listed = listed
        self.memory_address: str | None = None
        self._loader_states: dict[int, dict[str, Any]] = {}  # checkpoint step -> loader state delta
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._held: int | None = None
        self._said: str | None = None
        self._wake = threading.Event()  # something new: the node became a standby, a checkpoint was committed
        self._catalog: PrefixWatch | None = None
        self.rounds = 0  # rounds that ended (tests wait on it)

    def start(self, memory_address: str | None) -> None:
        self.memory_address = memory_address
        threading.Thread(target=prewarm_imports, name="prewarm", daemon=True).start()
        threading.Thread(target=self._loop, name="standby", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def listing_changed(self) -> None:
        """The node became a standby, or stopped being one (the agent's loop calls this)."""
        self._wake.set()

    def _on_catalog(self, _key: str, value: bytes | None) -> None:
        if value is not None:
            self._wake.set()

    def loader_state(self, max_step: int | None) -> tuple[int, dict[str, Any]] | None:
        """The newest checkpoint's loader state (no newer than `max_step`, a rollback's bound)."""
        with self._lock:
            steps = [s for s in self._loader_states if max_step is None or s <= max_step]
            return (max(steps), self._loader_states[max(steps)]) if steps else None

    def _loop(self) -> None:
        retry: float | None = None
        while True:
            self._wake.wait(retry)
            self._wake.clear()
            if self._stop.is_set():
                break
            retry = None
            try:
                if self._follow_catalog():
                    try:
                        self._round()
                    finally:
                        self.rounds += 1
            except (StoreUnavailable, StorageError) as exc:
                self.log.debug("standby round skipped", fields={"error": str(exc)})
                retry = RETRY_SECONDS
        if self._catalog is not None:
            self._catalog.cancel()

    def _follow_catalog(self) -> bool:
        """Watch the catalog while the node is a standby, and only then; True: a round is due."""
        if not self.listed():
            if self._catalog is not None:
                self._catalog.cancel()
                self._catalog = None
            return False
        if self._catalog is None:
            self._catalog = self.store.watch_prefix(keys.checkpoints_prefix(self.job.name), self._on_catalog)
        return True

    def _round(self) -> None:
        """O(1) reads: the job's state, a few slot nodes' heartbeats (every rank reports the same
        save, so the first that has the newest checkpoint's loader state is enough) and the running
        generation's assignment, which names every node's memory store."""
        state = self.store.get(keys.job_state(self.job.name), JobState)
        if state is None:
            return
        with self._lock:
            newest = max(self._loader_states, default=None)
            for name in state.slots[:LOADER_STATE_READS]:
                beat = self.store.get(keys.node_heartbeat(self.job.name, name), Heartbeat)
                found = (
                    [w for w in beat.workers if w.last_checkpoint_step is not None and w.last_checkpoint_data]
                    if beat
                    else []
                )
                for w in found:
                    assert w.last_checkpoint_step is not None and w.last_checkpoint_data is not None
                    self._loader_states[w.last_checkpoint_step] = w.last_checkpoint_data
                if found and max(self._loader_states) != newest:
                    break  # this node had a newer checkpoint's loader state: enough
            for old in sorted(self._loader_states)[:-KEPT_LOADER_STATES]:
                del self._loader_states[old]
        if self.memory_address is None or not self.job.spec.standbys.preload_checkpoint:
            return
        from stalwart.checkpoint.memory_mirror import sync_newest

        budget = int(self.job.spec.checkpoint.memory_capacity_gib * (1 << 30) / 2)
        assignment = self.store.get(keys.generation(self.job.name, state.generation), Assignment)
        stores = assignment.memory_stores() if assignment is not None else {}
        sources = [address for node, address in stores.items() if node in state.slots]
        result = sync_newest(self.memory_address, sources, self.job.name, budget, self.token()) if sources else None
        if result is not None and result.step != self._held:
            self._held = result.step
            self.log.info(
                "standby holds the newest checkpoint", fields={"step": self._held, "bytes": result.copied_bytes}
            )
        if result is not None and result.skipped and result.skipped != self._said:
            self._said = result.skipped
            self.log.warning("standby cannot hold the newest checkpoint", fields={"why": self._said})
