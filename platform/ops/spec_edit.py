"""Editing a job's spec where it lives, in etcd: a compare-and-swap on the spec as read, so an edit
made meanwhile (the operator, another person) is never lost. Used by `stalwart suspend|resume` and
the web console."""

from __future__ import annotations

import json
from collections.abc import Mapping

from stalwart.store import keys
from stalwart.store.client import Store
from stalwart.store.records import Record

ATTEMPTS = 5


class SpecEditError(Exception):
    """The spec is missing, malformed, or kept changing while it was being edited."""


def set_suspend(store: Store, job: str, suspend: bool, also: Mapping[str, Record] | None = None) -> bool:
    """Set the job's `spec.suspend` (the controller carries it out), with `also` written in the same
    transaction. False if it already was so: nothing is written then."""
    key = keys.job_spec(job)
    for _ in range(ATTEMPTS):
        raw = store.get_raw(key)
        if raw is None:
            raise SpecEditError(f"job {job!r} has no spec in etcd")
        document = json.loads(raw)
        spec = document.get("spec") if isinstance(document, dict) else None
        if not isinstance(spec, dict):
            raise SpecEditError(f"job {job!r}'s spec in etcd has no 'spec' section")
        if bool(spec.get("suspend")) is suspend:
            return False
        spec["suspend"] = suspend
        if store.commit({key: json.dumps(document), **(also or {})}, expect_value={key: raw.decode()}):
            return True
    raise SpecEditError(f"job {job!r}'s spec kept changing while it was being updated; try again")
