"""Kubernetes manifests for a job: the node pods, the headless Service and the gang's PodGroup.

Pure functions of the spec and the operator's settings, so they are tested (and validated against
the Kubernetes schemas) without a cluster.
"""

from __future__ import annotations

import base64
import copy
import os
from typing import Any

from stalwart.spec import ALLOWED_PATHS_ENV, Role, TrainingJob
from stalwart.spec.env_names import refusal as env_refusal
from stalwart.spec.model import PodTemplateOverride
from stalwart.store.credentials import JOB_TOKEN_ENV
from stalwart.store.etcd_auth import CA_ENV, CERT_ENV, KEY_ENV
from stalwart.store.etcd_auth import ENV_NAMES as ETCD_ENV_NAMES
from stalwart_operator import names
from stalwart_operator.config import OperatorConfig

Manifest = dict[str, Any]

RENDEZVOUS_PORT_NAME = "rendezvous"
METRICS_PORT_NAME = "metrics"
# What the operator puts in every node pod; a role's template may add to these, never replace them.
OPERATOR_ENV = frozenset(
    {
        "STALWART_JOB",
        "STALWART_NODE",
        "STALWART_ETCD",
        "STALWART_WORKDIR",
        "STALWART_JOB_DIR",
        "STALWART_METRICS_PORT",
        "STALWART_METRICS_HOST",
        "STALWART_POD_NAME",
        "STALWART_POD_NAMESPACE",
        "STALWART_MACHINE",
        "STALWART_POD_IP",
        *ETCD_ENV_NAMES,
        "STALWART_NODE_ADDRESS",
        JOB_TOKEN_ENV,
        ALLOWED_PATHS_ENV,
    }
)
WORKDIR_VOLUME = "workdir"
SHM_VOLUME = "dshm"
ETCD_TLS_VOLUME = "etcd-tls"
OPERATOR_VOLUMES = frozenset({WORKDIR_VOLUME, SHM_VOLUME, ETCD_TLS_VOLUME})
SHM_PATH = "/dev/shm"
ETCD_TLS_PATH = "/etc/stalwart/etcd-tls"
# Where a role's template says nothing: no privilege escalation, no capabilities (py-spy's native
# frames need SYS_PTRACE: the template adds it), the runtime's seccomp profile, a non-root uid. The
# root filesystem stays writable: training code writes caches wherever it likes (Triton, Inductor,
# Hugging Face), and a read-only root would break it in ways the platform cannot foresee.
CONTAINER_SECURITY: dict[str, Any] = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
}


