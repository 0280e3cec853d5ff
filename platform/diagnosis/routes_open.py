"""The open, read-only endpoints: liveness and Prometheus metrics (no token, no job's data)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from stalwart.diagnosis.service_context import Svc

router = APIRouter()


@router.get("/healthz", summary="Liveness (open, read-only)")
async def healthz(svc: Svc) -> dict[str, str]:  # on the event loop itself: no thread to wait for
    return {"status": "ok", "store": "configured" if svc.store is not None else "none"}


@router.get("/metrics", summary="Prometheus metrics (open, read-only)", response_class=Response)
def metrics(svc: Svc) -> Response:
    return Response(generate_latest(svc.metrics.registry), media_type=CONTENT_TYPE_LATEST)
