"""Every etcd key Stalwart uses, in one place and versioned.

Agents and the controller talk to each other only through these keys:

    /stalwart/v1/jobs/{job}/spec                       TrainingJob document (JSON)
    /stalwart/v1/jobs/{job}/token                      the job's credential (a bare string; never printed:
                                                       stalwart.store.credentials)
    /stalwart/v1/jobs/{job}/state                      JobState: phase, generation, restarts
    /stalwart/v1/jobs/{job}/leader                     controller election, under the leader's lease
    /stalwart/v1/jobs/{job}/generations/{gen:08d}      Assignment: ranks and rendezvous of a generation
    /stalwart/v1/jobs/{job}/incidents/{id}             Incident
    /stalwart/v1/jobs/{job}/nodes/{node}/registration  NodeRegistration, under the node's lease
    /stalwart/v1/jobs/{job}/nodes/{node}/heartbeat     Heartbeat, under the node's lease
    /stalwart/v1/jobs/{job}/nodes/{node}/command       AgentCommand, written by the controller
    /stalwart/v1/jobs/{job}/stack-request              StackRequest: every agent dumps its workers' stacks
    /stalwart/v1/jobs/{job}/stacks/{request}/{node}    StackReport, written by each agent
    /stalwart/v1/jobs/{job}/log-request                LogRequest: every agent reports its workers' log tails
    /stalwart/v1/jobs/{job}/checkpoint-request         CheckpointRequest: every agent tells its workers to save
                                                       at a step (the controller, before a suspension)
    /stalwart/v1/jobs/{job}/logs/{request}/{node}      LogReport, written by each agent
    /stalwart/v1/jobs/{job}/checks/{id}/request        CheckRequest: the collective and compute checks, run by
                                                       the agents of the nodes it names (a cluster whose
                                                       controller cannot start check processes itself)
    /stalwart/v1/jobs/{job}/checks/{id}/rendezvous     CheckRendezvous: where the first node's rank 0 listens
    /stalwart/v1/jobs/{job}/checks/{id}/nodes/{node}   NodeCheckReport: one node's ranks, as far as each got
    /stalwart/v1/jobs/{job}/requests/{id}              OperatorRequest (evict, cordon, check...), from the CLI
                                                       or the operator; the controller carries it out and
                                                       writes the outcome into the same record
    /stalwart/v1/jobs/{job}/checkpoints/{step:012d}    CheckpointEntry: the job's checkpoint catalog (controller)
    /stalwart/v1/jobs/{job}/audit/{id}                 AuditEntry: an action taken from the web console (who,
                                                       when, why; the OperatorRequest that carried it out)
    /stalwart/v1/jobs/{job}/operator/events            the Kubernetes Events the operator posted (no repeats)
    /stalwart/v1/jobs/{job}/dataplane/{channel}        DataPlaneEndpoint: where an RLHF data-plane server
                                                       (the relay, the actor's weights) listens; the
                                                       data itself never goes through etcd
    /stalwart/v1/jobs/{job}/dataplane-health           DataPlaneHealth: the relay's word on workers that held
                                                       groups past their lease (data-plane hangs)
    /stalwart/v1/jobs/{job}/checkpoint-token           the memory stores' token, when none was given (text)
    /stalwart/v1/cordons/{node}                        Cordon: a machine not to be used until it passes checks
    /stalwart/v1/services/{name}                       ServiceEndpoint (the diagnosis service's URL)
    /stalwart/v1/service-tokens/{name}                 the bearer token its callers send (a bare string),
                                                       published by `stalwart run` beside the URL
    /stalwart/v1/operators/{name}/leader               Kubernetes operator election, under the leader's lease
"""

from __future__ import annotations

import re

ROOT = "/stalwart/v1"
_SEGMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def _seg(value: str) -> str:
    """Refuse segments that could escape their prefix ('/', empty, '..')."""
    if not _SEGMENT.match(value) or ".." in value:
        raise ValueError(f"invalid key segment {value!r}")
    return value


def jobs_prefix() -> str:
    return f"{ROOT}/jobs/"


def job_prefix(job: str) -> str:
    return f"{ROOT}/jobs/{_seg(job)}/"


def job_spec(job: str) -> str:
    return job_prefix(job) + "spec"


def job_token(job: str) -> str:
    return job_prefix(job) + "token"


def job_state(job: str) -> str:
    return job_prefix(job) + "state"


def job_leader(job: str) -> str:
    return job_prefix(job) + "leader"


def checkpoint_token(job: str) -> str:
    return job_prefix(job) + "checkpoint-token"


def generations_prefix(job: str) -> str:
    return job_prefix(job) + "generations/"


def generation(job: str, gen: int) -> str:
    return f"{generations_prefix(job)}{gen:08d}"


def incidents_prefix(job: str) -> str:
    return job_prefix(job) + "incidents/"


