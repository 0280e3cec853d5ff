"""Incidents (all jobs' or one job's), one incident with its timeline and verdict, and the runbooks."""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse

from stalwart.console.context import Ctx
from stalwart.console.identity import Who
from stalwart.console.runbook_html import runbook_html
from stalwart.ops.errors import NotFound
from stalwart.ops.incidents import incident_row, read_incidents
from stalwart.ops.lookup import find_incident, job_states, require_state
from stalwart.runbooks import runbook_for_incident
from stalwart.store.records import Incident

router = APIRouter()


def time_bounds(incidents: list[Incident]) -> tuple[float, float]:
    """The stretch of time the incidents' timeline spans, with a margin."""
    if not incidents:
        now = time.time()
        return now - 60, now
    start = min(i.failed_at for i in incidents)
    end = max((i.first_step_at or i.detected_at) for i in incidents)
    return start - 5, max(end, start + 1) + 5


@router.get("/incidents")
def incidents(
    request: Request,
    who: Who,
    ctx: Ctx,
    job: Annotated[str | None, Query(max_length=253)] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
) -> HTMLResponse:
    found = read_incidents(ctx.store, job or None)[-limit:][::-1]
    states = [require_state(ctx.store, job)] if job else job_states(ctx.store)
    return ctx.pages.page(
        request,
        "incidents.html",
        {
            "incidents": found,
            "job": job,
            "live": any(not s.phase.terminal for s in states),  # a new incident may come
            "runbook_of": runbook_for_incident,
            "row_of": incident_row,
            "bounds": time_bounds(found),
        },
    )


@router.get("/jobs/{job}/incidents")
def job_incidents(request: Request, job: str) -> RedirectResponse:
    return RedirectResponse(f"{request.scope.get('root_path', '')}/incidents?job={job}", status_code=303)


@router.get("/jobs/{job}/incidents/{incident_id}")
def incident(request: Request, who: Who, ctx: Ctx, job: str, incident_id: str) -> HTMLResponse:
    require_state(ctx.store, job)
    found = find_incident(ctx.store, incident_id, job)
    return ctx.pages.page(
        request,
        "incident.html",
        {"inc": found, "runbook": runbook_for_incident(found), "row": incident_row(found)},
    )


@router.get("/runbooks/{name}")
def runbook(request: Request, who: Who, ctx: Ctx, name: str) -> HTMLResponse:
    found = runbook_html(name, request.scope.get("root_path", ""))
    if found is None:
        raise NotFound(f"no runbook {name!r}")
    return ctx.pages.page(request, "runbook.html", {"book": found[0], "html": found[1]})
