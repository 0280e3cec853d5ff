"""Where the data plane's servers listen, found through etcd (the data itself never goes there).

A server publishes its endpoint under `keys.dataplane_endpoint(job, channel)` with a fresh
incarnation id. When its work is over (the actor finished) it marks the key finished, so a worker
that starts late, or reconnects after the end, stops instead of waiting; when it stops otherwise the
key stays. A client that loses its connection looks the endpoint up again and waits for one that
answers: after a restart the key names the new process, and a stale key left by a killed one only
costs a refused connection.
"""

from __future__ import annotations

import os
import time
import uuid

from stalwart.store import keys
from stalwart.store.client import Store, StoreUnavailable
from stalwart.store.records import Record


class DataPlaneEndpoint(Record):
    channel: str
    address: str
    port: int
    incarnation: str
    pid: int
    started_at: float
    finished: bool = False  # the channel's work is over: clients stop instead of waiting

    @property
    def target(self) -> str:
        return f"{self.address}:{self.port}"


class EndpointDirectory:
    """The data-plane endpoints of one job. Owns its etcd client; close it when done."""

    def __init__(self, etcd_endpoint: str, job: str) -> None:
        self.job = job
        self.store = Store(etcd_endpoint)

    def publish(self, channel: str, address: str, port: int) -> DataPlaneEndpoint:
        record = DataPlaneEndpoint(
            channel=channel,
            address=address,
            port=port,
            incarnation=uuid.uuid4().hex[:16],
            pid=os.getpid(),
            started_at=time.time(),
        )
        self.store.put(keys.dataplane_endpoint(self.job, channel), record)
        return record

    def retire(self, record: DataPlaneEndpoint) -> None:
        """Mark the channel finished, if the key still names this server (a successor may own it)."""
        key = keys.dataplane_endpoint(self.job, record.channel)
        try:
            self.store.commit({key: record.model_copy(update={"finished": True})}, expect_value={key: record.dumps()})
        except StoreUnavailable:
            pass  # clients then find the server gone and wait, bounded by their give-up time

    def lookup(self, channel: str) -> DataPlaneEndpoint | None:
        return self.store.get(keys.dataplane_endpoint(self.job, channel), DataPlaneEndpoint)

    def close(self) -> None:
        self.store.close()
