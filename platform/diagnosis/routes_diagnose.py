"""POST /v1/diagnose: an evidence bundle in, a verdict out. The event loop only checks the headers
and moves bytes; decoding, validation and the diagnosis run in a worker process, admitted within
the service's limits."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, HTTPException, Request, Security
from fastapi.responses import Response
from starlette.requests import ClientDisconnect

from stalwart.diagnosis.bundle_worker import diagnose_body
from stalwart.diagnosis.models import Verdict
from stalwart.diagnosis.service_context import AUTH_ERRORS, MIB, Limits, Svc, bearer
from stalwart.diagnosis.worker_pool import Busy, WorkerLost

DIAGNOSE_ERRORS: dict[int | str, dict[str, Any]] = {
    **AUTH_ERRORS,
    400: {"description": "the body is not JSON (or not gzip)"},
    408: {"description": "the body did not arrive in time"},
    413: {"description": "the body is larger than the limit, as sent or once inflated"},
    415: {"description": "a Content-Type other than JSON, or a Content-Encoding other than gzip"},
    422: {"description": "not a valid evidence bundle; the message names the fields"},
    503: {"description": "every diagnosis worker is busy (see Retry-After), or one died"},
}

router = APIRouter()


def mib(n: int) -> str:
    return f"{n / MIB:g} MiB"


async def read_body(request: Request, limits: Limits) -> bytes:
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():  # bounded: stops at the limit
        size += len(chunk)
        if size > limits.max_body_bytes:
            raise HTTPException(413, f"request body exceeds the limit of {mib(limits.max_body_bytes)}")
        chunks.append(chunk)
    return b"".join(chunks)


@router.post(
    "/v1/diagnose",
    response_model=Verdict,
    summary="Diagnose one failure from its evidence",
    responses=DIAGNOSE_ERRORS,
    dependencies=[Security(bearer)],
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/EvidenceBundle"}}},
        }
    },
)
async def post_diagnose(request: Request, svc: Svc) -> Response:
    """Decoded, validated and diagnosed in a worker process; the event loop only moves bytes."""
    limits, metrics = svc.limits, svc.metrics
    busy_headers = {"Retry-After": str(limits.retry_after_seconds)}
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limits.max_body_bytes:
        raise HTTPException(
            413,
            f"request body is {int(declared)} bytes; the limit is {mib(limits.max_body_bytes)} "
            "(send stack texts once in `texts`, or gzip the body)",
        )
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("identity", "", "gzip"):
        raise HTTPException(415, f"unsupported Content-Encoding {encoding[:40]!r}; use gzip or none")
    media = request.headers.get("content-type", "application/json").split(";")[0].strip().lower()
    if media != "application/json" and not media.endswith("+json"):
        raise HTTPException(415, f"unsupported Content-Type {media[:60]!r}; send application/json")
    try:
        async with svc.admission.slot():
            try:
                async with asyncio.timeout(limits.body_seconds):
                    body = await read_body(request, limits)
            except TimeoutError:
                raise HTTPException(408, f"the body did not arrive within {limits.body_seconds:g}s") from None
            except ClientDisconnect:
                raise HTTPException(400, "the client went away before its body arrived") from None
            result = await svc.pool.run(diagnose_body, body, encoding == "gzip", limits.max_decoded_bytes)
    except Busy as exc:
        raise HTTPException(503, f"busy: {exc}; retry later", headers=busy_headers) from None
    except WorkerLost as exc:
        raise HTTPException(503, str(exc), headers=busy_headers) from None
    if result.status == 200:
        metrics.latency.labels(result.kind).observe(result.seconds)
        metrics.diagnoses.labels(result.kind, result.failure_class).inc()
    else:
        metrics.rejected.labels(str(result.status)).inc()
    return Response(result.body, status_code=result.status, media_type="application/json")
