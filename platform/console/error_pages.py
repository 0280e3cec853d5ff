"""Errors as pages with a status and one sentence: an unknown job, node or rank is a 404, a malformed
form a 400, a viewer's action a 403, an action that does not apply now a 409, etcd unreachable a 503;
a bug is a 500 whose details stay in the log."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from stalwart.console.access import AccessError
from stalwart.console.actions import BadForm, Conflict
from stalwart.console.rendering import Pages
from stalwart.logs import get_logger
from stalwart.ops.errors import NotFound, OpsError
from stalwart.store.client import StoreUnavailable

log = get_logger("stalwart.console")


def install_error_pages(app: FastAPI, pages: Pages) -> None:
    @app.exception_handler(AccessError)
    async def on_access(request: Request, exc: AccessError) -> Response:
        title = "Sign in" if exc.status == 401 else "Not allowed"
        return pages.error(request, exc.status, title, str(exc))

    def plain(status: int, title: str) -> Callable[[Request, Exception], Awaitable[Response]]:
        async def handler(request: Request, exc: Exception) -> Response:
            return pages.error(request, status, title, str(exc))

        return handler

    @app.exception_handler(RequestValidationError)
    async def on_invalid(request: Request, exc: RequestValidationError) -> Response:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e.get('loc', ())[1:]) or 'request'}: {e.get('msg', 'invalid')}"
            for e in exc.errors()[:5]
        )
        return pages.error(request, 400, "Bad request", f"malformed request: {problems}")

    @app.exception_handler(StarletteHTTPException)
    async def on_http(request: Request, exc: StarletteHTTPException) -> Response:
        title = "Not found" if exc.status_code == 404 else "Error"
        detail = "no such page" if exc.status_code == 404 else str(exc.detail)
        return pages.error(request, exc.status_code, title, detail)

    @app.exception_handler(StoreUnavailable)
    async def on_store(request: Request, exc: StoreUnavailable) -> Response:
        log.warning("etcd unavailable", fields={"error": str(exc), "path": request.url.path})
        return pages.error(request, 503, "etcd unavailable", "the job store did not answer; retry in a moment")

    @app.exception_handler(Exception)
    async def on_bug(request: Request, exc: Exception) -> Response:
        log.error("console error", exc_info=exc, fields={"path": request.url.path})
        return pages.error(request, 500, "Console error", f"unexpected {type(exc).__name__}; the console's log has it")

    # NotFound before OpsError: the handler of the closest class in the exception's MRO answers.
    for error, status, title in (
        (NotFound, 404, "Not found"),
        (Conflict, 409, "Cannot do that now"),
        (BadForm, 400, "Bad request"),
        (OpsError, 400, "Bad request"),
    ):
        app.add_exception_handler(error, plain(status, title))
