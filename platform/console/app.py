"""The console's pages and actions (FastAPI, Jinja2 templates, htmx for the parts that follow a job).

Every page is a GET that reads etcd; every change is a POST from an operator with a CSRF token. A
page asked for by htmx (the `HX-Request` header) gets only its live part, re-rendered. Errors are
pages with a status and one sentence: an unknown job, node or rank is a 404, a malformed form a 400,
a viewer's action a 403, etcd unreachable a 503; a bug is a 500 whose details stay in the log.
"""

from __future__ import annotations

import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Form, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from markupsafe import Markup
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.routing import Match
from starlette.types import Scope

from stalwart.console import charts
from stalwart.console.access import SESSION_COOKIE, SESSION_SECONDS, AccessError, Gate, Identity, same_origin
from stalwart.console.actions import CONSEQUENCES, Action, BadForm, Conflict, perform
from stalwart.console.history import History
from stalwart.console.runbook_html import runbook_html
from stalwart.console.views import JobView, job_view, jobs_view
from stalwart.diagnosis.service import RequestTimer
from stalwart.logs import get_logger
from stalwart.ops.errors import NotFound, OpsError
from stalwart.ops.incidents import incident_row, read_incidents
from stalwart.ops.logs import log_nodes, read_logs
from stalwart.ops.lookup import find_incident, job_states, require_state
from stalwart.ops.readable import duration, nodes_of, num, percent, rank_ranges
from stalwart.ops.stacks import stacks_now
from stalwart.runbooks import runbook_for_incident
from stalwart.store import keys
from stalwart.store.client import Store, StoreUnavailable
from stalwart.store.records import Assignment, Incident

log = get_logger("stalwart.console")

HERE = Path(__file__).parent
HTMX = HERE / "static" / "vendor" / "htmx.min.js"
LOG_CACHE_SECONDS = 1.5
STACKS_CACHE_SECONDS = 10.0
LOG_LINES = 200
STOP_POLLING = 286  # htmx's status for "stop polling"

