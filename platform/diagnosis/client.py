"""A client for the diagnosis service, and `diagnose_local`, which falls back to the in-process
engine so that a failure is never left undiagnosed because the service is down, busy or refuses us.

The client sends the service's bearer token: the one it is given, else STALWART_DIAGNOSIS_TOKEN.
A busy service (503 with Retry-After) is asked again after the wait it names, a few times."""

from __future__ import annotations

import gzip
import os
import time
from collections.abc import Callable
from typing import Any

import httpx

from stalwart.diagnosis.engine import diagnose
from stalwart.diagnosis.models import EvidenceBundle, Verdict
from stalwart.store.credentials import DIAGNOSIS_TOKEN_ENV

GZIP_ABOVE_BYTES = 1024 * 1024
BUSY_RETRIES = 3
MAX_RETRY_WAIT_SECONDS = 10.0


class DiagnosisUnavailable(RuntimeError):
    """The service did not answer (connection refused, timeout, a 5xx); the message says where."""


class DiagnosisRejected(ValueError):
    """The service refused the request (a 4xx): the bundle is too large or not valid."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"diagnosis service refused the request ({status}): {detail}")
        self.status = status
        self.detail = detail


class IncidentNotFound(LookupError):
    pass


def _detail(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:500]
    return str(body.get("detail", body))[:2000] if isinstance(body, dict) else str(body)[:2000]


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after", "")
    return min(float(value), MAX_RETRY_WAIT_SECONDS) if value.isdigit() else None


class DiagnosisClient:
    def __init__(
        self, base_url: str, *, token: str | None = None, timeout: float = 30.0, connect_timeout: float = 3.0
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._timeout = httpx.Timeout(timeout, connect=connect_timeout)
        self._budget = timeout
        token = token or os.environ.get(DIAGNOSIS_TOKEN_ENV)
        self._headers = {"authorization": f"Bearer {token}"} if token else {}

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        url = f"{self.base_url}{path}"
        headers = {**kwargs.pop("headers", {}), **self._headers}
        deadline = time.monotonic() + self._budget
        for attempt in range(BUSY_RETRIES + 1):
            try:
                with httpx.Client(timeout=self._timeout) as http:
                    response = http.request(method, url, headers=headers, **kwargs)
            except httpx.TimeoutException as exc:
                raise DiagnosisUnavailable(f"diagnosis service at {self.base_url} timed out: {exc!r}") from None
            except httpx.HTTPError as exc:
                raise DiagnosisUnavailable(f"cannot reach the diagnosis service at {self.base_url}: {exc!r}") from None
            wait = _retry_after(response) if response.status_code == 503 else None
            if wait is None or attempt == BUSY_RETRIES or time.monotonic() + wait > deadline:
                break
            time.sleep(wait)  # busy: every worker is diagnosing; it said when to come back
        if response.status_code >= 500:
            raise DiagnosisUnavailable(
                f"diagnosis service at {self.base_url} failed ({response.status_code}): {_detail(response)}"
            )
        if response.status_code in (401, 403):
            hint = "" if self._headers else f" (no token: set {DIAGNOSIS_TOKEN_ENV})"
            raise DiagnosisRejected(response.status_code, _detail(response) + hint)
        return response

    def diagnose(self, bundle: EvidenceBundle) -> Verdict:
        body = bundle.model_dump_json().encode()
        headers = {"content-type": "application/json"}
        if len(body) > GZIP_ABOVE_BYTES:
            body = gzip.compress(body, compresslevel=3)
            headers["content-encoding"] = "gzip"
        response = self._request("POST", "/v1/diagnose", content=body, headers=headers)
        if response.status_code != 200:
            raise DiagnosisRejected(response.status_code, _detail(response))
        return Verdict.model_validate_json(response.content)

    def incident(self, job: str, incident_id: str) -> dict[str, Any]:
        response = self._request("GET", f"/v1/incidents/{job}/{incident_id}")
        if response.status_code == 404:
            raise IncidentNotFound(_detail(response))
        if response.status_code != 200:
            raise DiagnosisRejected(response.status_code, _detail(response))
        data: dict[str, Any] = response.json()
        return data

    def healthy(self) -> bool:
        try:
            return self._request("GET", "/healthz").status_code == 200
        except DiagnosisUnavailable:
            return False


def diagnose_local(
    bundle: EvidenceBundle,
    url: str | None = None,
    *,
    token: str | None = None,
    timeout: float = 30.0,
    on_unavailable: Callable[[DiagnosisUnavailable | DiagnosisRejected], None] | None = None,
) -> Verdict:
    """Ask the service at `url`; without one, or when it does not answer or refuses (`on_unavailable`
    hears why), diagnose in this process."""
    if url:
        try:
            return DiagnosisClient(url, token=token, timeout=timeout).diagnose(bundle)
        except (DiagnosisUnavailable, DiagnosisRejected) as exc:
            if on_unavailable is not None:
                on_unavailable(exc)
    return diagnose(bundle)
