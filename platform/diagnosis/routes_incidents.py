"""GET /v1/incidents/...: one incident of a job, as the controller recorded it in etcd."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException, Query, Security

from stalwart.diagnosis.service_context import AUTH_ERRORS, ServiceContext, Svc, bearer
from stalwart.store import keys
from stalwart.store.client import StoreUnavailable
from stalwart.store.records import Incident

INCIDENT_ERRORS: dict[int | str, dict[str, Any]] = {
    **AUTH_ERRORS,
    400: {"description": "not a valid job or incident id"},
    404: {"description": "no such incident"},
    422: {"description": "a required parameter is missing"},
    503: {"description": "no etcd configured, or etcd did not answer"},
}

router = APIRouter(responses=INCIDENT_ERRORS, dependencies=[Security(bearer)])


def read_incident(svc: ServiceContext, job: str, incident_id: str) -> dict[str, Any]:
    served = svc.metrics.incidents_served
    if svc.store is None:
        served.labels("no_store").inc()
        raise HTTPException(503, "this diagnosis service has no etcd store configured (start it with --etcd)")
    try:
        key = keys.incident(job, incident_id)
    except ValueError:
        served.labels("bad_request").inc()
        raise HTTPException(400, f"invalid job or incident id: {job[:64]!r}, {incident_id[:64]!r}") from None
    try:
        incident = svc.store.get(key, Incident)
    except StoreUnavailable as exc:
        served.labels("store_unavailable").inc()
        raise HTTPException(503, f"etcd did not answer: {exc}") from None
    if incident is None:
        served.labels("not_found").inc()
        raise HTTPException(404, f"no incident {incident_id!r} for job {job!r}")
    served.labels("found").inc()
    return incident.model_dump(mode="json")


@router.get("/v1/incidents/{job}/{incident_id}", summary="One incident of a job, as the controller recorded it")
def get_incident(svc: Svc, job: str, incident_id: str) -> dict[str, Any]:
    return read_incident(svc, job, incident_id)


@router.get("/v1/incidents/{incident_id}", summary="One incident (the job as a query parameter)")
def get_incident_by_id(
    svc: Svc, incident_id: str, job: str = Query(..., description="the job the incident belongs to")
) -> dict[str, Any]:
    return read_incident(svc, job, incident_id)