def pod_security(config: OperatorConfig) -> Manifest:
    return {
        "runAsNonRoot": True,
        "runAsUser": config.run_as_user,
        "runAsGroup": config.run_as_user,
        "fsGroup": config.run_as_user,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _etcd_client(config: OperatorConfig) -> tuple[list[Manifest], list[Manifest], list[Manifest]]:
    """The env, mount and volume that give the agent etcd's CA and its client certificate (the
    agent's store client reads STALWART_ETCD_*), when the operator is told the Secret's name."""
    if not config.etcd_client_secret:
        return [], [], []
    env = [
        {"name": CA_ENV, "value": f"{ETCD_TLS_PATH}/ca.crt"},
        {"name": CERT_ENV, "value": f"{ETCD_TLS_PATH}/tls.crt"},
        {"name": KEY_ENV, "value": f"{ETCD_TLS_PATH}/tls.key"},
    ]
    mount = {"name": ETCD_TLS_VOLUME, "mountPath": ETCD_TLS_PATH, "readOnly": True}
    volume = {"name": ETCD_TLS_VOLUME, "secret": {"secretName": config.etcd_client_secret, "defaultMode": 0o440}}
    return env, [mount], [volume]


def owner_reference(name: str, uid: str) -> Manifest:
    """Pods and the Service belong to the TrainingJob: Kubernetes deletes them with it."""
    return {
        "apiVersion": f"{names.GROUP}/{names.VERSION}",
        "kind": names.KIND,
        "name": name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def standby_role(job: TrainingJob) -> Role:
    """The template for a node whose role nobody names: only a standby of a controller state written
    before standbys had roles (each standby now waits for one role and is made from its template).
    The role with the most nodes, where a failure is likeliest; ties go to the first role."""
    return max(job.spec.roles, key=lambda r: r.replicas)


def _resources(role: Role) -> Manifest:
    requests: dict[str, str] = {}
    if role.resources.cpu:
        requests["cpu"] = role.resources.cpu
    if role.resources.memory:
        requests["memory"] = role.resources.memory
    limits: dict[str, str] = {}
    if role.resources.memory:
        limits["memory"] = role.resources.memory
    if role.resources.gpus:
        # Extended resources are requested through limits (requests default to them).
        limits["nvidia.com/gpu"] = str(role.resources.gpus)
        requests["nvidia.com/gpu"] = str(role.resources.gpus)
    out: Manifest = {}
    if requests:
        out["requests"] = requests
    if limits:
        out["limits"] = limits
    return out


def _field_env(name: str, path: str) -> Manifest:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def _gang(job: TrainingJob, total_pods: int) -> tuple[dict[str, str], dict[str, str]]:
    """Labels and annotations for gang admission: Volcano (scheduler `volcano`, a PodGroup) or Kueue
    (a queue name without Volcano: a plain-pod group)."""
    scheduling = job.spec.scheduling
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}
    if scheduling.scheduler_name == "volcano":
        annotations[names.VOLCANO_GROUP_ANNOTATION] = names.podgroup_name(job.name)
        if scheduling.queue:
            annotations[names.VOLCANO_QUEUE_ANNOTATION] = scheduling.queue
    elif scheduling.queue:
        labels[names.KUEUE_QUEUE_LABEL] = scheduling.queue
        labels[names.KUEUE_GROUP_LABEL] = job.name
        annotations[names.KUEUE_GROUP_COUNT_ANNOTATION] = str(total_pods)
    return labels, annotations


def node_pod(
    job: TrainingJob,
    *,
    namespace: str,
    job_id: str,
    node: str,
    role: Role,
    owner_uid: str,
    config: OperatorConfig,
    total_pods: int,
) -> Manifest:
    """The pod of one Stalwart node: the node agent as the entry process, which starts the workers of
    whatever slot the controller gives the node (so a standby can take any slot of its template)."""
    scheduling = job.spec.scheduling
    gang_labels, gang_annotations = _gang(job, total_pods)
    labels = {
        **names.job_labels(job.name, namespace),
        names.NODE_LABEL: node,
        names.ROLE_LABEL: role.name,
        **gang_labels,
    }
    env: list[Manifest] = [
        {"name": "STALWART_JOB", "value": job_id},
        {"name": "STALWART_NODE", "value": node},
        {"name": "STALWART_ETCD", "value": config.etcd},
        {"name": "STALWART_WORKDIR", "value": config.pod_workdir},
        {"name": "STALWART_JOB_DIR", "value": config.job_dir},
        {"name": "STALWART_METRICS_PORT", "value": str(config.agent_metrics_port)},
        _field_env("STALWART_POD_NAME", "metadata.name"),
        _field_env("STALWART_POD_NAMESPACE", "metadata.namespace"),
        _field_env("STALWART_MACHINE", "spec.nodeName"),
        _field_env("STALWART_POD_IP", "status.podIP"),
        # The agent's services (memory store, /metrics) listen on the pod's address, not every interface.
        _field_env("STALWART_NODE_ADDRESS", "status.podIP"),
        {
            "name": JOB_TOKEN_ENV,
            "valueFrom": {"secretKeyRef": {"name": names.token_secret_name(job.name), "key": names.TOKEN_SECRET_KEY}},
        },
    ]
    etcd_env, etcd_mounts, etcd_volumes = _etcd_client(config)
    env += etcd_env
    if config.agent_metrics_host:
        env.append({"name": "STALWART_METRICS_HOST", "value": config.agent_metrics_host})
    if config.allowed_paths:
        env.append({"name": ALLOWED_PATHS_ENV, "value": os.pathsep.join(config.allowed_paths)})
    ports = [{"name": name, "containerPort": port, "protocol": "TCP"} for name, port in _named_ports(config)]
    container: Manifest = {
        "name": names.AGENT_CONTAINER,
        "image": role.image or config.agent_image,
        "imagePullPolicy": config.image_pull_policy,
        "command": [config.python, "-m", "stalwart.cli.main", "agent"],
        # $(VAR) is expanded by the kubelet from the container's environment.
        "args": [
            "--job",
            "$(STALWART_JOB)",
            "--node",
            "$(STALWART_NODE)",
            "--etcd",
            "$(STALWART_ETCD)",
            "--workdir",
            "$(STALWART_WORKDIR)",
            "--job-dir",
            "$(STALWART_JOB_DIR)",
        ],
        "workingDir": config.job_dir,
        "env": env,
        "ports": ports,
        "resources": _resources(role),
        "volumeMounts": [
            {"name": WORKDIR_VOLUME, "mountPath": config.pod_workdir},
            {"name": SHM_VOLUME, "mountPath": SHM_PATH},
            *etcd_mounts,
        ],
        "securityContext": copy.deepcopy(CONTAINER_SECURITY),
    }
    spec: Manifest = {
        # A dead agent is a lost node: the controller replaces it (with a standby), not the kubelet.
        "restartPolicy": "Never",
        "hostname": node,
        "subdomain": names.service_name(job.name),
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": config.termination_grace_seconds,
        # The taint keeps the scheduler off a cordoned machine; the affinity also stops a pod that
        # tolerates every taint (operator: Exists) from landing there.
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": names.CORDON_LABEL, "operator": "DoesNotExist"}]}
                    ]
                }
            }
        },
        "securityContext": pod_security(config),
        "containers": [container],
        "volumes": [
            {"name": WORKDIR_VOLUME, "emptyDir": {}},
            {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory"}},
            *etcd_volumes,
        ],
    }
    if scheduling.node_selector:
        spec["nodeSelector"] = dict(scheduling.node_selector)
    if scheduling.tolerations:
        spec["tolerations"] = [t.model_dump(by_alias=True, exclude_none=True) for t in scheduling.tolerations]
    if scheduling.priority_class_name:
        spec["priorityClassName"] = scheduling.priority_class_name
    if scheduling.scheduler_name:
        spec["schedulerName"] = scheduling.scheduler_name
    metadata: Manifest = {
        "name": names.pod_name(job.name, node),
        "namespace": namespace,
        "labels": labels,
        "ownerReferences": [owner_reference(job.name, owner_uid)],
    }
    if gang_annotations:
        metadata["annotations"] = gang_annotations
    if role.template is not None:
        apply_template(metadata, spec, role.template)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def template_problems(job: TrainingJob, config: OperatorConfig) -> list[str]:
    """What a role's template may not do to the operator's pod (the CRD's CEL rules say the same,
    for an API server that runs them); each problem names its field."""
    problems: list[str] = []
    ours = {config.pod_workdir, SHM_PATH, ETCD_TLS_PATH}
    for i, role in enumerate(job.spec.roles):
        if role.template is None:
            continue
        where = f"spec.roles[{i}].template.spec"
        volumes = {str(v.get("name")) for v in role.template.spec.volumes}
        for name in sorted(volumes & OPERATOR_VOLUMES):
            problems.append(f"{where}.volumes: {name!r} is the operator's volume name; use another")
        for container in role.template.spec.containers:
            for e in container.env:
                name = str(e.get("name"))
                if name in OPERATOR_ENV:
                    problems.append(f"{where}.containers[agent].env: {name} is set by the operator")
                elif (why := env_refusal(name)) is not None:  # the workers inherit the agent's environment
                    problems.append(f"{where}.containers[agent].env: {why}")
            for m in container.volume_mounts:
                if m.get("mountPath") in ours:
                    problems.append(f"{where}.containers[agent].volumeMounts: {m['mountPath']} is the operator's")
                if m.get("name") not in volumes | OPERATOR_VOLUMES:
                    problems.append(f"{where}.containers[agent].volumeMounts: no volume named {m.get('name')!r}")
    return problems


