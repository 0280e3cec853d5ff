"""Names, labels and annotations the operator puts on Kubernetes objects, in one place.

A TrainingJob `demo` in namespace `ml` becomes:
  - etcd job id `ml.demo` (namespace-qualified: two namespaces may both hold a `demo`);
  - headless Service `demo` (the pods' DNS subdomain: node-3.demo.ml.svc);
  - one pod per Stalwart node, `demo-node-3`, labelled with the job, node, role and node rank.
"""

from __future__ import annotations

import re

GROUP = "stalwart.dev"
VERSION = "v1alpha1"
PLURAL = "trainingjobs"
SINGULAR = "trainingjob"
KIND = "TrainingJob"
SHORT_NAMES = ["tj"]
CRD_NAME = f"{PLURAL}.{GROUP}"

# Labels on every pod and Service of a job (selectors use JOB_LABEL).
JOB_LABEL = f"{GROUP}/job"
JOB_NAMESPACE_LABEL = f"{GROUP}/job-namespace"
NODE_LABEL = f"{GROUP}/node"
ROLE_LABEL = f"{GROUP}/role"
# Kept up to date from the controller's state: the slot (node rank) a pod holds, or "standby".
NODE_RANK_LABEL = f"{GROUP}/node-rank"
STANDBY_LABEL = f"{GROUP}/standby"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "stalwart-operator"

# A Kubernetes Node the controller cordoned: a taint (the scheduler avoids it) and a label (visible,
# and matched by the pods' node affinity, so even a pod tolerating every taint stays off it).
CORDON_TAINT = f"{GROUP}/cordoned"
CORDON_LABEL = f"{GROUP}/cordoned"
CORDON_REASON_ANNOTATION = f"{GROUP}/cordon-reason"

# Gang scheduling.
VOLCANO_GROUP_ANNOTATION = "scheduling.k8s.io/group-name"
VOLCANO_QUEUE_ANNOTATION = "volcano.sh/queue-name"
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_GROUP_LABEL = "kueue.x-k8s.io/pod-group-name"
KUEUE_GROUP_COUNT_ANNOTATION = "kueue.x-k8s.io/pod-group-total-count"

FINALIZER = f"{GROUP}/cleanup"
AGENT_CONTAINER = "agent"

_DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def job_id(namespace: str, name: str) -> str:
    """The job's name in etcd (and for `stalwart diagnose`): `<namespace>.<name>`.

    Both parts are DNS labels, which have no dots, so the id is unambiguous and a valid key segment."""
    return f"{namespace}.{name}"


def pod_name(job: str, node: str) -> str:
    return f"{job}-{node}"


def service_name(job: str) -> str:
    """Service names must be DNS-1035 labels (start with a letter); job names are DNS-1123 labels."""
    return job if _DNS_1035.match(job) else f"tj-{job}"[:63].rstrip("-")


def token_secret_name(job: str) -> str:
    """The Secret holding the job's credential (stalwart.store.credentials), read by its pods."""
    return f"{job}-stalwart-token"


TOKEN_SECRET_KEY = "token"


def podgroup_name(job: str) -> str:
    return job


def job_labels(job: str, namespace: str) -> dict[str, str]:
    return {
        JOB_LABEL: job,
        JOB_NAMESPACE_LABEL: namespace,
        MANAGED_BY_LABEL: MANAGED_BY,
    }


def job_selector(job: str) -> str:
    return f"{JOB_LABEL}={job}"
