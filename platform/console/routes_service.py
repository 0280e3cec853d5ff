"""The console's own health and metrics, open without sign-in: counts only, no job's data."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from stalwart.console.context import Ctx

router = APIRouter(include_in_schema=False)


@router.get("/healthz")
def healthz() -> PlainTextResponse:
    return PlainTextResponse("ok")


@router.get("/metrics")
def metrics(ctx: Ctx) -> Response:
    """For Prometheus, without sign-in (as /healthz): counts only, no job's data."""
    return Response(generate_latest(ctx.metrics.registry), media_type=CONTENT_TYPE_LATEST)
