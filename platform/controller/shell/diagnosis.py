"""The controller's side of diagnosis: gather evidence from the agents, ask for a verdict.

The evidence carries the job's parallel layout (stalwart.spec.topology, from the spec and the
generation's placement), so the engine names the TP/PP/DP group the outliers share, and each node's
recent metric window (the agents send it with their stacks), so `metric_outliers` can name a slow
node the stacks do not.

The diagnosis service is asked over HTTP when the controller knows its URL (`stalwart run` hosts
one and publishes it in etcd); without one, or when it does not answer, the same engine runs in
this process, so a hang is never left undiagnosed because a service is down.

The stacks (below): every node of the job is asked for its workers' stacks, and the answers are
gathered, bounded in time. They are counted as they arrive, by a watch on the request's prefix (keys only matter
there), and read once, in pages, when every node answered or the time is up: at 10,000 nodes the
reports are over 100 MB, which neither fits one reply (4 MiB) nor bears re-reading every 0.1 s.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from stalwart.controller.core.metric_windows import node_metrics
from stalwart.controller.core.work import Diagnosis
from stalwart.logs import ContextLogger
from stalwart.processes import wait_for
from stalwart.spec import SpecError, TrainingJobSpec
from stalwart.spec.topology import Topology
from stalwart.store import keys
from stalwart.store.client import Store
from stalwart.store.jobs import read_spec
from stalwart.store.prefix_mirror import PrefixMirror
from stalwart.store.records import Assignment, ServiceEndpoint, StackReport, StackRequest, WorkerStatus

# node -> its recent metric vectors (NodeMetricVector dicts, oldest first), as the controller saw them
MetricHistory = Mapping[str, Sequence[Mapping[str, Any]]]

STACK_COLLECT_SECONDS = 15.0  # how long a capture waits for every node's stacks
STACK_QUIET_SECONDS = 2.0  # past that, it waits on while some node answered this recently
STACK_COLLECT_LIMIT = 60.0  # but never longer than this in all (or the timeout, if longer)
MISSING_BLAMED_NODES = 4  # at most this many silent nodes are a hang's suspects; more: the capture failed


def diagnosis_url(store: Store, configured: str | None) -> str | None:
    if configured:
        return configured
    endpoint = store.get(keys.service("diagnosis"), ServiceEndpoint)
    return endpoint.url if endpoint else None


def _verdict(bundle: Any, url: str | None, log: ContextLogger) -> Any:
    from stalwart.diagnosis.client import diagnose_local

    def unavailable(exc: Exception) -> None:
        log.warning("diagnosis service unavailable; diagnosing in process", fields={"url": url, "error": str(exc)})

    return diagnose_local(bundle, url, on_unavailable=unavailable)


def job_topology(spec: TrainingJobSpec, assignment: Assignment) -> Topology:
    """The generation's layout: the spec's parallelism, ranks placed as the assignment places them."""
    return Topology.from_spec(spec, assignment.rank_nodes())


def _stored_topology(store: Store | None, job: str, assignment: Assignment) -> Topology | None:
    """The layout from the job's spec in etcd (what the agents launched the workers with)."""
    if store is None:
        return None
    try:
        stored = read_spec(store, job)
        return job_topology(stored.spec, assignment) if stored is not None else None
    except (SpecError, ValueError):
        return None


def _topology(store: Store | None, job: str, assignment: Assignment, topology: Topology | None) -> Any:
    """The engine's models.Topology, made from the job's Topology (given, else read from etcd)."""
    from stalwart.diagnosis.models import Topology as EngineTopology

    layout = topology or _stored_topology(store, job, assignment)
    if layout is None or layout.world_size != assignment.world_size:
        # No spec to read it from: ranks placed on their nodes, every rank a data-parallel replica.
        return EngineTopology(world_size=assignment.world_size, rank_nodes=assignment.rank_nodes())
    return EngineTopology.of(layout)


def _finding(verdict: Any) -> Diagnosis:
    data = verdict.model_dump(mode="json")
    suspects = list(verdict.flagged) or [s.node for s in verdict.suspects if s.score >= 0.5]
    evidence = [verdict.summary] + [f"{s.node}: {'; '.join(s.reasons[:2])}" for s in verdict.suspects[:4]]
    evidence += [
        f"metric outlier: {m.metric} on {m.node}, {m.score:.1f} robust z over {m.windows} windows"
        for m in verdict.metric_ranking[:4]
    ]
    return Diagnosis(suspects=suspects, evidence=evidence, verdict=data, runbook=verdict.runbook or None)


def _capture(store: Store, job: str, assignment: Assignment, log: ContextLogger) -> tuple[list[StackReport], list[str]]:
    """Every node's stack report (its workers' stacks and its metric window), now; and the nodes that
    did not answer."""
    request_id = request_stacks(store, job)
    nodes = [n.node for n in assignment.nodes]
    # Standbys answer too (every agent of the job watches the requests); only the generation's count.
    reports = [
        r for r in collect_stacks(store, job, request_id, nodes, timeout=STACK_COLLECT_SECONDS) if r.node in nodes
    ]
    missing = sorted(set(nodes) - {r.node for r in reports})
    if missing:
        log.warning("no stacks from some nodes", fields={"nodes": missing})
    return reports, missing


