"""The controller's side of diagnosis: gather evidence from the agents, ask for a verdict.

The diagnosis service is asked over HTTP when the controller knows its URL (`stalwart run` hosts
one and publishes it in etcd); without one, or when it does not answer, the same engine runs in
this process, so a hang is never left undiagnosed because a service is down.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from stalwart.controller.metric_windows import node_metrics
from stalwart.controller.stack_collection import collect_stacks, request_stacks
from stalwart.logs import ContextLogger
from stalwart.store import keys
from stalwart.store.client import Store
from stalwart.store.records import Assignment, ServiceEndpoint, StackReport, WorkerStatus

# node -> its recent metric vectors (NodeMetricVector dicts, oldest first), as the controller saw them
MetricHistory = Mapping[str, Sequence[Mapping[str, Any]]]

STACK_COLLECT_SECONDS = 15.0


@dataclass
class Finding:
    suspects: list[str]
    evidence: list[str] = field(default_factory=list)
    verdict: dict[str, Any] | None = None
    runbook: str | None = None


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


def _topology(assignment: Assignment) -> Any:
    from stalwart.diagnosis.models import Topology

    rank_nodes = assignment.rank_nodes()
    return Topology(world_size=assignment.world_size, tp=1, pp=1, dp=assignment.world_size, rank_nodes=rank_nodes)


def _finding(verdict: Any) -> Finding:
    data = verdict.model_dump(mode="json")
    suspects = list(verdict.flagged) or [s.node for s in verdict.suspects if s.score >= 0.5]
    evidence = [verdict.summary] + [f"{s.node}: {'; '.join(s.reasons[:2])}" for s in verdict.suspects[:4]]
    evidence += [
        f"metric outlier: {m.metric} on {m.node}, {m.score:.1f} robust z over {m.windows} windows"
        for m in verdict.metric_ranking[:4]
    ]
    return Finding(suspects=suspects, evidence=evidence, verdict=data, runbook=verdict.runbook or None)


def _capture(
    store: Store, job: str, assignment: Assignment, log: ContextLogger
) -> tuple[list[Any], list[str], list[StackReport]]:
    """Every worker's stack, now; the nodes that did not answer; the agents' reports."""
    from stalwart.diagnosis.models import rank_stacks

    request_id = request_stacks(store, job)
    nodes = [n.node for n in assignment.nodes]
    reports = collect_stacks(store, job, request_id, nodes, timeout=STACK_COLLECT_SECONDS)
    missing = sorted(set(nodes) - {r.node for r in reports})
    if missing:
        log.warning("no stacks from some nodes", fields={"nodes": missing})
    return rank_stacks(reports), missing, reports


def diagnose_hang(
    store: Store,
    job: str,
    assignment: Assignment,
    url: str | None,
    log: ContextLogger,
    history: MetricHistory | None = None,
) -> Finding:
    """Capture every worker's stack now, group them, and name the node(s) the outliers share; each
    node's recent metrics (its agent's window, else `history`) go with them."""
    from stalwart.diagnosis.models import EvidenceBundle

    stacks, missing, reports = _capture(store, job, assignment, log)
    bundle = EvidenceBundle(
        job=job, generation=assignment.generation, kind="hang", topology=_topology(assignment), stacks=stacks
    )
    bundle.metrics = node_metrics(reports, history or {})
    finding = _finding(_verdict(bundle, url, log))
    if missing and not finding.suspects:
        # A node that cannot even report its stacks is the likeliest culprit.
        finding.suspects = missing
        finding.evidence.append(f"no stack report from {', '.join(missing)}")
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
) -> Finding:
    """Rounds of stacks, `interval` seconds apart: the node whose ranks the others keep waiting for
    is the slow one, and metric outliers (the last round's windows, else `history`) name it when
    the stacks do not. A node that stops answering is not judged here (its lease will be)."""
    from stalwart.diagnosis.models import EvidenceBundle

    captured = []
    reports: list[StackReport] = []
    for i in range(rounds):
        if i:
            time.sleep(interval)
        stacks, _missing, reports = _capture(store, job, assignment, log)
        captured.append(stacks)
    bundle = EvidenceBundle(
        job=job, generation=assignment.generation, kind="slowdown", topology=_topology(assignment), rounds=captured
    )
    bundle.metrics = node_metrics(reports, history or {})
    return _finding(_verdict(bundle, url, log))


def diagnose_crash(
    job: str, assignment: Assignment, crashed: list[tuple[str, WorkerStatus]], url: str | None, log: ContextLogger
) -> Finding | None:
    """The service's reading of the crashed workers' logs (None if diagnosis is not installed)."""
    try:
        from stalwart.diagnosis.models import EvidenceBundle, RankLog
    except ImportError:
        return None
    logs = [RankLog(rank=w.rank, node=n, exit_code=w.exit_code, lines=w.log_tail[-40:]) for n, w in crashed]
    bundle = EvidenceBundle(
        job=job, generation=assignment.generation, kind="crash", topology=_topology(assignment), logs=logs
    )
    try:
        return _finding(_verdict(bundle, url, log))
    except Exception as exc:
        log.warning("crash diagnosis failed", fields={"error": str(exc)})
        return None