SECURITY_HEADERS = {
    # Nothing but this console: no CDN, no other host, no inline script or style.
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; font-src 'self'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


class ConsoleConfig(BaseModel):
    refresh_seconds: float = 2.0
    allowed_hosts: list[str] = ["*"]
    secure_cookies: bool = False  # set behind HTTPS


class _Cache:
    """Answers that cost the agents work (log tails, stacks), shared by every viewer for a moment."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._locks: dict[Any, threading.Lock] = {}
        self._values: dict[Any, tuple[float, Any]] = {}

    def get(self, key: Any, max_age: float, make: Callable[[], Any]) -> Any:
        with self._lock:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:  # one capture per key at a time; the others wait for it and share it
            hit = self._values.get(key)
            if hit is not None and time.monotonic() - hit[0] < max_age:
                return hit[1]
            value = make()
            self._values[key] = (time.monotonic(), value)
            if len(self._values) > 256:
                self._values.pop(next(iter(self._values)))
            return value


def _clock(t: float | None) -> Markup:
    """A <time> the browser rewrites in the viewer's time zone (console.js); UTC until it does."""
    if t is None:
        return Markup("-")
    iso = datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    shown = datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return Markup(f'<time datetime="{iso}">{shown}</time>')


def _bytes(n: int | None) -> str:
    if n is None:
        return "-"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def _headers(request: Request) -> dict[str, str]:
    return {k.lower(): v for k, v in request.headers.items()}


def identity(request: Request) -> Identity:
    """Who is asking (AccessError when nobody is identified); kept on the request for the page."""
    gate: Gate = request.app.state.gate
    who = gate.identify(_headers(request), dict(request.cookies), request.client.host if request.client else None)
    request.state.identity = who
    return who


Who = Annotated[Identity, Depends(identity)]


def operator(request: Request, who: Who, csrf: Annotated[str | None, Form()] = None) -> Identity:
    """An operator, in a request that a page of another site could not have made."""
    gate: Gate = request.app.state.gate
    if not who.can_act:
        raise AccessError(403, f"{who.user} may view but not act: ask for the operator role")
    if who.via != "token":  # a browser never adds the Authorization header by itself: no CSRF possible
        if not same_origin(_headers(request), request.headers.get("host", "")):
            raise AccessError(403, "cross-site request refused")
        gate.check_csrf(who, csrf)
    return who


Operator = Annotated[Identity, Depends(operator)]


def create_app(
    store: Store, gate: Gate, history: History | None = None, config: ConsoleConfig | None = None
) -> FastAPI:
    config = config or ConsoleConfig()
    templates = Jinja2Templates(directory=str(HERE / "templates"))
    env = templates.env
    env.globals.update(
        clock=_clock,
        duration=duration,
        num=num,
        percent=percent,
        size=_bytes,
        rank_ranges=rank_ranges,
        nodes_of=nodes_of,
        refresh=config.refresh_seconds,
        htmx_installed=HTMX.exists(),
        line_chart=charts.line_chart,
        timeline_svg=charts.timeline_svg,
        runbook_html=runbook_html,
        consequences=CONSEQUENCES,
    )
    cache = _Cache()
    registry = CollectorRegistry(auto_describe=True)
    http_seconds = Histogram(
        "stalwart_console_http_request_duration_seconds",
        "HTTP requests answered, from arrival to the response, by method, route and status.",
        ("method", "route", "status"),
        registry=registry,
        buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
    )
    actions_taken = Counter(
        "stalwart_console_actions",
        "Actions taken from the console (each audited), by action.",
        ("action",),
        registry=registry,
    )

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

    def page(request: Request, name: str, context: dict[str, Any], status: int = 200) -> HTMLResponse:
        who: Identity | None = getattr(request.state, "identity", None)
        fragment = request.headers.get("hx-request") == "true"
        live = context.get("live", getattr(context.get("view"), "live", None))
        if fragment and live is False and status == 200:
            status = STOP_POLLING  # the job finished: htmx swaps this last fragment in and stops asking
        base = {
            "request": request,
            "who": who,
            "csrf": gate.csrf_token(who) if who else "",
            "fragment": fragment,
            "root": request.scope.get("root_path", ""),
        }
        response = templates.TemplateResponse(request, name, {**base, **context}, status_code=status)
        response.headers["Vary"] = "HX-Request"  # a fragment must never be cached as the page
        return response

    # -- errors as pages ------------------------------------------------------------------------
    def error_page(request: Request, status: int, title: str, message: str) -> Response:
        if request.headers.get("hx-request") == "true":  # a live part: say it in place, keep the page
            return HTMLResponse(f'<p class="error">{Markup.escape(message)}</p>', status_code=status)
        return page(request, "error.html", {"status": status, "title": title, "message": message}, status=status)

    @app.exception_handler(AccessError)
    async def on_access(request: Request, exc: AccessError) -> Response:
        title = "Sign in" if exc.status == 401 else "Not allowed"
        return error_page(request, exc.status, title, str(exc))

    def plain(status: int, title: str) -> Callable[[Request, Exception], Any]:
        async def handler(request: Request, exc: Exception) -> Response:
            return error_page(request, status, title, str(exc))

        return handler

    # NotFound before OpsError: the handler of the closest class in the exception's MRO answers.
    for error, status, title in (
        (NotFound, 404, "Not found"),
        (Conflict, 409, "Cannot do that now"),
        (BadForm, 400, "Bad request"),
        (OpsError, 400, "Bad request"),
    ):
        app.add_exception_handler(error, plain(status, title))

    @app.exception_handler(RequestValidationError)
    async def on_invalid(request: Request, exc: RequestValidationError) -> Response:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e.get('loc', ())[1:]) or 'request'}: {e.get('msg', 'invalid')}"
            for e in exc.errors()[:5]
        )
        return error_page(request, 400, "Bad request", f"malformed request: {problems}")

    @app.exception_handler(StarletteHTTPException)
    async def on_http(request: Request, exc: StarletteHTTPException) -> Response:
        title = "Not found" if exc.status_code == 404 else "Error"
        detail = "no such page" if exc.status_code == 404 else str(exc.detail)
        return error_page(request, exc.status_code, title, detail)

    @app.exception_handler(StoreUnavailable)
    async def on_store(request: Request, exc: StoreUnavailable) -> Response:
        log.warning("etcd unavailable", fields={"error": str(exc), "path": request.url.path})
        return error_page(request, 503, "etcd unavailable", "the job store did not answer; retry in a moment")

    @app.exception_handler(Exception)
    async def on_bug(request: Request, exc: Exception) -> Response:
        log.error("console error", exc_info=exc, fields={"path": request.url.path})
        return error_page(request, 500, "Console error", f"unexpected {type(exc).__name__}; the console's log has it")

    # -- pages ------------------------------------------------------------------------------------
    @app.get("/healthz", include_in_schema=False)
    def healthz() -> PlainTextResponse:
        return PlainTextResponse("ok")

    @app.get("/metrics", include_in_schema=False)
    def metrics() -> Response:
        """For Prometheus, without sign-in (as /healthz): counts only, no job's data."""
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/")
    def root(request: Request) -> RedirectResponse:
        return RedirectResponse(f"{request.scope.get('root_path', '')}/jobs", status_code=303)

    @app.get("/jobs")
    def jobs(
        request: Request,
        who: Who,
        phase: Annotated[str | None, Query(max_length=32)] = None,
        namespace: Annotated[str | None, Query(max_length=63)] = None,
    ) -> HTMLResponse:
        return page(request, "jobs.html", {"view": jobs_view(store, phase or None, namespace or None)})

    @app.get("/jobs/{job}")
    def job(
        request: Request,
        who: Who,
        job: str,
        tp: Annotated[str | None, Query(max_length=5)] = None,
        pp: Annotated[str | None, Query(max_length=5)] = None,
        group: Annotated[str, Query(pattern="^(tp|cp|ep|pp|dp|none)$")] = "none",
    ) -> HTMLResponse:
        # Empty (the form's boxes left blank): the job's own layout, from its spec.
        tp_size, pp_size = _size("tp", tp), _size("pp", pp)
        view: JobView = job_view(store, job, tp_size, pp_size)
        series = history.series(job) if history else []

        def points(attr: str) -> list[tuple[float, float]]:
            return [(s.at, float(v)) for s in series if (v := getattr(s, attr)) is not None]

        return page(
            request,
            "job.html",
            {
                "job": job,
                "view": view,
                "series": series,
                "history": history,
                "charts": [
                    ("loss", points("loss"), False),
                    ("throughput (tokens/s)", points("tokens_per_second"), False),
                    ("ETTR", points("ettr"), True),
                ],
                "tp": tp_size,
                "pp": pp_size,
                "group": group,
                "recent": [incident_row(i) for i in read_incidents(store, job)[-5:]][::-1],
            },
        )

    @app.get("/incidents")
    def incidents(
        request: Request,
        who: Who,
        job: Annotated[str | None, Query(max_length=253)] = None,
        limit: Annotated[int, Query(ge=1, le=500)] = 50,
    ) -> HTMLResponse:
        found = read_incidents(store, job or None)[-limit:][::-1]
        states = [require_state(store, job)] if job else job_states(store)
        return page(
            request,
            "incidents.html",
            {
                "incidents": found,
                "job": job,
                "live": any(not s.phase.terminal for s in states),  # a new incident may come
                "runbook_of": runbook_for_incident,
                "row_of": incident_row,
                "bounds": _bounds(found),
            },
        )

    @app.get("/jobs/{job}/incidents")
    def job_incidents(request: Request, job: str) -> RedirectResponse:
        return RedirectResponse(f"{request.scope.get('root_path', '')}/incidents?job={job}", status_code=303)

    @app.get("/jobs/{job}/incidents/{incident_id}")
    def incident(request: Request, who: Who, job: str, incident_id: str) -> HTMLResponse:
        require_state(store, job)
        found = find_incident(store, incident_id, job)
        return page(
            request,
            "incident.html",
            {"inc": found, "runbook": runbook_for_incident(found), "row": incident_row(found)},
        )

    @app.get("/runbooks/{name}")
    def runbook(request: Request, who: Who, name: str) -> HTMLResponse:
        found = runbook_html(name, request.scope.get("root_path", ""))
        if found is None:
            raise NotFound(f"no runbook {name!r}")
        return page(request, "runbook.html", {"book": found[0], "html": found[1]})

    @app.get("/jobs/{job}/logs")
    def logs(
        request: Request,
        who: Who,
        job: str,
        rank: Annotated[int, Query(ge=0, le=1_000_000)] = 0,
        lines: Annotated[int, Query(ge=1, le=2000)] = LOG_LINES,
    ) -> HTMLResponse:
        state = require_state(store, job)
        output: Any = None
        notes: list[str] = []
        problem: str | None = None
        if state.phase.terminal:
            problem = (
                f"job {job} finished ({state.phase.value}): its agents have exited, so no node can send its "
                "workers' output any more; it is in the run's folder (stalwart run) or the pods' logs"
            )
        else:
            try:
                log_nodes(store, job, rank)  # an unknown rank is a 404 before anything is asked
            except NotFound:
                raise
            except OpsError as exc:  # between generations: no node to ask now, the page says so
                problem = str(exc)

            def fetch() -> tuple[Any, list[str], str | None]:
                said: list[str] = []
                try:
                    return read_logs(store, job, rank, lines, timeout=5.0, on_note=said.append), said, None
                except NotFound:
                    raise
                except OpsError as exc:
                    return None, said, str(exc)

            if problem is None:
                output, notes, problem = cache.get(("logs", job, rank, lines), LOG_CACHE_SECONDS, fetch)
        assignment = store.get(keys.generation(job, state.generation), Assignment) if state.generation else None
        world = sorted(assignment.rank_nodes()) if assignment else []
        return page(
            request,
            "logs.html",
            {
                "job": job,
                "state": state,
                "rank": rank,
                "lines": lines,
                "output": output,
                "notes": notes,
                "problem": problem,
                "ranks": world,
                "live": not state.phase.terminal,
            },
        )

    @app.get("/jobs/{job}/stacks")
    def stacks(
        request: Request,
        who: Who,
        job: str,
        capture: Annotated[bool, Query()] = False,
        tp: Annotated[str | None, Query(max_length=5)] = None,
        pp: Annotated[str | None, Query(max_length=5)] = None,
    ) -> HTMLResponse:
        state = require_state(store, job)
        tp_size, pp_size = _size("tp", tp), _size("pp", pp)  # blank: the job's own layout
        result = None
        if capture:
            if state.phase.terminal:
                raise Conflict(f"job {job} finished ({state.phase.value}): it has no workers to capture")
            result = cache.get(
                ("stacks", job, tp_size, pp_size),
                STACKS_CACHE_SECONDS,
                lambda: stacks_now(store, job, tp_size, pp_size),
            )
        return page(
            request, "stacks.html", {"job": job, "state": state, "result": result, "tp": tp_size, "pp": pp_size}
        )

    # -- actions ----------------------------------------------------------------------------------
    @app.get("/jobs/{job}/actions/{action}")
    def confirm(request: Request, who: Who, job: str, action: Action, node: str | None = None) -> HTMLResponse:
        from stalwart.console.actions import check_target

        if not who.can_act:
            raise AccessError(403, f"{who.user} may view but not act: ask for the operator role")
        state = check_target(store, job, action, node or None)
        return page(request, "confirm.html", {"job": job, "action": action, "node": node or None, "state": state})

    @app.post("/jobs/{job}/actions/{action}")
    def act(
        request: Request,
        who: Operator,
        job: str,
        action: Action,
        reason: Annotated[str, Form(max_length=2000)],
        node: Annotated[str | None, Form(max_length=253)] = None,
    ) -> RedirectResponse:
        entry = perform(store, job, action, node or None, reason, who)
        actions_taken.labels(action.value).inc()
        root = request.scope.get("root_path", "")
        return RedirectResponse(f"{root}/jobs/{job}?done={entry.id}#audit", status_code=303)

    # -- signing in with a token -------------------------------------------------------------------
    @app.get("/login")
    def login_form(request: Request) -> HTMLResponse:
        return page(request, "login.html", {"failed": False})

    @app.post("/login")
    def login(request: Request, token: Annotated[str, Form(max_length=4096)]) -> Response:
        if not same_origin(_headers(request), request.headers.get("host", "")):
            raise AccessError(403, "cross-site request refused")
        holder = gate.token_holder(token)
        if holder is None:
            return page(request, "login.html", {"failed": True}, status=401)
        response = RedirectResponse(f"{request.scope.get('root_path', '')}/jobs", status_code=303)
        response.set_cookie(
            SESSION_COOKIE,
            gate.session_for(holder),
            max_age=SESSION_SECONDS,
            httponly=True,
            samesite="strict",
            secure=config.secure_cookies,
            path="/",
        )
        return response

    @app.post("/logout")
    def logout(request: Request, who: Who, csrf: Annotated[str | None, Form()] = None) -> Response:
        gate.check_csrf(who, csrf)
        response = RedirectResponse(f"{request.scope.get('root_path', '')}/login", status_code=303)
        response.delete_cookie(SESSION_COOKIE, path="/")
        return response

    def route_of(scope: Scope) -> str:
        for route in app.router.routes:
            if route.matches(scope)[0] is Match.FULL:
                return str(getattr(route, "path", "other"))
        return "other"  # unknown paths share one label

    app.add_middleware(
        RequestTimer,
        routes=route_of,
        observe=lambda method, route, status, seconds: http_seconds.labels(method, route, status).observe(seconds),
    )
    return app


def _size(name: str, given: str | None) -> int | None:
    """A parallel size from the page's query: blank is none given; otherwise 1..65536."""
    if given is None or not given.strip():
        return None
    if not given.strip().isdigit() or not 1 <= int(given) <= 65536:
        raise BadForm(f"{name}: a whole number from 1 to 65536, or blank for the job's own layout")
    return int(given)


def _bounds(incidents: list[Incident]) -> tuple[float, float]:
    if not incidents:
        now = time.time()
        return now - 60, now
    start = min(i.failed_at for i in incidents)
    end = max((i.first_step_at or i.detected_at) for i in incidents)
    return start - 5, max(end, start + 1) + 5
