"""A job's actions: the confirmation page (what will happen), then the audited POST."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse

from stalwart.console.access import AccessError
from stalwart.console.actions import Action, check_target, perform
from stalwart.console.context import Ctx
from stalwart.console.identity import Operator, Who

router = APIRouter()


@router.get("/jobs/{job}/actions/{action}")
def confirm(request: Request, who: Who, ctx: Ctx, job: str, action: Action, node: str | None = None) -> HTMLResponse:
    if not who.can_act:
        raise AccessError(403, f"{who.user} may view but not act: ask for the operator role")
    state = check_target(ctx.store, job, action, node or None)
    return ctx.pages.page(request, "confirm.html", {"job": job, "action": action, "node": node or None, "state": state})


@router.post("/jobs/{job}/actions/{action}")
def act(
    request: Request,
    who: Operator,
    ctx: Ctx,
    job: str,
    action: Action,
    reason: Annotated[str, Form(max_length=2000)],
    node: Annotated[str | None, Form(max_length=253)] = None,
) -> RedirectResponse:
    entry = perform(ctx.store, job, action, node or None, reason, who, kubernetes=ctx.config.kubernetes)
    ctx.metrics.actions_taken.labels(action.value).inc()
    root = request.scope.get("root_path", "")
    return RedirectResponse(f"{root}/jobs/{job}?done={entry.id}#audit", status_code=303)