def _affinity(ours: Manifest, theirs: dict[str, Any] | None) -> Manifest:
    """The user's affinity, with the operator's required node term (keep off cordoned machines)
    added to each of the user's required node selector terms (terms are ORed, expressions ANDed)."""
    if not theirs:
        return ours
    merged = copy.deepcopy(theirs)
    [our_term] = ours["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    node = merged.setdefault("nodeAffinity", {})
    required = node.setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
    terms = required.get("nodeSelectorTerms") or [{}]
    for term in terms:
        term["matchExpressions"] = [*(term.get("matchExpressions") or []), *our_term["matchExpressions"]]
    required["nodeSelectorTerms"] = terms
    return merged


def _merge_resources(ours: Manifest, theirs: dict[str, Any] | None) -> Manifest:
    """Per resource name, the template's request or limit wins (rdma/*, EFA, hugepages...)."""
    if not theirs:
        return ours
    out: Manifest = {k: dict(v) for k, v in ours.items()}
    for key in ("requests", "limits"):
        if theirs.get(key):
            out[key] = {**out.get(key, {}), **theirs[key]}
    if theirs.get("claims"):
        out["claims"] = list(theirs["claims"])
    return out


def apply_template(metadata: Manifest, spec: Manifest, template: PodTemplateOverride) -> None:
    """Merge a role's template over the operator's pod: labels and annotations are added (the
    operator's win), lists are appended to the operator's, the rest replaces what the operator set."""
    meta, pod = template.metadata, template.spec
    if meta.labels:
        metadata["labels"] = {**meta.labels, **metadata["labels"]}
    if meta.annotations:
        metadata["annotations"] = {**meta.annotations, **metadata.get("annotations", {})}
    for field, value in (
        ("serviceAccountName", pod.service_account_name),
        ("automountServiceAccountToken", pod.automount_service_account_token),
        ("hostNetwork", pod.host_network),
        ("dnsPolicy", pod.dns_policy),
    ):
        if value is not None:
            spec[field] = copy.deepcopy(value)
    if pod.security_context is not None:
        spec["securityContext"] = {**spec["securityContext"], **copy.deepcopy(pod.security_context)}
    if pod.host_network and pod.dns_policy is None:
        spec["dnsPolicy"] = "ClusterFirstWithHostNet"  # keep cluster DNS (the headless Service) on the host network
    if pod.image_pull_secrets:
        spec["imagePullSecrets"] = copy.deepcopy(pod.image_pull_secrets)
    if pod.topology_spread_constraints:
        spec["topologySpreadConstraints"] = copy.deepcopy(pod.topology_spread_constraints)
    if pod.tolerations:
        spec["tolerations"] = [*spec.get("tolerations", []), *copy.deepcopy(pod.tolerations)]
    if pod.volumes:
        spec["volumes"] = [*spec["volumes"], *copy.deepcopy(pod.volumes)]
    spec["affinity"] = _affinity(spec["affinity"], pod.affinity)
    [container] = spec["containers"]
    for override in pod.containers:
        if override.env:
            container["env"] = [*container["env"], *copy.deepcopy(override.env)]
        if override.env_from:
            container["envFrom"] = copy.deepcopy(override.env_from)
        if override.volume_mounts:
            container["volumeMounts"] = [*container["volumeMounts"], *copy.deepcopy(override.volume_mounts)]
        if override.security_context is not None:
            container["securityContext"] = merge_security(container["securityContext"], override.security_context)
        container["resources"] = _merge_resources(container["resources"], override.resources)


def merge_security(ours: Manifest, theirs: dict[str, Any]) -> Manifest:
    """A template's container securityContext over the operator's, key by key (theirs win): adding
    a capability (SYS_PTRACE for py-spy) keeps `drop: [ALL]` and no privilege escalation; a template
    that gives its own `drop` list or sets a key replaces ours for that key only."""
    merged = {**copy.deepcopy(ours), **copy.deepcopy(theirs)}
    capabilities = theirs.get("capabilities")
    if isinstance(capabilities, dict):
        merged["capabilities"] = {**ours.get("capabilities", {}), **copy.deepcopy(capabilities)}
    return merged


def _named_ports(config: OperatorConfig) -> list[tuple[str, int]]:
    """The agent pod's ports, as the pods and the headless Service both name them."""
    named = ((RENDEZVOUS_PORT_NAME, config.rendezvous_port), (METRICS_PORT_NAME, config.agent_metrics_port))
    return [(name, port) for name, port in named if port]


def headless_service(job: TrainingJob, *, namespace: str, owner_uid: str, config: OperatorConfig) -> Manifest:
    """Stable DNS names for the pods (node-3.<service>.<namespace>.svc), ready or not: rank 0 must
    be reachable for the rendezvous before any readiness probe could pass."""
    ports = [{"name": name, "port": port, "protocol": "TCP"} for name, port in _named_ports(config)]
    spec: Manifest = {
        "clusterIP": "None",
        "publishNotReadyAddresses": True,
        "selector": {names.JOB_LABEL: job.name, names.JOB_NAMESPACE_LABEL: namespace},
    }
    if ports:
        spec["ports"] = ports
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": names.service_name(job.name),
            "namespace": namespace,
            "labels": names.job_labels(job.name, namespace),
            "ownerReferences": [owner_reference(job.name, owner_uid)],
        },
        "spec": spec,
    }


