"""The job's spec as etcd holds it (`keys.job_spec`): the one place that reads and parses it, for
the controller, the agents and the job-metrics exporter. Written by `stalwart run` and the
operator, edited by `stalwart suspend|resume` and the console. And the listings of jobs and of a
job's registered nodes that stay small whatever the job's size (the CLI's, the console's)."""

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


def list_jobs(store: Store) -> list[str]:
    """Every job that has keys in etcd, in name order: one Range of one key per job, skipping over
    each job's keys (a job of 10,000 nodes has 30,000 of them, and its stack reports)."""
    names: list[str] = []
    start, end = keys.jobs_prefix(), keys.prefix_end(keys.jobs_prefix())
    while (key := store.first_key(start, end)) is not None:
        name = keys.job_name_from_key(key)
        try:
            start = keys.prefix_end(keys.job_prefix(name or ""))
        except ValueError:  # a key right under /jobs/, or not a job's name (none is written): step over it
            start = key + "\0"
            continue
        names.append(name or "")
    return names


def registered_nodes(store: Store, job: str) -> set[str]:
    """The job's nodes whose lease is alive (a registration key): a keys-only listing, so it
    reads no heartbeat."""
    out = set()
    for key in store.list_keys(keys.nodes_prefix(job)):
        parsed = keys.parse_node_key(job, key)
        if parsed is not None and parsed[1] == "registration":
            out.add(parsed[0])
    return out