def diagnose_hang(
    store: Store,
    job: str,
    assignment: Assignment,
    url: str | None,
    log: ContextLogger,
    history: MetricHistory | None = None,
    *,
    topology: Topology | None = None,
) -> Diagnosis:
    """Capture every worker's stack now, group them, and name the node(s) the outliers share; each
    node's recent metrics (its agent's window, else `history`) back the stacks, or name the node
    when the stacks cannot."""
    from stalwart.diagnosis.models import EvidenceBundle, rank_stacks

    reports, missing = _capture(store, job, assignment, log)
    bundle = EvidenceBundle(
        job=job,
        generation=assignment.generation,
        kind="hang",
        topology=_topology(store, job, assignment, topology),
        stacks=rank_stacks(reports),
        metrics=node_metrics(reports, history or {}),
    )
    finding = _finding(_verdict(bundle, url, log))
    if missing and not finding.suspects:
        if len(missing) <= MISSING_BLAMED_NODES:
            # A node that cannot even report its stacks is the likeliest culprit.
            finding.suspects = missing
            finding.evidence.append(f"no stack report from {', '.join(missing)}")
        else:  # so many silent nodes say the capture failed, not that each of them is faulty
            finding.evidence.append(
                f"no stack report from {len(missing)} nodes ({', '.join(missing[:4])}, ...): "
                "too many to blame, none evicted for it"
            )
    return finding


def diagnose_slowdown(
    store: Store,
    job: str,
    assignment: Assignment,
    url: str | None,
    log: ContextLogger,
    rounds: int,
    interval: float,
    history: MetricHistory | None = None,
    *,
    topology: Topology | None = None,
) -> Diagnosis:
    """Rounds of stacks, `interval` seconds apart: the node whose ranks the others keep waiting for
    is the slow one, and metric outliers (the last round's windows, else `history`) say it too, or
    alone when the stacks do not tell. A node that stops answering is not judged here (its lease
    will be)."""
    from stalwart.diagnosis.models import EvidenceBundle, rank_stacks

    captured = []
    reports: list[StackReport] = []
    for i in range(rounds):
        if i:
            time.sleep(interval)
        reports, _missing = _capture(store, job, assignment, log)
        captured.append(rank_stacks(reports))
    bundle = EvidenceBundle(
        job=job,
        generation=assignment.generation,
        kind="slowdown",
        topology=_topology(store, job, assignment, topology),
        rounds=captured,
        metrics=node_metrics(reports, history or {}),
    )
    return _finding(_verdict(bundle, url, log))


def diagnose_crash(
    job: str,
    assignment: Assignment,
    crashed: list[tuple[str, WorkerStatus]],
    url: str | None,
    log: ContextLogger,
    *,
    topology: Topology | None = None,
    store: Store | None = None,
) -> Diagnosis | None:
    """The service's reading of the crashed workers' logs (None if diagnosis is not installed). The
    layout is `topology`, else the spec's in `store`'s etcd."""
    try:
        from stalwart.diagnosis.models import EvidenceBundle, RankLog
    except ImportError:
        return None
    logs = [RankLog(rank=w.rank, node=n, exit_code=w.exit_code, lines=w.log_tail[-40:]) for n, w in crashed]
    bundle = EvidenceBundle(
        job=job,
        generation=assignment.generation,
        kind="crash",
        topology=_topology(store, job, assignment, topology),
        logs=logs,
    )
    try:
        return _finding(_verdict(bundle, url, log))
    except Exception as exc:
        log.warning("crash diagnosis failed", fields={"error": str(exc)})
        return None


# -- every node's stacks ---------------------------------------------------------------------------------


def request_stacks(store: Store, job: str) -> str:
    request = StackRequest(id=f"stk-{uuid.uuid4().hex[:10]}", requested_at=time.time())
    store.put(keys.stack_request(job), request)
    return request.id


def collect_stacks(
    store: Store, job: str, request_id: str, nodes: list[str], timeout: float = STACK_COLLECT_SECONDS
) -> list[StackReport]:
    """Reports from `nodes`, waiting `timeout` seconds, and after that as long as answers still come
    (one in the last STACK_QUIET_SECONDS; at most STACK_COLLECT_LIMIT seconds in all): thousands
    of agents answer over seconds, and a capture cut off while they do reads as thousands of nodes
    that gave no stack. A node that has not answered by then is missing."""
    prefix = keys.stacks_prefix(job, request_id)
    wanted = set(nodes)
    answered: set[str] = set()
    mirror = PrefixMirror(store, prefix)
    started = last_answer = time.monotonic()

    def done() -> bool:
        nonlocal last_answer
        before = len(answered)
        answered.update(key[len(prefix) :] for key, value in mirror.take().items() if value is not None)
        now = time.monotonic()
        if len(answered) > before:
            last_answer = now
        if answered >= wanted:
            return True
        return now - started >= timeout and now - last_answer >= STACK_QUIET_SECONDS

    try:
        mirror.start()
        wait_for(done, max(timeout, STACK_COLLECT_LIMIT))
    finally:
        mirror.close()
    return sorted(store.get_prefix(prefix, StackReport), key=lambda r: r.node)
