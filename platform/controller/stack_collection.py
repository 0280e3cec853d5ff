"""Ask every node of a job for its workers' stacks, and gather the answers (bounded in time)."""

from __future__ import annotations

import time
import uuid

from stalwart.processes import wait_for
from stalwart.store import keys
from stalwart.store.client import Store
from stalwart.store.records import StackReport, StackRequest


def request_stacks(store: Store, job: str) -> str:
    request = StackRequest(id=f"stk-{uuid.uuid4().hex[:10]}", requested_at=time.time())
    store.put(keys.stack_request(job), request)
    return request.id


def collect_stacks(
    store: Store, job: str, request_id: str, nodes: list[str], timeout: float = 15.0
) -> list[StackReport]:
    """Reports from `nodes`, waiting up to `timeout` seconds; a node that does not answer is missing."""

    def reports() -> list[StackReport]:
        return store.get_prefix(keys.stacks_prefix(job, request_id), StackReport)

    wait_for(lambda: {r.node for r in reports()} >= set(nodes), timeout)
    return sorted(reports(), key=lambda r: r.node)
