"""Pre-flight and stop-time checks carried out by the nodes' own agents, for a cluster whose
controller cannot start processes on the machines (Kubernetes: the operator's pod is elsewhere).

The request, the rendezvous and the reports go through etcd (stalwart.health.distributed_check);
the verdicts come back as `Cluster.preflight` returns them locally, so the controller's checks
(pre-flight, stop-time, standby, on request) need nothing else.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence

from stalwart.cluster.base import PreflightVerdict
from stalwart.health.collective_runner import cpu_reference
from stalwart.health.distributed_check import CheckRequest, NodeCheckReport, judge_shares
from stalwart.logs import ContextLogger
from stalwart.processes import wait_for
from stalwart.store import keys
from stalwart.store.client import Store
from stalwart.store.nodes import read_nodes

CHECK_TIMEOUT_SECONDS = 120.0  # the agents' whole check, rendezvous included
COLLECTIVE_TIMEOUT_SECONDS = 10.0
REPORT_GRACE_SECONDS = 15.0  # beyond the check's timeout, for the agents to write their reports


def checks_through_agents(
    store: Store,
    job: str,
    nodes: Sequence[str],
    procs_per_node: int,
    log: ContextLogger,
    *,
    timeout: float = CHECK_TIMEOUT_SECONDS,
    collective_timeout: float = COLLECTIVE_TIMEOUT_SECONDS,
    backend: str = "auto",
    grace: float = REPORT_GRACE_SECONDS,
) -> list[PreflightVerdict]:
    """Ask the agents of `nodes` to run the checks among themselves; one verdict per node, in order.
    A node whose agent is not registered fails at once; one whose agent does not answer in time
    fails as the hung participant."""
    registered = read_nodes(store, job).registrations
    absent = [n for n in nodes if n not in registered]
    present = [n for n in nodes if n in registered]
    verdicts = {n: PreflightVerdict(node=n, passed=False, reasons=["its agent is not registered"]) for n in absent}
    if present:
        request = CheckRequest(
            id=f"chk-{uuid.uuid4().hex[:10]}",
            nodes=present,
            procs_per_node=procs_per_node,
            timeout=timeout,
            collective_timeout=collective_timeout,
            backend=backend,
            requested_at=time.time(),
        )
        reports_prefix = keys.check_reports_prefix(job, request.id)

        def reports() -> dict[str, NodeCheckReport]:
            return {r.node: r for r in store.get_prefix(reports_prefix, NodeCheckReport) if r.request_id == request.id}

        log.info("node checks asked of the agents", fields={"request": request.id, "nodes": present})
        store.put(keys.check_request(job, request.id), request)
        try:
            wait_for(lambda: set(reports()) >= set(present), timeout + grace, interval=0.25)
            got = reports()
        finally:
            store.delete_prefix(keys.check_prefix(job, request.id))
        report, notes = judge_shares(request, got, cpu_reference)
        for verdict in report.nodes:
            node = present[verdict.node]
            verdicts[node] = PreflightVerdict(
                node=node, passed=verdict.passed and node not in notes, reasons=notes.get(node, []) + verdict.reasons
            )
        log.info(
            "node checks judged",
            fields={
                "request": request.id,
                "passed": report.passed and not notes,
                "failed": [n for n in present if not verdicts[n].passed],
                "backend": report.backend,
            },
        )
    return [verdicts[n] for n in nodes]
