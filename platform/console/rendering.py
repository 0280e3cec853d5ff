"""Pages from the Jinja2 templates: the values every page gets, a whole page or only its live part
(htmx's `HX-Request`), and errors as pages with a status and one sentence."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fastapi import Request
from fastapi.responses import HTMLResponse, Response
from fastapi.templating import Jinja2Templates
from markupsafe import Markup

from stalwart.console import charts
from stalwart.console.access import Gate, Identity
from stalwart.console.actions import CONSEQUENCES
from stalwart.console.runbook_html import runbook_html
from stalwart.ops.readable import duration, nodes_of, num, percent, rank_ranges

HERE = Path(__file__).parent
TEMPLATES = HERE / "templates"
HTMX = HERE / "static" / "vendor" / "htmx.min.js"
STOP_POLLING = 286  # htmx's status for "stop polling"


def clock(t: float | None) -> Markup:
    """A <time> the browser rewrites in the viewer's time zone (console.js); UTC until it does."""
    if t is None:
        return Markup("-")
    iso = datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    shown = datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return Markup(f'<time datetime="{iso}">{shown}</time>')


def size(n: int | None) -> str:
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"


class Pages:
    """Renders the templates for one console (its gate signs the CSRF tokens the forms carry)."""

    def __init__(self, gate: Gate, refresh_seconds: float) -> None:
        self.gate = gate
        self.templates = Jinja2Templates(directory=str(TEMPLATES))
        self.templates.env.globals.update(
            clock=clock,
            duration=duration,
            num=num,
            percent=percent,
            size=size,
            rank_ranges=rank_ranges,
            nodes_of=nodes_of,
            refresh=refresh_seconds,
            htmx_installed=HTMX.exists(),
            line_chart=charts.line_chart,
            timeline_svg=charts.timeline_svg,
            runbook_html=runbook_html,
            consequences=CONSEQUENCES,
        )

    def page(self, request: Request, name: str, context: dict[str, Any], status: int = 200) -> HTMLResponse:
        who: Identity | None = getattr(request.state, "identity", None)
        fragment = request.headers.get("hx-request") == "true"
        live = context.get("live", getattr(context.get("view"), "live", None))
        if fragment and live is False and status == 200:
            status = STOP_POLLING  # the job finished: htmx swaps this last fragment in and stops asking
        base = {
            "request": request,
            "who": who,
            "csrf": self.gate.csrf_token(who) if who else "",
            "fragment": fragment,
            "root": request.scope.get("root_path", ""),
        }
        response = self.templates.TemplateResponse(request, name, {**base, **context}, status_code=status)
        response.headers["Vary"] = "HX-Request"  # a fragment must never be cached as the page
        return response

    def error(self, request: Request, status: int, title: str, message: str) -> Response:
        if request.headers.get("hx-request") == "true":  # a live part: say it in place, keep the page
            return HTMLResponse(f'<p class="error">{Markup.escape(message)}</p>', status_code=status)
        return self.page(request, "error.html", {"status": status, "title": title, "message": message}, status=status)
