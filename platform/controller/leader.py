"""At most one active controller per job: the job's leader key, held under the leader's lease."""

from __future__ import annotations

from stalwart.store import keys
from stalwart.store.client import Store
from stalwart.store.election import LeaseElection


class Leadership(LeaseElection):
    def __init__(self, store: Store, job: str, ttl: int = 5) -> None:
        super().__init__(store, keys.job_leader(job), ttl)
