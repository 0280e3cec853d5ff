"""The collective and compute checks spread over the nodes' own agents.

Locally the controller starts every check rank itself (collective_runner.run_collective_check). On a
cluster the ranks must run on the machines under test, where only the node agents are: the
requester writes a CheckRequest naming the nodes in rank order, each named agent starts its share
of the ranks (node i runs ranks i*P .. i*P+P-1) with the environment of its machine, the first
node's agent publishes where its rank 0 listens, and every agent writes back its ranks' reports.
The requester judges them with the same `judge` as a local run, so the verdicts read the same.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path

from pydantic import Field

from stalwart.health.collective_records import CollectiveCheckReport, RankReport
from stalwart.health.collective_runner import RankStarter, Reference, assemble, run_ranks, start_cold
from stalwart.store.records import Record

NO_REPORT = "its agent sent no report"


class CheckRequest(Record):
    """Written by the requester (a controller on a cluster); watched by every agent of the job."""

    id: str
    nodes: list[str]  # rank order: nodes[i] runs ranks i*procs_per_node ...; nodes[0] hosts rank 0
    procs_per_node: int = Field(ge=1, le=64)
    timeout: float = Field(gt=0, le=3600)  # the whole check, rendezvous included
    collective_timeout: float = Field(gt=0, le=600)
    backend: str = "auto"
    numel: int = Field(default=1 << 16, ge=1, le=1 << 28)
    requested_at: float


class CheckRendezvous(Record):
    """Where rank 0 (on the first node) serves the check's TCPStore."""

    address: str
    port: int


class NodeCheckReport(Record):
    request_id: str
    node: str
    ranks: list[RankReport] = []
    timed_out_ranks: list[int] = []
    exit_codes: dict[int, int | None] = {}
    error: str | None = None  # the share could not run at all (no rendezvous, a spawn failure)
    machine_faults: list[str] = []  # what the node's probes found just before: each one fails the node
    bandwidth_floor_gbps: float | None = None  # the spec's floor for this node (None: its peers' median)


def node_ranks(request: CheckRequest, node: str) -> list[int]:
    index = request.nodes.index(node)
    return list(range(index * request.procs_per_node, (index + 1) * request.procs_per_node))


def run_share(
    request: CheckRequest,
    node: str,
    workdir: Path,
    rendezvous: Callable[[float], CheckRendezvous | None],
    start: RankStarter = start_cold,
) -> NodeCheckReport:
    """This node's ranks of the check. `rendezvous(deadline)` gives rank 0's address (the first node
    picks and publishes it; the others wait for it until the monotonic `deadline`)."""
    deadline = time.monotonic() + request.timeout
    where = rendezvous(deadline)
    if where is None:
        return NodeCheckReport(
            request_id=request.id, node=node, error="the first node never published the check's rendezvous"
        )
    outcome = run_ranks(
        workdir,
        ranks=node_ranks(request, node),
        world=len(request.nodes) * request.procs_per_node,
        procs_per_node=request.procs_per_node,
        master_addr=where.address,
        master_port=where.port,
        timeout=max(1.0, deadline - time.monotonic()),
        collective_timeout=request.collective_timeout,
        backend=request.backend,
        numel=request.numel,
        start=start,
    )
    return NodeCheckReport(
        request_id=request.id,
        node=node,
        ranks=outcome.reports,
        timed_out_ranks=outcome.timed_out,
        exit_codes=outcome.exit_codes,
    )


def judge_shares(
    request: CheckRequest,
    reports: Mapping[str, NodeCheckReport],
    reference: Reference | None = None,
) -> tuple[CollectiveCheckReport, dict[str, list[str]]]:
    """Every node's share judged together, as one local run would be. A node that sent no report
    (its agent is gone, or hung) counts as ranks that never started: the hung participant.
    Also returns, per node, what its agent said beyond its ranks (no report, an error, the machine
    faults its probes found: a GPU missing, a required NIC down), each of which fails the node."""
    per = request.procs_per_node
    ranks: list[RankReport] = []
    timed_out: list[int] = []
    exit_codes: dict[int, int | None] = {}
    notes: dict[str, list[str]] = {}
    floors: dict[int, float] = {}
    for index, node in enumerate(request.nodes):
        share = reports.get(node)
        mine = node_ranks(request, node)
        got = {r.rank: r for r in share.ranks} if share else {}
        for rank in mine:
            ranks.append(got.get(rank) or RankReport(rank=rank, node=index, local_rank=rank % per, phase="not started"))
        if share is None or share.error:
            notes[node] = [share.error if share and share.error else NO_REPORT]
            timed_out += [r for r in mine if r not in got or not got[r].finished]
        else:
            timed_out += share.timed_out_ranks
            exit_codes.update(share.exit_codes)
        if share is not None and share.machine_faults:
            notes.setdefault(node, []).extend(f"machine fault: {f}" for f in share.machine_faults)
        if share is not None and share.bandwidth_floor_gbps is not None:
            floors[index] = share.bandwidth_floor_gbps
    report = assemble(
        ranks,
        per,
        timed_out,
        exit_codes,
        backend=request.backend,
        started_at=request.requested_at,
        reference=reference,
        bandwidth_floors=floors,
    )
    return report, notes