def incident(job: str, incident_id: str) -> str:
    return incidents_prefix(job) + _seg(incident_id)


def stack_request(job: str) -> str:
    return job_prefix(job) + "stack-request"


def stacks_prefix(job: str, request_id: str) -> str:
    return f"{job_prefix(job)}stacks/{_seg(request_id)}/"


def stack_report(job: str, request_id: str, node: str) -> str:
    return stacks_prefix(job, request_id) + _seg(node)


def nodes_prefix(job: str) -> str:
    return job_prefix(job) + "nodes/"


def node_prefix(job: str, node: str) -> str:
    return f"{nodes_prefix(job)}{_seg(node)}/"


def node_registration(job: str, node: str) -> str:
    return node_prefix(job, node) + "registration"


def node_heartbeat(job: str, node: str) -> str:
    return node_prefix(job, node) + "heartbeat"


def node_command(job: str, node: str) -> str:
    return node_prefix(job, node) + "command"


def parse_node_key(job: str, key: str) -> tuple[str, str] | None:
    """'/…/nodes/node-1/heartbeat' -> ('node-1', 'heartbeat'); None for keys outside the nodes prefix."""
    prefix = nodes_prefix(job)
    if not key.startswith(prefix):
        return None
    rest = key[len(prefix) :].split("/")
    if len(rest) != 2:
        return None
    return rest[0], rest[1]


def log_request(job: str) -> str:
    return job_prefix(job) + "log-request"


def checkpoint_request(job: str) -> str:
    """The controller's CheckpointRequest (a suspension's save first); agents pass it to their workers."""
    return job_prefix(job) + "checkpoint-request"


def logs_prefix(job: str, request_id: str) -> str:
    return f"{job_prefix(job)}logs/{_seg(request_id)}/"


def log_report(job: str, request_id: str, node: str) -> str:
    return logs_prefix(job, request_id) + _seg(node)


def checks_prefix(job: str) -> str:
    return job_prefix(job) + "checks/"


def check_prefix(job: str, check_id: str) -> str:
    return checks_prefix(job) + _seg(check_id) + "/"


def check_request(job: str, check_id: str) -> str:
    return check_prefix(job, check_id) + "request"


def check_rendezvous(job: str, check_id: str) -> str:
    return check_prefix(job, check_id) + "rendezvous"


def check_reports_prefix(job: str, check_id: str) -> str:
    return check_prefix(job, check_id) + "nodes/"


def check_report(job: str, check_id: str, node: str) -> str:
    return check_reports_prefix(job, check_id) + _seg(node)


def parse_check_request_key(job: str, key: str) -> str | None:
    """The check id of a `check_request` key, or None for any other key under checks/."""
    rest = key[len(checks_prefix(job)) :] if key.startswith(checks_prefix(job)) else ""
    parts = rest.split("/")
    return parts[0] if len(parts) == 2 and parts[1] == "request" and parts[0] else None


def requests_prefix(job: str) -> str:
    return job_prefix(job) + "requests/"


def request(job: str, request_id: str) -> str:
    return requests_prefix(job) + _seg(request_id)


def checkpoints_prefix(job: str) -> str:
    return job_prefix(job) + "checkpoints/"


def checkpoint_entry(job: str, step: int) -> str:
    return f"{checkpoints_prefix(job)}{step:012d}"


def audit_prefix(job: str) -> str:
    return job_prefix(job) + "audit/"


def audit_entry(job: str, entry_id: str) -> str:
    return audit_prefix(job) + _seg(entry_id)


def operator_events(job: str) -> str:
    return job_prefix(job) + "operator/events"


def dataplane_prefix(job: str) -> str:
    return job_prefix(job) + "dataplane/"


def dataplane_health(job: str) -> str:
    """The relay's DataPlaneHealth: which worker held groups past its lease (a data-plane hang)."""
    return job_prefix(job) + "dataplane-health"


def dataplane_endpoint(job: str, channel: str) -> str:
    return dataplane_prefix(job) + _seg(channel)


def cordons_prefix() -> str:
    return f"{ROOT}/cordons/"


def cordon(node: str) -> str:
    return cordons_prefix() + _seg(node)


def service(name: str) -> str:
    return f"{ROOT}/services/{_seg(name)}"


def service_token(name: str) -> str:
    """Apart from /services/: a listing of the services' URLs never reads a token."""
    return f"{ROOT}/service-tokens/{_seg(name)}"


def job_name_from_key(key: str) -> str | None:
    """'/stalwart/v1/jobs/demo/state' -> 'demo'."""
    prefix = jobs_prefix()
    if not key.startswith(prefix):
        return None
    return key[len(prefix) :].split("/", 1)[0] or None


def prefix_end(prefix: str) -> str:
    """The first key after every key under `prefix` (etcd's range end for it)."""
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)


def operator_leader(operator_name: str) -> str:
    return f"{ROOT}/operators/{_seg(operator_name)}/leader"
