"""The console's app: its routers by area, assembled (FastAPI, Jinja2 templates, htmx for the parts that
follow a job).

Every page is a GET that reads etcd; every change is a POST from an operator with a CSRF token. A
page asked for by htmx (the `HX-Request` header) gets only its live part, re-rendered. Errors are
pages with a status and one sentence: an unknown job, node or rank is a 404, a malformed form a 400,
a viewer's action a 403, etcd unreachable a 503; a bug is a 500 whose details stay in the log.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response
from fastapi.staticfiles import StaticFiles
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.routing import Mount

from stalwart.console import (
    routes_actions,
    routes_incidents,
    routes_jobs,
    routes_nodes_now,
    routes_service,
    routes_signin,
)
from stalwart.console.access import Gate
from stalwart.console.context import ConsoleConfig, ConsoleContext
from stalwart.console.error_pages import install_error_pages
from stalwart.console.history import History
from stalwart.console.rendering import HERE, Pages
from stalwart.diagnosis.http_guard import RequestTimer, route_label
from stalwart.store.client import Store

__all__ = ["ConsoleConfig", "create_app"]

SECURITY_HEADERS = {
    # Nothing but this console: no CDN, no other host, no inline script or style.
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; font-src 'self'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}
ROUTERS = (
    routes_service.router,  # /healthz, /metrics: open
    routes_jobs.router,  # the jobs list and one job's page
    routes_incidents.router,  # incidents and runbooks
    routes_nodes_now.router,  # logs and stacks asked of the nodes now
    routes_actions.router,  # confirm, then act (audited)
    routes_signin.router,  # token sign-in, sign-out
)


def create_app(
    store: Store, gate: Gate, history: History | None = None, config: ConsoleConfig | None = None
) -> FastAPI:
    config = config or ConsoleConfig()
    pages = Pages(gate, config.refresh_seconds)
    ctx = ConsoleContext(store=store, gate=gate, history=history, config=config, pages=pages)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        if history is not None:
            history.start()
        try:
            yield
        finally:
            if history is not None:
                history.stop()

    app = FastAPI(title="Stalwart console", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    app.state.gate = gate
    app.state.console = ctx
    app.mount("/static", StaticFiles(directory=str(HERE / "static")), name="static")
    if config.allowed_hosts != ["*"]:
        app.add_middleware(TrustedHostMiddleware, allowed_hosts=config.allowed_hosts)

    @app.middleware("http")
    async def security_headers(request: Request, call_next: Any) -> Response:
        response: Response = await call_next(request)
        for name, value in SECURITY_HEADERS.items():
            if name == "Cache-Control" and request.url.path.startswith("/static/"):
                continue
            response.headers.setdefault(name, value)
        return response

    install_error_pages(app, pages)
    for router in ROUTERS:
        app.include_router(router)

    mounts = [route for route in app.router.routes if isinstance(route, Mount)]  # /static
    app.add_middleware(
        RequestTimer,
        routes=route_label([*mounts, *(route for router in ROUTERS for route in router.routes)]),
        observe=lambda method, route, status, seconds: ctx.metrics.http_seconds.labels(method, route, status).observe(
            seconds
        ),
    )
    return app
