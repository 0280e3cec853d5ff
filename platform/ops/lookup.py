"""Finding jobs, generations, nodes and incidents in etcd, with errors that say what does exist.

An on-call engineer types a job or node name from a page or a chat message; when it is wrong, the
one-line error lists the right ones instead of a bare "not found".
"""

from __future__ import annotations

import json
from typing import Any

from stalwart.ops.errors import NotFound, OpsError
from stalwart.spec import SpecError, parse_job
from stalwart.spec.topology import Topology
from stalwart.store import keys
from stalwart.store.client import Store
from stalwart.store.jobs import list_jobs
from stalwart.store.records import Assignment, Incident, JobState


def qualified_job(name: str, namespace: str | None) -> str:
    """The job's etcd id: `demo` in namespace `ml` is `ml.demo` (a name with a dot is already one)."""
    return f"{namespace}.{name}" if namespace and "." not in name else name


def job_names(store: Store) -> list[str]:
    """Every job that has a state (a job whose controller never started has only a spec)."""
    return [state.job for state in job_states(store)]


def job_states(store: Store) -> list[JobState]:
    """Every job's state: a Range per job, never a read of everything under /jobs/ (a big job's
    heartbeats and stack reports are tens of MB)."""
    out = []
    for name in list_jobs(store):
        state = store.get(keys.job_state(name), JobState)
        if state is not None:
            out.append(state)
    return sorted(out, key=lambda s: s.job)


def require_state(store: Store, job: str) -> JobState:
    try:
        key = keys.job_state(job)
    except ValueError:
        raise NotFound(f"{job!r} is not a valid job name") from None
    state = store.get(key, JobState)
    if state is None:
        known = job_names(store)
        hint = f"jobs there: {', '.join(known)}" if known else "there are no jobs"
        raise NotFound(f"no job {job!r} in etcd at {store.endpoint} ({hint})")
    return state


def spec_document(store: Store, job: str) -> dict[str, Any] | None:
    """The job's TrainingJob document as submitted (JSON), or None; not validated, so an older or
    newer spec still shows its metadata."""
    raw = store.get_raw(keys.job_spec(job))
    if raw is None:
        return None
    try:
        doc = json.loads(raw)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def job_namespace(doc: dict[str, Any] | None) -> str:
    """The namespace in the job's metadata (`stalwart run` jobs are in `default`, as kubectl's are)."""
    meta = (doc or {}).get("metadata")
    namespace = meta.get("namespace") if isinstance(meta, dict) else None
    return namespace if isinstance(namespace, str) and namespace else "default"


def in_namespace(store: Store, job: str, namespace: str | None) -> bool:
    """Whether the job's TrainingJob is in `namespace` (every job is, when none is named)."""
    return namespace is None or job_namespace(spec_document(store, job)) == namespace


def current_assignment(store: Store, state: JobState) -> Assignment:
    """The running generation's ranks; a job between generations has none to act on."""
    assignment = store.get(keys.generation(state.job, state.generation), Assignment) if state.generation else None
    if assignment is None:
        raise OpsError(
            f"job {state.job!r} has no running generation (phase {state.phase.value}, generation {state.generation})"
        )
    return assignment


def job_topology(store: Store, job: str, assignment: Assignment | None) -> Topology | None:
    """The job's parallel layout (its spec in etcd), ranks placed as the assignment places them;
    None when the spec is missing or unreadable (a job written by an older Stalwart)."""
    raw = store.get_raw(keys.job_spec(job))
    if raw is None:
        return None
    try:
        spec = parse_job(json.loads(raw), keys.job_spec(job)).spec
        return Topology.from_spec(spec, assignment.rank_nodes() if assignment else {})
    except (SpecError, ValueError):
        return None


def jobs_with_node(store: Store, node: str) -> list[str]:
    """Unfinished jobs that hold the node in a slot or as a standby."""
    return [s.job for s in job_states(store) if not s.phase.terminal and (node in s.slots or node in s.standbys)]


def job_for_node(store: Store, node: str, job: str | None) -> str | None:
    """The job to act on for a node command: --job if given, else the one job holding the node (or None)."""
    if job is not None:
        state = require_state(store, job)
        if node not in state.slots and node not in state.standbys and node not in state.evicted:
            members = ", ".join(state.slots + state.standbys) or "none"
            raise NotFound(f"node {node!r} is not in job {job!r} (its nodes: {members})")
        return job
    holders = jobs_with_node(store, node)
    if len(holders) > 1:
        raise OpsError(f"node {node!r} is in several jobs ({', '.join(holders)}): pass --job")
    return holders[0] if holders else None


def find_incident(store: Store, incident_id: str, job: str | None) -> Incident:
    """By id, with or without the 'inc-' prefix, or by a unique prefix of it, in one job or all."""
    jobs = [require_state(store, job).job] if job else job_names(store)
    wanted = incident_id if incident_id.startswith("inc-") else f"inc-{incident_id}"
    matches = [
        inc
        for j in jobs
        for inc in store.get_prefix(keys.incidents_prefix(j), Incident)
        if inc.id == wanted or inc.id.startswith(wanted)
    ]
    exact = [inc for inc in matches if inc.id == wanted]
    if len(exact) == 1 or len(matches) == 1:
        return (exact or matches)[0]
    if not matches:
        where = f"job {job!r}" if job else f"any job in etcd at {store.endpoint}"
        raise NotFound(f"no incident {incident_id!r} in {where} (stalwart incidents lists them)")
    ids = ", ".join(f"{i.job}/{i.id}" for i in matches[:6])
    raise OpsError(f"incident id {incident_id!r} is ambiguous: {ids}; give more of it or pass --job")
