"""What the diagnosis service's routes share: its limits, its metrics, the admission queue and the
worker pool, and etcd for the incident endpoints. create_app builds one per app and keeps it on
`app.state`; a route asks for it with `Svc`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.security import HTTPBearer
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from stalwart.diagnosis.worker_pool import Admission, WorkerPool
from stalwart.store.client import Store

MIB = 1024 * 1024
MAX_BODY_BYTES = 32 * MIB
MAX_DECODED_BYTES = 256 * MIB

# Routes that need the token say so with `dependencies=[Security(bearer)]` (for the OpenAPI document);
# the check itself is the BearerAuth middleware's, before a body is read.
bearer = HTTPBearer(auto_error=False, description="The service's token (STALWART_DIAGNOSIS_TOKEN).")
AUTH_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"description": "no bearer token"},
    403: {"description": "a bearer token that is not the service's"},
}


@dataclass(frozen=True)
class Limits:
    """What one service spends at most on requests."""

    max_body_bytes: int = MAX_BODY_BYTES  # as sent (compressed or not)
    max_decoded_bytes: int = MAX_DECODED_BYTES  # after gunzip
    max_concurrent: int = 2  # bundles decoded and diagnosed at once (one worker process each)
    max_queued: int = 4  # admitted requests waiting for a worker; past that, 503 at once
    queue_wait_seconds: float = 20.0  # the longest wait for a worker before a 503
    body_seconds: float = 60.0  # the longest time a client may take to send its body (408 after)
    retry_after_seconds: int = 5
    worker_memory_bytes: int = 4096 * MIB  # address space each worker may add (0: unlimited)


@dataclass
class ServiceMetrics:
    """The service's Prometheus metrics, in a registry of its own (one per app)."""

    registry: CollectorRegistry = field(default_factory=lambda: CollectorRegistry(auto_describe=True))

    def __post_init__(self) -> None:
        registry = self.registry
        self.diagnoses = Counter(
            "stalwart_diagnosis_requests",
            "Verdicts returned, by evidence kind and failure class.",
            ("kind", "failure_class"),
            registry=registry,
        )
        self.latency = Histogram(
            "stalwart_diagnosis_seconds",
            "Time to diagnose one evidence bundle.",
            ("kind",),
            registry=registry,
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
        )
        self.rejected = Counter(
            "stalwart_diagnosis_rejected_requests", "Requests refused, by HTTP status.", ("status",), registry=registry
        )
        self.incidents_served = Counter(
            "stalwart_diagnosis_incident_reads", "Incident reads, by outcome.", ("outcome",), registry=registry
        )
        self.requests = Histogram(
            "stalwart_diagnosis_http_request_duration_seconds",
            "HTTP requests answered, from arrival to the response, by method, route and status.",
            ("method", "route", "status"),
            registry=registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
        )
        self.in_flight = Gauge(
            "stalwart_diagnosis_bundles_in_flight", "Bundles being diagnosed or waiting.", ("state",), registry=registry
        )


@dataclass
class ServiceContext:
    store: Store | None
    limits: Limits
    metrics: ServiceMetrics
    admission: Admission
    pool: WorkerPool

    @classmethod
    def create(cls, store: Store | None, limits: Limits) -> ServiceContext:
        metrics = ServiceMetrics()
        admission = Admission(limits.max_concurrent, limits.max_queued, limits.queue_wait_seconds)
        metrics.in_flight.labels("working").set_function(lambda: admission.working)
        metrics.in_flight.labels("waiting").set_function(lambda: admission.waiting)
        return cls(store, limits, metrics, admission, WorkerPool(limits.max_concurrent, limits.worker_memory_bytes))


async def service_context(request: Request) -> ServiceContext:
    """Async: a route on the event loop (/healthz) must not wait for a thread to get it."""
    found: ServiceContext = request.app.state.service
    return found


Svc = Annotated[ServiceContext, Depends(service_context)]
