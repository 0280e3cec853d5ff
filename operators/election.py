"""Leader election between operator replicas, on the etcd the platform already requires.

The standby replica does not start kopf at all until it leads (like controller-runtime's leader
election), and the leader stops kopf and exits at once when its lease lapses, so Kubernetes
restarts it as a standby. Why etcd and not kopf's peering: peering needs two more CRDs and is a
priority-based pause, not a lease; why not a coordination.k8s.io Lease: etcd is there anyway, its
transactions are atomic, and every controller commit is already fenced by an etcd lease per job.
"""

from __future__ import annotations

from stalwart.store import keys
from stalwart.store.client import Store
from stalwart.store.election import LeaseElection


def leader_key(operator_name: str) -> str:
    return keys.operator_leader(operator_name)


class OperatorLeadership(LeaseElection):
    """One active operator replica: the others stand by (`acquire_until`) until its lease lapses."""

    def __init__(self, store: Store, operator_name: str, identity: str, ttl: int = 10) -> None:
        super().__init__(store, leader_key(operator_name), ttl, identity=identity)
