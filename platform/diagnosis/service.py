"""The diagnosis HTTP service: POST an evidence bundle, get a verdict; read incidents from etcd.

    STALWART_DIAGNOSIS_TOKEN=... python -m stalwart.diagnosis.service --host 127.0.0.1 --port 8470 \\
        --etcd 127.0.0.1:2379

Endpoints: POST /v1/diagnose, GET /v1/incidents/{job}/{id} (and /v1/incidents/{id}?job=), GET
/healthz, GET /metrics (Prometheus), OpenAPI at /openapi.json (docs at /docs).

Callers authenticate with `Authorization: Bearer <token>` (the token from STALWART_DIAGNOSIS_TOKEN
or --token-file; 401 without one, 403 with another), checked before the body is read; /healthz,
/metrics and the OpenAPI document are open and read-only. Bodies are bounded (32 MiB as sent, 413
beyond; gzip accepted, 256 MiB once inflated, refused as soon as it passes that). At most
--max-concurrent bundles are decoded and diagnosed at once, each in a worker process of its own
(so /healthz answers meanwhile), and --max-queued more wait; past that a request gets 503 with
Retry-After before its body is read. A bad payload gets a 400 (not JSON) or a 422 whose message
names the offending fields. docs/security.md has the whole picture.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import FastAPI, HTTPException, Query, Request, Security
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPBearer
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from starlette.requests import ClientDisconnect
from starlette.routing import Match

from stalwart.diagnosis.bundle_worker import diagnose_body
from stalwart.diagnosis.http_guard import BearerAuth, RequestTimer, Scope
from stalwart.diagnosis.models import EvidenceBundle, Verdict
from stalwart.diagnosis.problems import validation_problem
from stalwart.diagnosis.worker_pool import Admission, Busy, WorkerLost, WorkerPool
from stalwart.net import inherited_listener
from stalwart.store import keys
from stalwart.store.client import Store, StoreUnavailable
from stalwart.store.credentials import DIAGNOSIS_TOKEN_ENV, check_token
from stalwart.store.records import Incident

MIB = 1024 * 1024
MAX_BODY_BYTES = 32 * MIB
MAX_DECODED_BYTES = 256 * MIB
VERSION = "1"
OPEN_PATHS = ("/healthz", "/metrics", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc")
LOOPBACK = ("127.0.0.1", "::1", "localhost")


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


def _mib(n: int) -> str:
    return f"{n / MIB:g} MiB"


async def _read_body(request: Request, limits: Limits) -> bytes:
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():  # bounded: stops at the limit
        size += len(chunk)
        if size > limits.max_body_bytes:
            raise HTTPException(413, f"request body exceeds the limit of {_mib(limits.max_body_bytes)}")
        chunks.append(chunk)
    return b"".join(chunks)


def create_app(store: Store | None = None, *, token: str | None, limits: Limits | None = None) -> FastAPI:
    """The service; `store` (etcd) serves the incident endpoints, which answer 503 without one.
    `token` None serves everyone (`--no-auth`, for a loopback-only service)."""
    limits = limits or Limits()
    registry = CollectorRegistry(auto_describe=True)
    diagnoses = Counter(
        "stalwart_diagnosis_requests",
        "Verdicts returned, by evidence kind and failure class.",
        ("kind", "failure_class"),
        registry=registry,
    )
    latency = Histogram(
        "stalwart_diagnosis_seconds",
        "Time to diagnose one evidence bundle.",
        ("kind",),
        registry=registry,
        buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
    )
    rejected = Counter(
        "stalwart_diagnosis_rejected_requests", "Requests refused, by HTTP status.", ("status",), registry=registry
    )
    incidents_served = Counter(
        "stalwart_diagnosis_incident_reads", "Incident reads, by outcome.", ("outcome",), registry=registry
    )
    requests = Histogram(
        "stalwart_diagnosis_http_request_duration_seconds",
        "HTTP requests answered, from arrival to the response, by method, route and status.",
        ("method", "route", "status"),
        registry=registry,
        buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
    )
    in_flight = Gauge(
        "stalwart_diagnosis_bundles_in_flight", "Bundles being diagnosed or waiting.", ("state",), registry=registry
    )
    admission = Admission(limits.max_concurrent, limits.max_queued, limits.queue_wait_seconds)
    pool = WorkerPool(limits.max_concurrent, limits.worker_memory_bytes)
    in_flight.labels("working").set_function(lambda: admission.working)
    in_flight.labels("waiting").set_function(lambda: admission.waiting)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        warming = asyncio.create_task(pool.warm())
        try:
            yield
        finally:
            warming.cancel()
            pool.stop()

    app = FastAPI(
        title="Stalwart diagnosis",
        version=VERSION,
        description="Localizes faulty machines from stack traces, metrics and logs; serves incidents. "
        "Every endpoint but /healthz, /metrics and this document needs the service's bearer token.",
        lifespan=lifespan,
    )
    app.state.store = store
    bearer = HTTPBearer(auto_error=False, description="The service's token (STALWART_DIAGNOSIS_TOKEN).")

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        status, payload = validation_problem(exc.errors(), what="request")
        rejected.labels(str(status)).inc()
        return JSONResponse(payload, status_code=status)

    @app.exception_handler(HTTPException)
    async def _refused(_request: Request, exc: HTTPException) -> JSONResponse:
        if 400 <= exc.status_code < 500 or exc.status_code == 503:
            rejected.labels(str(exc.status_code)).inc()
        return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=exc.headers)

    auth: dict[int | str, dict[str, Any]] = {
        401: {"description": "no bearer token"},
        403: {"description": "a bearer token that is not the service's"},
    }
    diagnose_errors: dict[int | str, dict[str, Any]] = {
        **auth,
        400: {"description": "the body is not JSON (or not gzip)"},
        408: {"description": "the body did not arrive in time"},
        413: {"description": "the body is larger than the limit, as sent or once inflated"},
        415: {"description": "a Content-Type other than JSON, or a Content-Encoding other than gzip"},
        422: {"description": "not a valid evidence bundle; the message names the fields"},
        503: {"description": "every diagnosis worker is busy (see Retry-After), or one died"},
    }
    busy_headers = {"Retry-After": str(limits.retry_after_seconds)}

    @app.post(
        "/v1/diagnose",
        response_model=Verdict,
        summary="Diagnose one failure from its evidence",
        responses=diagnose_errors,
        dependencies=[Security(bearer)],
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/EvidenceBundle"}}},
            }
        },
    )
    async def post_diagnose(request: Request) -> Response:
        """Decoded, validated and diagnosed in a worker process; the event loop only moves bytes."""
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limits.max_body_bytes:
            raise HTTPException(
                413,
                f"request body is {int(declared)} bytes; the limit is {_mib(limits.max_body_bytes)} "
                "(send stack texts once in `texts`, or gzip the body)",
            )
        encoding = request.headers.get("content-encoding", "identity").strip().lower()
        if encoding not in ("identity", "", "gzip"):
            raise HTTPException(415, f"unsupported Content-Encoding {encoding[:40]!r}; use gzip or none")
        media = request.headers.get("content-type", "application/json").split(";")[0].strip().lower()
        if media != "application/json" and not media.endswith("+json"):
            raise HTTPException(415, f"unsupported Content-Type {media[:60]!r}; send application/json")
        try:
            async with admission.slot():
                try:
                    async with asyncio.timeout(limits.body_seconds):
                        body = await _read_body(request, limits)
                except TimeoutError:
                    raise HTTPException(408, f"the body did not arrive within {limits.body_seconds:g}s") from None
                except ClientDisconnect:
                    raise HTTPException(400, "the client went away before its body arrived") from None
                result = await pool.run(diagnose_body, body, encoding == "gzip", limits.max_decoded_bytes)
        except Busy as exc:
            raise HTTPException(503, f"busy: {exc}; retry later", headers=busy_headers) from None
        except WorkerLost as exc:
            raise HTTPException(503, str(exc), headers=busy_headers) from None
        if result.status == 200:
            latency.labels(result.kind).observe(result.seconds)
            diagnoses.labels(result.kind, result.failure_class).inc()
        else:
            rejected.labels(str(result.status)).inc()
        return Response(result.body, status_code=result.status, media_type="application/json")

    def _incident(job: str, incident_id: str) -> dict[str, Any]:
        if app.state.store is None:
            incidents_served.labels("no_store").inc()
            raise HTTPException(503, "this diagnosis service has no etcd store configured (start it with --etcd)")
        try:
            key = keys.incident(job, incident_id)
        except ValueError:
            incidents_served.labels("bad_request").inc()
            raise HTTPException(400, f"invalid job or incident id: {job[:64]!r}, {incident_id[:64]!r}") from None
        try:
            incident = app.state.store.get(key, Incident)
        except StoreUnavailable as exc:
            incidents_served.labels("store_unavailable").inc()
            raise HTTPException(503, f"etcd did not answer: {exc}") from None
        if incident is None:
            incidents_served.labels("not_found").inc()
            raise HTTPException(404, f"no incident {incident_id!r} for job {job!r}")
        incidents_served.labels("found").inc()
        return incident.model_dump(mode="json")

    incident_errors: dict[int | str, dict[str, Any]] = {
        **auth,
        400: {"description": "not a valid job or incident id"},
        404: {"description": "no such incident"},
        422: {"description": "a required parameter is missing"},
        503: {"description": "no etcd configured, or etcd did not answer"},
    }

    @app.get(
        "/v1/incidents/{job}/{incident_id}",
        summary="One incident of a job, as the controller recorded it",
        responses=incident_errors,
        dependencies=[Security(bearer)],
    )
    def get_incident(job: str, incident_id: str) -> dict[str, Any]:
        return _incident(job, incident_id)

    @app.get(
        "/v1/incidents/{incident_id}",
        summary="One incident (the job as a query parameter)",
        responses=incident_errors,
        dependencies=[Security(bearer)],
    )
    def get_incident_by_id(
        incident_id: str, job: str = Query(..., description="the job the incident belongs to")
    ) -> dict[str, Any]:
        return _incident(job, incident_id)

    @app.get("/healthz", summary="Liveness (open, read-only)")
    async def healthz() -> dict[str, str]:  # on the event loop itself: no thread to wait for
        return {"status": "ok", "store": "configured" if app.state.store is not None else "none"}

    @app.get("/metrics", summary="Prometheus metrics (open, read-only)", response_class=Response)
    def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    def openapi() -> dict[str, Any]:
        """FastAPI's document, plus the EvidenceBundle schema that /v1/diagnose's body refers to
        (the route reads the raw body: validation happens in a worker process)."""
        if app.openapi_schema is None:
            doc = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
            bundle = EvidenceBundle.model_json_schema(ref_template="#/components/schemas/{model}")
            schemas = doc.setdefault("components", {}).setdefault("schemas", {})
            schemas.update(bundle.pop("$defs", {}))
            schemas["EvidenceBundle"] = bundle
            app.openapi_schema = doc
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    app.add_middleware(
        BearerAuth, token=token, open_paths=OPEN_PATHS, on_reject=lambda status: rejected.labels(str(status)).inc()
    )

    def route_of(scope: Scope) -> str:
        for route in app.router.routes:
            if route.matches(scope)[0] is Match.FULL:
                return str(getattr(route, "path", "other"))
        return "other"

    app.add_middleware(  # added last: outermost
        RequestTimer,
        routes=route_of,
        observe=lambda method, route, status, seconds: requests.labels(method, route, status).observe(seconds),
    )
    return app


def read_token(args: argparse.Namespace) -> str | None:
    """The token from --token-file or STALWART_DIAGNOSIS_TOKEN; None only with --no-auth on loopback."""
    raw: str | None = None
    if args.token_file is not None:
        raw = Path(args.token_file).read_text()
    elif os.environ.get(DIAGNOSIS_TOKEN_ENV):
        raw = os.environ[DIAGNOSIS_TOKEN_ENV]
    if raw is not None:
        return check_token(raw, "the diagnosis service's token")
    if args.no_auth:
        if args.host not in LOOPBACK:
            raise ValueError(f"--no-auth serves anyone who can connect: only on loopback, not on {args.host}")
        return None
    raise ValueError(
        f"no token: set {DIAGNOSIS_TOKEN_ENV} or --token-file (a mounted Secret), or pass --no-auth on loopback"
    )


def _already_stopped(_signum: int, _frame: object) -> None:
    pass


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description="Stalwart's diagnosis service")
    parser.add_argument("--host", default="127.0.0.1", help="the address to listen on (not every interface)")
    parser.add_argument("--port", type=int, default=8470)
    parser.add_argument(
        "--listen-fd", type=int, default=None, help="serve on this inherited socket, already listening on --host"
    )
    parser.add_argument("--etcd", default=None, help="HOST:PORT of etcd, for the incident endpoints")
    parser.add_argument(
        "--token-file", default=None, help=f"a file holding the bearer token (else ${DIAGNOSIS_TOKEN_ENV})"
    )
    parser.add_argument("--no-auth", action="store_true", help="serve without a token (loopback only)")
    defaults = Limits()
    parser.add_argument(
        "--max-body-mib", type=float, default=defaults.max_body_bytes / MIB, help="largest body as sent"
    )
    parser.add_argument(
        "--max-decoded-mib", type=float, default=defaults.max_decoded_bytes / MIB, help="largest body after gunzip"
    )
    parser.add_argument(
        "--max-concurrent", type=int, default=defaults.max_concurrent, help="bundles diagnosed at once (workers)"
    )
    parser.add_argument("--max-queued", type=int, default=defaults.max_queued, help="bundles waiting for a worker")
    parser.add_argument(
        "--body-seconds", type=float, default=defaults.body_seconds, help="time a client has to send its body (408)"
    )
    parser.add_argument(
        "--worker-memory-mib",
        type=float,
        default=defaults.worker_memory_bytes / MIB,
        help="memory each worker may add (0: unlimited)",
    )
    parser.add_argument("--log-level", default="warning")
    args = parser.parse_args(argv)
    if args.max_concurrent < 1 or args.max_queued < 0:
        parser.error("--max-concurrent must be at least 1 and --max-queued at least 0")
    try:
        token = read_token(args)
        sockets = [inherited_listener(args.listen_fd)] if args.listen_fd is not None else None
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    store = Store(args.etcd) if args.etcd else None
    limits = Limits(
        max_body_bytes=int(args.max_body_mib * MIB),
        max_decoded_bytes=int(args.max_decoded_mib * MIB),
        max_concurrent=args.max_concurrent,
        max_queued=args.max_queued,
        body_seconds=args.body_seconds,
        worker_memory_bytes=int(args.worker_memory_mib * MIB),
    )
    app = create_app(store, token=token, limits=limits)
    config = uvicorn.Config(
        app, host=args.host, port=args.port, log_level=args.log_level, access_log=False, timeout_graceful_shutdown=5
    )
    server = uvicorn.Server(config)  # handles SIGTERM and SIGINT: stops accepting, finishes requests, exits
    # After its graceful shutdown uvicorn re-raises the signal under the handlers it found: let those be
    # no-ops, so that a service stopped by SIGTERM exits 0 (it did stop cleanly), not -15.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _already_stopped)
    try:
        server.run(sockets=sockets)
    finally:
        if store is not None:
            store.close()
        logging.shutdown()


if __name__ == "__main__":
    main()