def job_token_secret(job: TrainingJob, *, namespace: str, owner_uid: str, token: str) -> Manifest:
    """The job's credential for its pods (an env var each: STALWART_JOB_TOKEN); deleted with the job."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {
            "name": names.token_secret_name(job.name),
            "namespace": namespace,
            "labels": names.job_labels(job.name, namespace),
            "ownerReferences": [owner_reference(job.name, owner_uid)],
        },
        "data": {names.TOKEN_SECRET_KEY: base64.b64encode(token.encode()).decode()},
    }


def volcano_podgroup(job: TrainingJob, *, namespace: str, owner_uid: str) -> Manifest | None:
    """Volcano admits the job's slot pods together (minMember); standbys come on top."""
    scheduling = job.spec.scheduling
    if scheduling.scheduler_name != "volcano":
        return None
    spec: Manifest = {"minMember": job.spec.node_count}
    if scheduling.queue:
        spec["queue"] = scheduling.queue
    if scheduling.priority_class_name:
        spec["priorityClassName"] = scheduling.priority_class_name
    return {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "PodGroup",
        "metadata": {
            "name": names.podgroup_name(job.name),
            "namespace": namespace,
            "labels": names.job_labels(job.name, namespace),
            "ownerReferences": [owner_reference(job.name, owner_uid)],
        },
        "spec": spec,
    }
