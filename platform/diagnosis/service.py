"""The diagnosis HTTP service: POST an evidence bundle, get a verdict; read incidents from etcd.

    python -m stalwart.diagnosis.service --host 127.0.0.1 --port 8470 --etcd 127.0.0.1:2379

Endpoints: POST /v1/diagnose, GET /v1/incidents/{job}/{id} (and /v1/incidents/{id}?job=), GET
/healthz, GET /metrics (Prometheus), OpenAPI at /openapi.json (docs at /docs). Request bodies are
limited in size (32 MiB by default, 413 beyond it) and may be gzip-compressed (Content-Encoding:
gzip; the limit then applies to the compressed body, and the decompressed one has its own, larger
limit): 16,384 ranks' stack dumps compress about 50 times. A bad payload gets a 400 (not JSON) or a
422 whose message names the offending fields. The diagnosis itself runs in a worker thread.
"""

from __future__ import annotations

import argparse
import logging
import signal
import time
import zlib
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from fastapi import FastAPI, HTTPException, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from starlette.routing import Match

from stalwart.diagnosis.engine import diagnose, resolve_kind
from stalwart.diagnosis.models import EvidenceBundle, Verdict
from stalwart.store import keys
from stalwart.store.client import Store, StoreUnavailable
from stalwart.store.records import Incident

MAX_BODY_BYTES = 32 * 1024 * 1024
MAX_DECODED_BYTES = 256 * 1024 * 1024
VERSION = "1"

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class BodyLimit:
    """ASGI middleware: read the whole request body up to a limit (413 past it), gunzip it when it
    says Content-Encoding: gzip (bounded too), and hand the app the plain body."""

    def __init__(self, app: ASGIApp, max_bytes: int, max_decoded: int, on_reject: Callable[[int], None]) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.max_decoded = max_decoded
        self.on_reject = on_reject

    async def _error(self, send: Send, status: int, message: str) -> None:
        self.on_reject(status)
        body = JSONResponse({"detail": message}, status_code=status).body
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in ("POST", "PUT", "PATCH"):
            await self.app(scope, receive, send)
            return
        headers = {k.lower(): v for k, v in scope["headers"]}
        limit_mib = self.max_bytes / (1024 * 1024)
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._error(
                send,
                413,
                f"request body is {int(declared)} bytes; the limit is {limit_mib:g} MiB "
                "(send stack texts once in `texts`, or gzip the body)",
            )
            return
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:  # bounded: stops at the limit
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._error(send, 413, f"request body exceeds the limit of {limit_mib:g} MiB")
                return
            chunks.append(chunk)
            more = bool(message.get("more_body"))
        body = b"".join(chunks)
        encoding = headers.get(b"content-encoding", b"identity").strip().lower()
        if encoding == b"gzip":
            try:
                inflater = zlib.decompressobj(wbits=31)
                body = inflater.decompress(body, self.max_decoded + 1)
            except zlib.error as exc:
                await self._error(send, 400, f"request body is not valid gzip: {exc}")
                return
            if len(body) > self.max_decoded or inflater.unconsumed_tail:
                limit = self.max_decoded / (1024 * 1024)
                await self._error(send, 413, f"decompressed request body exceeds {limit:g} MiB")
                return
        elif encoding not in (b"identity", b""):
            await self._error(
                send, 415, f"unsupported Content-Encoding {encoding.decode(errors='replace')!r}; use gzip or none"
            )
            return
        new_headers = [(k, v) for k, v in scope["headers"] if k.lower() not in (b"content-length", b"content-encoding")]
        new_headers.append((b"content-length", str(len(body)).encode()))
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if sent:
                return await receive()
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app({**scope, "headers": new_headers}, replay, send)


