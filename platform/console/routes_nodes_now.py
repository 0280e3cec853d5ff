"""What a job's nodes send when asked now: the workers' output (logs) and every rank's stack with a
diagnosis (stacks). Each answer costs the agents work, so viewers share it for a moment."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse

from stalwart.console.actions import Conflict
from stalwart.console.context import Ctx
from stalwart.console.identity import Who
from stalwart.console.routes_jobs import parallel_size
from stalwart.ops.errors import NotFound, OpsError
from stalwart.ops.logs import log_nodes, read_logs
from stalwart.ops.lookup import require_state
from stalwart.ops.stacks import stacks_now
from stalwart.store import keys
from stalwart.store.records import Assignment

LOG_CACHE_SECONDS = 1.5
STACKS_CACHE_SECONDS = 10.0
LOG_LINES = 200

router = APIRouter()


@router.get("/jobs/{job}/logs")
def logs(
    request: Request,
    who: Who,
    ctx: Ctx,
    job: str,
    rank: Annotated[int, Query(ge=0, le=1_000_000)] = 0,
    lines: Annotated[int, Query(ge=1, le=2000)] = LOG_LINES,
) -> HTMLResponse:
    store = ctx.store
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
            output, notes, problem = ctx.cache.get(("logs", job, rank, lines), LOG_CACHE_SECONDS, fetch)
    assignment = store.get(keys.generation(job, state.generation), Assignment) if state.generation else None
    world = sorted(assignment.rank_nodes()) if assignment else []
    return ctx.pages.page(
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


@router.get("/jobs/{job}/stacks")
def stacks(
    request: Request,
    who: Who,
    ctx: Ctx,
    job: str,
    capture: Annotated[bool, Query()] = False,
    tp: Annotated[str | None, Query(max_length=5)] = None,
    pp: Annotated[str | None, Query(max_length=5)] = None,
) -> HTMLResponse:
    state = require_state(ctx.store, job)
    tp_size, pp_size = parallel_size("tp", tp), parallel_size("pp", pp)  # blank: the job's own layout
    result = None
    if capture:
        if state.phase.terminal:
            raise Conflict(f"job {job} finished ({state.phase.value}): it has no workers to capture")
        result = ctx.cache.get(
            ("stacks", job, tp_size, pp_size),
            STACKS_CACHE_SECONDS,
            lambda: stacks_now(ctx.store, job, tp_size, pp_size),
        )
    return ctx.pages.page(
        request, "stacks.html", {"job": job, "state": state, "result": result, "tp": tp_size, "pp": pp_size}
    )
