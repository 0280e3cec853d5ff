"""Ask every node of a job for its workers' stacks, and gather the answers (bounded in time).

The answers are counted as they arrive, by a watch on the request's prefix (keys only matter
there), and read once, in pages, when every node answered or the time is up: at 10,000 nodes the
reports are over 100 MB, which neither fits one reply (4 MiB) nor bears re-reading every 0.1 s.
"""

from __future__ import annotations

import time
import uuid

from stalwart.processes import wait_for
from stalwart.store import keys
from stalwart.store.client import Store
from stalwart.store.prefix_mirror import PrefixMirror
from stalwart.store.records import StackReport, StackRequest


def request_stacks(store: Store, job: str) -> str:
    request = StackRequest(id=f"stk-{uuid.uuid4().hex[:10]}", requested_at=time.time())
    store.put(keys.stack_request(job), request)
    return request.id


def collect_stacks(
    store: Store, job: str, request_id: str, nodes: list[str], timeout: float = 15.0
) -> list[StackReport]:
    """Reports from `nodes`, waiting up to `timeout` seconds; a node that does not answer is missing."""
    prefix = keys.stacks_prefix(job, request_id)
    answered: set[str] = set()
    mirror = PrefixMirror(store, prefix)

    def everyone() -> bool:
        answered.update(key[len(prefix) :] for key, value in mirror.take().items() if value is not None)
        return answered >= set(nodes)

    try:
        mirror.start()
        wait_for(everyone, timeout)
    finally:
        mirror.close()
    return sorted(store.get_prefix(prefix, StackReport), key=lambda r: r.node)
