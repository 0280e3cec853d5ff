"""The standby duty reads etcd only when there is something new (issue 23): once when the node
becomes a standby and at each new entry of the job's checkpoint catalog, never on a timer, and not
at all on a node that is not a standby."""

from __future__ import annotations

import uuid

from stalwart.agents.standby import StandbyDuty
from stalwart.logs import get_logger
from stalwart.processes import wait_for
from stalwart.spec import parse_job
from stalwart.store import Store, keys
from stalwart.store.records import CheckpointEntry, Heartbeat, JobState, WorkerState, WorkerStatus


def spec(name: str) -> dict[str, object]:
    role = {"name": "trainer", "replicas": 1, "command": ["python", "t.py"]}
    return {
        "apiVersion": "stalwart.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": name},
        "spec": {"roles": [role]},
    }


def test_a_standby_reads_when_it_becomes_one_and_at_each_new_checkpoint(store: Store) -> None:
    name = f"sb-{uuid.uuid4().hex[:6]}"
    store.put(
        keys.job_state(name), JobState(job=name, slots=["node-0"], standbys=["node-1"], created_at=0, updated_at=0)
    )
    listed = {"now": False}
    duty = StandbyDuty(
        store, parse_job(spec(name), "test"), "node-1", get_logger("test"), lambda: listed["now"], lambda: "token"
    )
    duty.start(None)
    try:
        duty.listing_changed()  # not a standby: nothing is read
        listed["now"] = True
        duty.listing_changed()
        assert wait_for(lambda: duty.rounds == 1, timeout=60)
        # A checkpoint is committed: the slot's heartbeat carries its loader state, the catalog its entry.
        worker = WorkerStatus(
            local_rank=0,
            rank=0,
            pid=1,
            state=WorkerState.RUNNING,
            started_at=0,
            last_checkpoint_step=20,
            last_checkpoint_data={"position": 640},
        )
        store.put(
            keys.node_heartbeat(name, "node-0"), Heartbeat(node="node-0", generation=1, sent_at=1, workers=[worker])
        )
        store.put(keys.checkpoint_entry(name, 20), CheckpointEntry(step=20, uri="mem://x", committed_at=1))
        assert wait_for(lambda: duty.rounds == 2, timeout=60)  # the catalog's new entry: one more round
        assert duty.loader_state(None) == (20, {"position": 640})
        listed["now"] = False  # promoted
        duty.listing_changed()
        assert wait_for(lambda: duty._catalog is None, timeout=60)  # it no longer watches the catalog
        store.put(keys.checkpoint_entry(name, 30), CheckpointEntry(step=30, uri="mem://x", committed_at=2))
        assert duty.rounds == 2
    finally:
        duty.stop()
