"""The job's spec as etcd holds it (`keys.job_spec`): the one place that reads and parses it, for
the controller, the agents and the job-metrics exporter. Written by `stalwart run` and the
operator, edited by `stalwart suspend|resume` and the console."""

from __future__ import annotations

import json

from stalwart.spec import SpecError, TrainingJob, parse_job
from stalwart.store import keys
from stalwart.store.client import Store


def parse_spec(raw: bytes | str, job: str) -> TrainingJob:
    """The spec from its stored JSON; a SpecError naming the key when it is not a valid TrainingJob."""
    source = keys.job_spec(job)
    try:
        document = json.loads(raw)
    except ValueError as exc:
        raise SpecError(source, [f"(document): not JSON: {exc}"]) from None
    return parse_job(document, source)


def read_spec(store: Store, job: str) -> TrainingJob | None:
    """The job's spec, or None when etcd has none; a SpecError when it does not parse."""
    raw = store.get_raw(keys.job_spec(job))
    return None if raw is None else parse_spec(raw, job)
