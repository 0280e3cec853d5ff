"""On-call requests made through the Kubernetes API: an annotation on the TrainingJob that the
operator turns into the OperatorRequest the CLI writes to etcd without a cluster.

`stalwart node evict node-3 -n ml --job demo` with a kubeconfig patches the TrainingJob with
    metadata.annotations["requests.stalwart.dev/<id>"] = {"kind": "evict", "node": "node-3", ...}
so the cluster's RBAC decides who may (patch on trainingjobs) and its audit log records who did.
The operator creates the request in etcd (once: its id is the annotation's), the job's controller
carries it out, the answer shows in status.requests, and the operator then removes the
annotation. An annotation removed while its request is pending withdraws it (the CLI's timeout).
"""

from __future__ import annotations

import time
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel

from stalwart.logs import get_logger
from stalwart.ops.requests import withdraw
from stalwart.store import keys
from stalwart.store.client import Store
from stalwart.store.records import OperatorRequest, RequestKind, RequestStatus

ANNOTATION_PREFIX = "requests.stalwart.dev/"
# Appended to requested_by: the request came through the Kubernetes API (status.requests shows it).
VIA_KUBERNETES = " (through the Kubernetes API)"
log = get_logger("stalwart.operator.requests")


class RequestAnnotation(BaseModel):
    """The annotation's value (JSON)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    kind: RequestKind
    node: str | None = Field(default=None, max_length=63)
    reason: str = Field(default="", max_length=500)
    requested_by: str = Field(default="", max_length=200)
    requested_at: float


def annotation_key(request_id: str) -> str:
    return ANNOTATION_PREFIX + request_id


def requested(annotations: dict[str, str] | None) -> dict[str, str]:
    """Request id -> the annotation's value, for every request annotation."""
    return {k[len(ANNOTATION_PREFIX) :]: v for k, v in (annotations or {}).items() if k.startswith(ANNOTATION_PREFIX)}


def sync(store: Store, job_id: str, annotations: dict[str, str] | None) -> list[str]:
    """Create the etcd request of each new annotation; withdraw the pending ones whose annotation
    went. Returns the annotation keys to remove (answered, or not a valid request)."""
    asked = requested(annotations)
    done: list[str] = []
    for request_id, raw in asked.items():
        key = keys.request(job_id, request_id) if _valid_id(request_id) else None
        existing = store.get(key, OperatorRequest) if key else None
        if existing is not None:
            if existing.status is not RequestStatus.PENDING:
                done.append(annotation_key(request_id))
            continue
        try:
            asked_for = RequestAnnotation.model_validate_json(raw)
        except ValidationError as exc:
            log.warning("ignored a malformed request annotation", fields={"job": job_id, "error": str(exc)[:300]})
            done.append(annotation_key(request_id))
            continue
        if key is None:
            done.append(annotation_key(request_id))
            continue
        request = OperatorRequest(
            id=request_id,
            kind=asked_for.kind,
            node=asked_for.node,
            reason=asked_for.reason,
            requested_by=(asked_for.requested_by or "unknown") + VIA_KUBERNETES,
            requested_at=asked_for.requested_at or time.time(),
        )
        if store.create(key, request):
            log.info(
                "request from the Kubernetes API",
                fields={"job": job_id, "request": request_id, "kind": request.kind.value, "node": request.node},
            )
    for request in store.get_prefix(keys.requests_prefix(job_id), OperatorRequest):
        if (
            request.status is RequestStatus.PENDING
            and request.requested_by.endswith(VIA_KUBERNETES)
            and request.id not in asked
        ):
            withdraw(store, job_id, request.id)
    return done


def _valid_id(request_id: str) -> bool:
    try:
        keys.request("x", request_id)
    except ValueError:
        return False
    return len(request_id) <= 63


def removal_patch(annotation_keys: list[str]) -> dict[str, Any]:
    return {"metadata": {"annotations": dict.fromkeys(annotation_keys)}}