class RequestTimer:
    """ASGI middleware, outermost: every request's duration by method, route template and status
    (refusals by the body limit included). Unknown paths share one route label: no cardinality blow-up."""

    def __init__(self, app: ASGIApp, routes: Callable[[Scope], str], observe: Callable[[str, str, str, float], None]):
        self.app = app
        self.routes = routes
        self.observe = observe

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        status = "500"

        async def send_and_note(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = str(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        finally:
            self.observe(scope["method"], self.routes(scope), status, time.perf_counter() - t0)


def _field(loc: tuple[Any, ...] | list[Any]) -> str:
    parts = [str(p) for p in loc if p != "body"]
    return ".".join(parts) or "body"


def create_app(
    store: Store | None = None, *, max_body_bytes: int = MAX_BODY_BYTES, max_decoded_bytes: int = MAX_DECODED_BYTES
) -> FastAPI:
    """The service; `store` (etcd) serves the incident endpoints, which answer 503 without one."""
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

    app = FastAPI(
        title="Stalwart diagnosis",
        version=VERSION,
        description="Localizes faulty machines from stack traces, metrics and logs; serves incidents.",
    )
    app.state.store = store

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        if any(e.get("type") == "json_invalid" for e in errors):
            rejected.labels("400").inc()
            where = next((e.get("ctx", {}).get("error", "") for e in errors if e.get("type") == "json_invalid"), "")
            return JSONResponse({"detail": f"request body is not valid JSON: {where}".rstrip(": ")}, status_code=400)
        rejected.labels("422").inc()
        parts = [f"{_field(e.get('loc', ()))}: {e.get('msg', 'invalid')}" for e in errors[:10]]
        more = f" (and {len(errors) - 10} more)" if len(errors) > 10 else ""
        return JSONResponse(
            {
                "detail": "invalid evidence bundle: " + "; ".join(parts) + more,
                "errors": [
                    {
                        "loc": [str(x) for x in e.get("loc", ())],
                        "msg": str(e.get("msg", "")),
                        "type": str(e.get("type", "")),
                    }
                    for e in errors[:50]
                ],
            },
            status_code=422,
        )

    errors: dict[int | str, dict[str, Any]] = {
        400: {"description": "the body is not JSON (or not gzip)"},
        413: {"description": "the body is larger than the limit"},
        415: {"description": "a Content-Encoding other than gzip"},
        422: {"description": "not a valid evidence bundle; the message names the fields"},
    }

    @app.post(
        "/v1/diagnose", response_model=Verdict, summary="Diagnose one failure from its evidence", responses=errors
    )
    def post_diagnose(bundle: EvidenceBundle) -> Verdict:
        kind = resolve_kind(bundle)
        t0 = time.perf_counter()
        verdict = diagnose(bundle)
        latency.labels(kind).observe(time.perf_counter() - t0)
        diagnoses.labels(kind, verdict.failure_class).inc()
        return verdict

    def _incident(job: str, incident_id: str) -> dict[str, Any]:
        if app.state.store is None:
            incidents_served.labels("no_store").inc()
            raise HTTPException(503, "this diagnosis service has no etcd store configured (start it with --etcd)")
        try:
            key = keys.incident(job, incident_id)
        except ValueError as exc:
            incidents_served.labels("bad_request").inc()
            raise HTTPException(400, f"invalid job or incident id: {exc}") from None
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

    @app.get("/v1/incidents/{job}/{incident_id}", summary="One incident of a job, as the controller recorded it")
    def get_incident(job: str, incident_id: str) -> dict[str, Any]:
        return _incident(job, incident_id)

    @app.get("/v1/incidents/{incident_id}", summary="One incident (the job as a query parameter)")
    def get_incident_by_id(
        incident_id: str, job: str = Query(..., description="the job the incident belongs to")
    ) -> dict[str, Any]:
        return _incident(job, incident_id)

    @app.get("/healthz", summary="Liveness")
    def healthz() -> dict[str, str]:
        return {"status": "ok", "store": "configured" if app.state.store is not None else "none"}

    @app.get("/metrics", summary="Prometheus metrics", response_class=Response)
    def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    app.add_middleware(
        BodyLimit,
        max_bytes=max_body_bytes,
        max_decoded=max_decoded_bytes,
        on_reject=lambda status: rejected.labels(str(status)).inc(),
    )

    def route_of(scope: Scope) -> str:
        for route in app.router.routes:
            if route.matches(scope)[0] is Match.FULL:
                return str(getattr(route, "path", "other"))
        return "other"

    app.add_middleware(
        RequestTimer,
        routes=route_of,
        observe=lambda method, route, status, seconds: requests.labels(method, route, status).observe(seconds),
    )
    return app


def _already_stopped(_signum: int, _frame: object) -> None:
    pass


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description="Stalwart's diagnosis service")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8470)
    parser.add_argument("--etcd", default=None, help="HOST:PORT of etcd, for the incident endpoints")
    parser.add_argument(
        "--max-body-mib",
        type=float,
        default=MAX_BODY_BYTES / (1024 * 1024),
        help="largest request body, as sent (compressed or not)",
    )
    parser.add_argument(
        "--max-decoded-mib",
        type=float,
        default=MAX_DECODED_BYTES / (1024 * 1024),
        help="largest request body after gunzip",
    )
    parser.add_argument("--log-level", default="warning")
    args = parser.parse_args(argv)
    store = Store(args.etcd) if args.etcd else None
    app = create_app(
        store,
        max_body_bytes=int(args.max_body_mib * 1024 * 1024),
        max_decoded_bytes=int(args.max_decoded_mib * 1024 * 1024),
    )
    config = uvicorn.Config(
        app, host=args.host, port=args.port, log_level=args.log_level, access_log=False, timeout_graceful_shutdown=5
    )
    server = uvicorn.Server(config)  # handles SIGTERM and SIGINT: stops accepting, finishes requests, exits
    # After its graceful shutdown uvicorn re-raises the signal under the handlers it found: let those be
    # no-ops, so that a service stopped by SIGTERM exits 0 (it did stop cleanly), not -15.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _already_stopped)
    try:
        server.run()
    finally:
        if store is not None:
            store.close()
        logging.shutdown()


if __name__ == "__main__":
    main()
