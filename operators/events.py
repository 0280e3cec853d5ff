"""Kubernetes events that mean a node is gone, turned into eviction requests for the controller.

The operator does not decide anything here: a failed or evicted pod, or a NotReady Kubernetes
Node, becomes an OperatorRequest(kind=evict) in etcd, exactly as `stalwart` on-call commands write
them, and the controller applies its failure policy (hot-swap a standby into the node's slot).
One request per pod incident: its id is derived from the pod's uid and the cause, and it is
created only if absent, so a watch that replays events writes nothing twice.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any

from stalwart.store import keys
from stalwart.store.client import Store
from stalwart.store.records import JobState, OperatorRequest, RequestKind
from stalwart_operator import names

REQUESTED_BY = "operator"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


@dataclass(frozen=True)
class Disruption:
    cause: str  # a slug: pod-failed, pod-evicted, pod-disrupted, node-not-ready
    reason: str  # for people: what Kubernetes said


def pod_disruption(pod: dict[str, Any]) -> Disruption | None:
    """A pod that failed, was evicted, or is about to be (a DisruptionTarget condition)."""
    status = pod.get("status") or {}
    phase = status.get("phase")
    if phase == "Failed":
        if status.get("reason") == "Evicted":
            return Disruption(
                "pod-evicted",
                f"pod evicted: {status.get('message') or 'by the kubelet'}",
            )
        return Disruption(
            "pod-failed",
            f"pod failed: {_termination(status) or status.get('reason') or 'unknown'}",
        )
    for condition in status.get("conditions") or []:
        if condition.get("type") == "DisruptionTarget" and condition.get("status") == "True":
            detail = condition.get("message") or condition.get("reason") or "disruption"
            return Disruption("pod-disrupted", f"pod disrupted ({condition.get('reason')}): {detail}")
    return None


def _termination(status: dict[str, Any]) -> str | None:
    for cs in status.get("containerStatuses") or []:
        term = (cs.get("state") or {}).get("terminated")
        if term:
            return f"container {cs.get('name')} {term.get('reason') or 'exited'} (exit code {term.get('exitCode')})"
    return None


def node_not_ready(node: dict[str, Any]) -> Disruption | None:
    """A Kubernetes Node whose Ready condition is not True (False: kubelet unhealthy; Unknown: the
    node stopped reporting)."""
    for condition in (node.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready" and condition.get("status") != "True":
            name = (node.get("metadata") or {}).get("name")
            return Disruption(
                "node-not-ready",
                f"Kubernetes node {name} is NotReady "
                f"({condition.get('reason') or condition.get('status')}): {condition.get('message') or ''}".rstrip(
                    ": "
                ),
            )
    return None


def cordon_reason(node: dict[str, Any]) -> str | None:
    """Why Stalwart cordoned this Kubernetes Node (an evicted node's machine), or None if it did not."""
    meta = node.get("metadata") or {}
    if (meta.get("labels") or {}).get(names.CORDON_LABEL) != "true":
        return None
    return (meta.get("annotations") or {}).get(names.CORDON_REASON_ANNOTATION) or "no reason recorded"


def machine_cordoned(machine: str, reason: str) -> Disruption:
    return Disruption("machine-cordoned", f"its machine {machine} is cordoned by Stalwart ({reason})"[:500])


def request_id(cause: str, pod_uid: str) -> str:
    return _UNSAFE.sub("-", f"k8s-{cause}-{pod_uid}")[:120]


def request_eviction(
    store: Store, job_id: str, node: str, disruption: Disruption, pod_uid: str, standbys_only: bool = False
) -> bool:
    """Ask the controller to evict `node`. True if this call wrote the request; False if it exists
    already, or the node is not (or no longer) part of a running job (or, with `standbys_only`,
    not a standby)."""
    state = store.get(keys.job_state(job_id), JobState)
    if state is None or state.phase.terminal:
        return False
    if node not in state.standbys and (standbys_only or node not in state.slots):
        return False  # already replaced (a pod that failed because the controller let it go)
    request = OperatorRequest(
        id=request_id(disruption.cause, pod_uid),
        kind=RequestKind.EVICT,
        node=node,
        reason=disruption.reason[:500],
        requested_by=REQUESTED_BY,
        requested_at=time.time(),
    )
    return store.create(keys.request(job_id, request.id), request)
