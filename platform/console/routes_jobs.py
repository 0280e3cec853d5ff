"""The jobs list and one job's page: status, rank grid, charts from the history, recent incidents."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse

from stalwart.console.actions import BadForm
from stalwart.console.context import Ctx
from stalwart.console.identity import Who
from stalwart.console.views import JobView, job_view, jobs_view
from stalwart.ops.incidents import incident_row, read_incidents

router = APIRouter()


def parallel_size(name: str, given: str | None) -> int | None:
    """A parallel size from the page's query: blank is none given; otherwise 1..65536."""
    if given is None or not given.strip():
        return None
    if not given.strip().isdigit() or not 1 <= int(given) <= 65536:
        raise BadForm(f"{name}: a whole number from 1 to 65536, or blank for the job's own layout")
    return int(given)


@router.get("/")
def root(request: Request) -> RedirectResponse:
    return RedirectResponse(f"{request.scope.get('root_path', '')}/jobs", status_code=303)


@router.get("/jobs")
def jobs(
    request: Request,
    who: Who,
    ctx: Ctx,
    phase: Annotated[str | None, Query(max_length=32)] = None,
    namespace: Annotated[str | None, Query(max_length=63)] = None,
) -> HTMLResponse:
    return ctx.pages.page(request, "jobs.html", {"view": jobs_view(ctx.store, phase or None, namespace or None)})


@router.get("/jobs/{job}")
def job(
    request: Request,
    who: Who,
    ctx: Ctx,
    job: str,
    tp: Annotated[str | None, Query(max_length=5)] = None,
    pp: Annotated[str | None, Query(max_length=5)] = None,
    group: Annotated[str, Query(pattern="^(tp|cp|ep|pp|dp|none)$")] = "none",
) -> HTMLResponse:
    # Empty (the form's boxes left blank): the job's own layout, from its spec.
    tp_size, pp_size = parallel_size("tp", tp), parallel_size("pp", pp)
    view: JobView = job_view(ctx.store, job, tp_size, pp_size)
    history = ctx.history
    series = history.series(job) if history else []

    def points(attr: str) -> list[tuple[float, float]]:
        return [(s.at, float(v)) for s in series if (v := getattr(s, attr)) is not None]

    return ctx.pages.page(
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
            "recent": [incident_row(i) for i in read_incidents(ctx.store, job)[-5:]][::-1],
        },
    )
