"""The diagnosis HTTP service: POST an evidence bundle, get a verdict; read incidents from etcd.
create_app assembles the routers (routes_diagnose, routes_incidents, routes_open) behind the guards.

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
from pathlib import Path
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse

from stalwart.diagnosis import routes_diagnose, routes_incidents, routes_open
from stalwart.diagnosis.http_guard import BearerAuth, RequestTimer, route_label
from stalwart.diagnosis.models import EvidenceBundle
from stalwart.diagnosis.problems import validation_problem
from stalwart.diagnosis.service_context import MIB, Limits, ServiceContext
from stalwart.net import inherited_listener
from stalwart.store.client import Store
from stalwart.store.credentials import DIAGNOSIS_TOKEN_ENV, check_token

__all__ = ["MIB", "Limits", "create_app", "main", "read_token"]

VERSION = "1"
OPEN_PATHS = ("/healthz", "/metrics", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc")
LOOPBACK = ("127.0.0.1", "::1", "localhost")


def create_app(store: Store | None = None, *, token: str | None, limits: Limits | None = None) -> FastAPI:
    """The service; `store` (etcd) serves the incident endpoints, which answer 503 without one.
    `token` None serves everyone (`--no-auth`, for a loopback-only service)."""
    svc = ServiceContext.create(store, limits or Limits())
    rejected = svc.metrics.rejected

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        warming = asyncio.create_task(svc.pool.warm())
        try:
            yield
        finally:
            warming.cancel()
            svc.pool.stop()

    app = FastAPI(
        title="Stalwart diagnosis",
        version=VERSION,
        description="Localizes faulty machines from stack traces, metrics and logs; serves incidents. "
        "Every endpoint but /healthz, /metrics and this document needs the service's bearer token.",
        lifespan=lifespan,
    )
    app.state.service = svc

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

    routers = (routes_diagnose.router, routes_incidents.router, routes_open.router)
    for router in routers:
        app.include_router(router)

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
    app.add_middleware(  # added last: outermost
        RequestTimer,
        routes=route_label([route for router in routers for route in router.routes]),
        observe=lambda method, route, status, seconds: svc.metrics.requests.labels(method, route, status).observe(
            seconds
        ),
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
