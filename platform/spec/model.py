"""The TrainingJob spec: the one model that the CRD, `stalwart run` and the controller share.

Field names are camelCase on the wire (as in every Kubernetes API) and snake_case in Python.
"""

from __future__ import annotations

import re
from enum import Enum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

from stalwart.spec.env_names import refusal
from stalwart.spec.kubernetes import KubernetesShape
from stalwart.spec.messages import brief

API_VERSION = "stalwart.dev/v1alpha1"
KIND = "TrainingJob"

# DNS-1123 label: the name becomes part of etcd keys, pod names and Service names.
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# A checkpoint location: a path, or a URI of a storage tier (stalwart.checkpoint.storage.open_storage).
_URI_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
CHECKPOINT_SCHEMES = ("file", "s3", "mem")
# Linux refuses to exec a process with one argument or NAME=value longer than 128 KiB (MAX_ARG_STRLEN).
MAX_ARG_CHARS = 65_536
MAX_ENV_NAME_CHARS = 256


class SpecModel(BaseModel):
    """Base for spec types: camelCase aliases, unknown fields rejected (typos must not pass silently)."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
    )


def _check_dns_label(value: str) -> str:
    if len(value) > 63 or not _DNS_LABEL.match(value):
        raise ValueError(
            f"{brief(value)} is not a DNS-1123 label (lowercase letters, digits and '-', "
            "starting and ending with a letter or digit, at most 63 characters)"
        )
    return value


class RestartScope(str, Enum):
    """What restarts when one of the role's workers fails."""

    JOB = "Job"  # every role restarts for a new generation (pretraining)
    ROLE = "Role"  # only this role's workers restart (e.g. an RLHF reward model)


class Resources(SpecModel):
    """Per-node resources the operator requests for each pod."""

    gpus: Annotated[int, Field(ge=0, le=64, description="GPUs per node (nvidia.com/gpu).")] = 0
    cpu: Annotated[str | None, Field(description="CPU request, e.g. '32'.")] = None
    memory: Annotated[str | None, Field(description="Memory request, e.g. '512Gi'.")] = None


# The operator's own pod labels, annotations and volumes: a template may not override them.
RESERVED_PREFIX = "stalwart.dev/"
AGENT_CONTAINER = "agent"
MANAGED_BY_STALWART = "stalwart.dev/operator"
_K8S_KEY = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


def _check_meta_keys(what: str, keys: dict[str, str]) -> dict[str, str]:
    for key in keys:
        if key.startswith(RESERVED_PREFIX):
            raise ValueError(f"{what} {key!r}: keys under {RESERVED_PREFIX} are the operator's")
        if len(key) > 316 or not _K8S_KEY.match(key):
            raise ValueError(f"{what} {key!r} is not a Kubernetes label or annotation key ([prefix/]name)")
    return keys


class PodMetadataOverride(SpecModel):
    """Labels and annotations added to the role's pods (Kubernetes only)."""

    labels: Annotated[dict[str, str], Field(max_length=64, description="Labels added to the role's pods.")] = {}
    annotations: Annotated[
        dict[str, str], Field(max_length=64, description="Annotations added to the role's pods.")
    ] = {}

    @field_validator("labels")
    @classmethod
    def _check_labels(cls, labels: dict[str, str]) -> dict[str, str]:
        return _check_meta_keys("label", labels)

    @field_validator("annotations")
    @classmethod
    def _check_annotations(cls, annotations: dict[str, str]) -> dict[str, str]:
        return _check_meta_keys("annotation", annotations)


class ContainerOverride(SpecModel):
    """Fields of the pod's one container (the node agent, whose environment the workers inherit)."""

    name: Annotated[Literal["agent"], Field(description="The container to override: `agent`, the pod's one container.")]
    env: Annotated[list[dict[str, Any]], KubernetesShape("Container.env"), Field(max_length=256)] = []
    env_from: Annotated[list[dict[str, Any]], KubernetesShape("Container.envFrom"), Field(max_length=64)] = []
    volume_mounts: Annotated[list[dict[str, Any]], KubernetesShape("Container.volumeMounts"), Field(max_length=64)] = []
    resources: Annotated[dict[str, Any] | None, KubernetesShape("Container.resources")] = None
    security_context: Annotated[dict[str, Any] | None, KubernetesShape("Container.securityContext")] = None


class PodSpecOverride(SpecModel):
    """Fields of the pod's spec, in Kubernetes' own shapes, merged over what the operator sets."""

    service_account_name: Annotated[str | None, KubernetesShape("PodSpec.serviceAccountName")] = None
    automount_service_account_token: Annotated[bool | None, KubernetesShape("PodSpec.automountServiceAccountToken")] = (
        None
    )
    image_pull_secrets: Annotated[
        list[dict[str, Any]], KubernetesShape("PodSpec.imagePullSecrets"), Field(max_length=64)
    ] = []
    host_network: Annotated[bool | None, KubernetesShape("PodSpec.hostNetwork")] = None
    dns_policy: Annotated[str | None, KubernetesShape("PodSpec.dnsPolicy")] = None
    affinity: Annotated[dict[str, Any] | None, KubernetesShape("PodSpec.affinity")] = None
    tolerations: Annotated[list[dict[str, Any]], KubernetesShape("PodSpec.tolerations"), Field(max_length=64)] = []
    topology_spread_constraints: Annotated[
        list[dict[str, Any]], KubernetesShape("PodSpec.topologySpreadConstraints"), Field(max_length=16)
    ] = []
    volumes: Annotated[list[dict[str, Any]], KubernetesShape("PodSpec.volumes"), Field(max_length=64)] = []
    security_context: Annotated[dict[str, Any] | None, KubernetesShape("PodSpec.securityContext")] = None
    containers: Annotated[
        list[ContainerOverride],
        Field(max_length=1, description="The agent container's overrides (one entry, named `agent`)."),
    ] = []


class PodTemplateOverride(SpecModel):
    """Kubernetes only (`stalwart run` ignores it): merged over the pod the operator makes for each of
    the role's nodes. Lists (env, volumes, tolerations...) are added to the operator's; an entry with
    the name of one of the operator's is refused; scalars and objects replace the operator's."""

    metadata: Annotated[PodMetadataOverride, Field(description="Labels and annotations of the pods.")] = (
        PodMetadataOverride()
    )
    spec: Annotated[PodSpecOverride, Field(description="Fields of the pod spec.")] = PodSpecOverride()


class Parallelism(SpecModel):
    """How a role's ranks split the model. Data parallelism is what is left of the role's world
    (replicas x processesPerNode) once tensor, context and pipeline parallelism are taken out.

    Ranks are laid out as Megatron-core lays them out by default, tensor fastest and pipeline
    slowest (see stalwart.spec.topology): rank = tp + TP * (cp + CP * (dp + DP * pp)).
    """

    tensor: Annotated[int, Field(ge=1, le=4096, description="Tensor-parallel size (TP).")] = 1
    pipeline: Annotated[int, Field(ge=1, le=4096, description="Pipeline-parallel size (PP): stages.")] = 1
    context: Annotated[int, Field(ge=1, le=4096, description="Context-parallel size (CP).")] = 1
    expert: Annotated[
        int,
        Field(
            ge=1, le=4096, description="Expert-parallel size (EP); it subdivides data parallelism, so it divides DP."
        ),
    ] = 1

    @property
    def model_parallel(self) -> int:
        """Ranks that hold one model replica: TP x CP x PP."""
        return self.tensor * self.context * self.pipeline

    def problem(self, world: int) -> str | None:
        """Why this layout cannot split a world of `world` ranks, or None."""
        mp = self.model_parallel
        if world % mp:
            return (
                f"tensor {self.tensor} x context {self.context} x pipeline {self.pipeline} = {mp} "
                f"does not divide the world of {world} ranks (data parallelism would be {world}/{mp})"
            )
        if (world // mp) % self.expert:
            return f"expert {self.expert} does not divide the data-parallel size {world // mp}"
        return None

    def data_parallel(self, world: int) -> int:
        """DP for a world of `world` ranks; raises ValueError when the layout does not fit it."""
        problem = self.problem(world)
        if problem:
            raise ValueError(problem)
        return world // self.model_parallel


class NodeHealth(SpecModel):
    """What a node of this role must have, for its agent's probes and pre-flight to judge it by."""

    expected_gpus: Annotated[
        int | None,
        Field(
            ge=0,
            le=64,
            description="GPUs each node must show (NVML or nvidia-smi). Fewer is a machine fault (gpu_missing): "
            "the node is refused at pre-flight and evicted while running. None: not checked.",
        ),
    ] = None
    required_nics: Annotated[
        list[Annotated[str, Field(min_length=1, max_length=64)]],
        Field(
            max_length=64,
            description="Network interfaces the job's traffic uses (e.g. ib0, eth1): one down or absent is a "
            "machine fault (nic_down). Others down are reported as info only.",
        ),
    ] = []
    watched_disks: Annotated[
        list[Annotated[str, Field(min_length=1, max_length=4096)]],
        Field(
            max_length=64,
            description="Paths whose disk is watched: full is a machine fault (disk_full), missing one too "
            "(mount_missing).",
        ),
    ] = ["/"]
    writable_paths: Annotated[
        list[Annotated[str, Field(min_length=1, max_length=4096)]],
        Field(
            max_length=64,
            description="Paths that must be on a writable mount (checkpoints, scratch): a read-only one is a "
            "machine fault (mount_read_only).",
        ),
    ] = []
    kernel_log_window_minutes: Annotated[
        int | None,
        Field(
            ge=1,
            le=10_080,
            description="Kernel-log evidence (Xid, ECC, fallen off the bus, panics) counts only from the last N "
            "minutes. None: only what was logged since the node's agent started.",
        ),
    ] = None
    min_bus_bandwidth_gbps: Annotated[
        float | None,
        Field(
            gt=0,
            le=1e5,
            description="Bus bandwidth floor (GB/s, as nccl-tests reports it) for the node checks' collectives. "
            "None: a node is judged against its peers' median (below half of it fails).",
        ),
    ] = None


class Role(SpecModel):
    """A group of identical nodes running the same command (trainer, actor, rollout, ...)."""

    name: Annotated[str, Field(description="Role name, unique within the job (a DNS-1123 label).")]
    replicas: Annotated[int, Field(ge=1, le=100_000, description="Number of nodes in this role.")] = 1
    min_replicas: Annotated[
        int | None,
        Field(
            ge=1,
            le=100_000,
            description="Elastic lower bound (at most replicas): a lost node with no standby left and no "
            "machine free shrinks the role's data parallelism (a TP, CP or PP group leaves whole) down to "
            "this many nodes at the least, rather than wait; it grows back to replicas at a checkpoint when "
            "capacity returns. Unset: the role always runs exactly `replicas` nodes.",
        ),
    ] = None
    max_replicas: Annotated[
        int | None,
        Field(
            ge=1,
            le=100_000,
            description="Elastic upper bound (at least replicas). Validated and recorded only: the "
            "controller grows a role back to `replicas`, never beyond.",
        ),
    ] = None
    processes_per_node: Annotated[
        int, Field(ge=1, le=64, description="Worker processes per node (usually one per GPU).")
    ] = 1
    warm_imports: Annotated[
        list[Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$", max_length=200)]],
        Field(
            max_length=64,
            description="Python modules the node's fork server imports before it forks this role's workers "
            "(faultTolerance.warmWorkers), beside torch: the frameworks the script imports (transformers, "
            "lightning), so a restarted worker does not import them again. Only modules that start no "
            "thread at import; one that fails to import is left to the worker.",
        ),
    ] = []
    command: Annotated[
        list[Annotated[str, Field(max_length=MAX_ARG_CHARS)]],
        Field(min_length=1, max_length=256, description="Worker command, run once per process."),
    ]
    env: Annotated[
        dict[str, str],
        Field(
            max_length=256,
            description="Extra environment variables for the workers. The platform's (RANK, MASTER_ADDR, "
            "STALWART_*, TORCHELASTIC_*, ...) and the dynamic loader's (LD_*) are refused.",
        ),
    ] = {}
    working_dir: Annotated[
        str | None,
        Field(
            description="Working directory of the workers; relative paths are relative to the job file. It must "
            "lie inside the job's folder or a folder the administrator allows (STALWART_ALLOWED_PATHS)."
        ),
    ] = None
    restart_scope: Annotated[
        RestartScope, Field(description="What restarts when a worker of this role fails: Job or Role.")
    ] = RestartScope.JOB
    standbys: Annotated[
        int | None,
        Field(
            ge=0,
            le=1024,
            description="Warm standbys kept for this role alone: a standby takes only this role's nodes "
            "(on Kubernetes it runs the role's pod template). Default: spec.standbys, sized from this "
            "role's replicas.",
        ),
    ] = None
    peak_flops_per_worker: Annotated[
        float | None,
        Field(
            gt=0,
            le=1e18,
            description="Peak FLOP/s of one worker's accelerator (e.g. 989e12 for an H100's dense BF16): with the "
            "FLOPs the workers report per step, the job's model FLOPs utilization (MFU). None: no MFU.",
        ),
    ] = None
    image: Annotated[str | None, Field(description="Container image of the role's pods (Kubernetes only).")] = None
    resources: Annotated[Resources, Field(description="Per-node resources (Kubernetes only).")] = Resources()
    template: Annotated[
        PodTemplateOverride | None,
        Field(
            description="Kubernetes only: pod fields in Kubernetes' own shapes (env from Secrets, volumes, "
            "resources such as rdma/* or EFA, security context, affinity, tolerations, topology spread, "
            "service account, image pull secrets, host network, labels and annotations), merged over "
            "the pod the operator makes. `stalwart run` ignores it."
        ),
    ] = None

    parallelism: Annotated[
        Parallelism,
        Field(
            description="Tensor, pipeline, context and expert parallel sizes; data parallelism is "
            "replicas x processesPerNode / (tensor x context x pipeline)."
        ),
    ] = Parallelism()
    health: Annotated[
        NodeHealth,
        Field(description="What each node of this role must have (GPUs, NICs, disks), and how its probes judge it."),
    ] = NodeHealth()

    @field_validator("name")
    @classmethod
    def _check_name(cls, v: str) -> str:
        return _check_dns_label(v)

    @model_validator(mode="after")
    def _elastic_bounds(self) -> Role:
        if self.min_replicas is not None and self.min_replicas > self.replicas:
            raise ValueError(f"minReplicas ({self.min_replicas}) must not exceed replicas ({self.replicas})")
        if self.max_replicas is not None and self.max_replicas < self.replicas:
            raise ValueError(f"maxReplicas ({self.max_replicas}) must not be below replicas ({self.replicas})")
        return self

    @field_validator("env")
    @classmethod
    def _check_env(cls, env: dict[str, str]) -> dict[str, str]:
        problems = []
        for key, value in env.items():
            if len(key) > MAX_ENV_NAME_CHARS or not _ENV_NAME.match(key):
                problems.append(f"{brief(key)} is not a valid environment variable name")
            elif (why := refusal(key)) is not None:
                problems.append(why)
            elif len(value) > MAX_ARG_CHARS:
                problems.append(f"{key}'s value has {len(value):,} characters; at most {MAX_ARG_CHARS:,}")
        if problems:
            more = f"; and {len(problems) - 5} more" if len(problems) > 5 else ""
            raise ValueError("; ".join(problems[:5]) + more)
        return env

    @model_validator(mode="after")
    def _layout_fits_the_world(self) -> Role:
        problem = self.parallelism.problem(self.world_size)
        if problem:
            raise ValueError(
                f"role {self.name!r}: parallelism does not fit its {self.world_size} ranks "
                f"({self.replicas} replicas x {self.processes_per_node} processesPerNode): {problem}"
            )
        return self

    @property
    def world_size(self) -> int:
        return self.replicas * self.processes_per_node

    @property
    def data_parallel(self) -> int:
        return self.parallelism.data_parallel(self.world_size)


class FaultTolerance(SpecModel):
    """How failures are detected: heartbeats, leases, hang and slowdown thresholds, checks."""

    heartbeat_interval_seconds: Annotated[
        float, Field(gt=0, le=60, description="How often each node agent renews its lease and reports.")
    ] = 1.0
    lease_ttl_seconds: Annotated[
        int, Field(ge=2, le=600, description="A node whose lease lapses for this long is lost.")
    ] = 5
    stop_grace_seconds: Annotated[
        float, Field(ge=0, le=600, description="SIGTERM-to-SIGKILL grace period for workers.")
    ] = 5.0
    etcd_outage_seconds: Annotated[
        float,
        Field(
            ge=1,
            le=3600,
            description="How long the job rides out an unreachable etcd (a restart, a pause): workers keep "
            "training and nodes re-register when it answers. Past this, agents stop their workers and "
            "`stalwart run` stops the job.",
        ),
    ] = 60.0
    preflight: Annotated[
        bool,
        Field(description="Run collective and compute checks on the nodes before the job starts; evict failures."),
    ] = True
    stop_time_checks: Annotated[
        bool,
        Field(
            description="After a crash, a NaN or a hang with no clear suspect, run the collective and "
            "compute checks on the job's nodes and evict the ones that fail."
        ),
    ] = True
    warm_workers: Annotated[
        bool,
        Field(
            description="Fork workers from one Python process per node that has torch already imported "
            "(a fork server), so no worker and no restart pays the import (only for commands of the form "
            "`python script.py ...`; others start cold)."
        ),
    ] = True
    hang_timeout_multiplier: Annotated[
        float,
        Field(
            ge=2,
            le=1000,
            description="A job is hung when no rank progresses for this many recent "
            "step times (never less than hangTimeoutFloorSeconds).",
        ),
    ] = 10.0
    hang_timeout_floor_seconds: Annotated[
        float, Field(ge=0.5, le=86_400, description="The shortest hang timeout, whatever the step time.")
    ] = 60.0
    first_step_timeout_seconds: Annotated[
        float,
        Field(
            ge=1,
            le=86_400,
            description="Time a new generation may take to reach its first step "
            "(process start, imports, checkpoint load) before it counts as hung.",
        ),
    ] = 600.0
    restart_timeout_seconds: Annotated[
        float,
        Field(
            ge=1,
            le=86_400,
            description="How long a restart may wait for its nodes to register (a replacement for a lost node "
            "when no standby is left, on a cluster with no free machine) before the job fails, naming the "
            "nodes it lacks.",
        ),
    ] = 600.0
    slowdown_factor: Annotated[
        float, Field(gt=1, le=100, description="A node whose step time is this many times the median is slow.")
    ] = 2.0
    slowdown_rounds: Annotated[
        int,
        Field(
            ge=1,
            le=100,
            description="Consecutive diagnosis rounds that must flag the same node before a slow node is evicted.",
        ),
    ] = 3
    straggler_threshold: Annotated[
        float,
        Field(
            gt=0,
            lt=1,
            description="A rank whose relative performance score (its data-parallel peers' median own-work "
            "time per step over its own) stays under this for stragglerWindowSeconds is a straggler: its "
            "node is evicted, whatever the job's overall pace.",
        ),
    ] = 0.8
    straggler_window_seconds: Annotated[
        float,
        Field(ge=1, le=86_400, description="How long a rank's score must stay under stragglerThreshold."),
    ] = 30.0
    straggler_warmup_steps: Annotated[
        int,
        Field(ge=0, le=100_000, description="Steps of each generation that are not scored (restart warm-up)."),
    ] = 20
    throughput_decline: Annotated[
        float,
        Field(
            gt=0,
            lt=1,
            description="A job whose throughput (tokens/s, or steps/s where no tokens are reported) stays this "
            "fraction under its generation's baseline for throughputDeclineWindowSeconds, with no straggler "
            "named, is an MFUDecline: the stop-time checks run on its nodes.",
        ),
    ] = 0.1
    throughput_decline_window_seconds: Annotated[
        float,
        Field(
            ge=10,
            le=86_400,
            description="How long the throughput must stay down; the baseline is the median over the first such "
            "window after the warm-up.",
        ),
    ] = 300.0
    loss_spike_factor: Annotated[
        float, Field(gt=1, le=1000, description="A loss this many times the recent mean is a spike.")
    ] = 5.0
    nic_flap_count: Annotated[
        int, Field(ge=1, le=100, description="NIC-down events within nicFlapWindowSeconds that evict a node.")
    ] = 2
    nic_flap_window_seconds: Annotated[
        float, Field(gt=0, le=86_400, description="Window for counting NIC-down events.")
    ] = 300.0

    @model_validator(mode="after")
    def _lease_outlives_heartbeats(self) -> FaultTolerance:
        if self.lease_ttl_seconds < 2 * self.heartbeat_interval_seconds:
            raise ValueError(
                "leaseTtlSeconds must be at least twice heartbeatIntervalSeconds, "
                f"got {self.lease_ttl_seconds} and {self.heartbeat_interval_seconds}"
            )
        return self


class FailureEvent(str, Enum):
    """What went wrong, as the controller classifies it (ByteRobust's ladder, cheapest signal first)."""

    MACHINE_FAULT = "MachineFault"  # GPU lost, Xid, ECC, disk full, NIC flapping: a machine signal
    LOST_NODE = "LostNode"  # the node's lease lapsed
    WORKER_CRASH = "WorkerCrash"  # a worker exited non-zero, no more specific class
    USER_CODE_ERROR = "UserCodeError"  # the same Python exception on every failing rank
    NAN_LOSS = "NaNLoss"
    LOSS_SPIKE = "LossSpike"
    HANG = "Hang"  # no progress for longer than the adaptive timeout
    SLOWDOWN = "Slowdown"  # one node persistently slower than the rest
    MFU_DECLINE = "MFUDecline"  # the job's throughput down for a while, no straggler named
    PREFLIGHT_FAILED = "PreflightFailed"
    CODE_UPDATE = "CodeUpdate"  # not a failure: a forced restart to apply a new codeVersion
    # Not a failure: capacity came back to a role running below its replicas (minReplicas), and it
    # grows back at a checkpoint boundary.
    ELASTIC_GROW = "ElasticGrow"


class FailureAction(str, Enum):
    RESTART = "Restart"  # new generation on the same nodes (after stop-time checks, if enabled)
    EVICT = "Evict"  # evict the suspect node(s), hot-swap standbys in, restart the rest in place
    ROLLBACK = "Rollback"  # restart from a checkpoint before the newest one, after stop-time checks
    FAIL = "Fail"  # fail the job with the event as its reason
    IGNORE = "Ignore"  # record an incident, do nothing (e.g. slowdowns you tolerate)


# Machine-caused events never count against maxRestarts: the job did nothing wrong.
INFRASTRUCTURE_EVENTS = frozenset(
    {
        FailureEvent.MACHINE_FAULT,
        FailureEvent.LOST_NODE,
        FailureEvent.PREFLIGHT_FAILED,
        FailureEvent.HANG,
        FailureEvent.SLOWDOWN,
        FailureEvent.MFU_DECLINE,
        FailureEvent.CODE_UPDATE,
        FailureEvent.ELASTIC_GROW,
    }
)

DEFAULT_ACTIONS: dict[FailureEvent, FailureAction] = {
    FailureEvent.MACHINE_FAULT: FailureAction.EVICT,
    FailureEvent.LOST_NODE: FailureAction.EVICT,
    FailureEvent.WORKER_CRASH: FailureAction.RESTART,
    FailureEvent.USER_CODE_ERROR: FailureAction.RESTART,  # retried userCodeRetries times, then Fail
    FailureEvent.NAN_LOSS: FailureAction.ROLLBACK,
    FailureEvent.LOSS_SPIKE: FailureAction.ROLLBACK,
    FailureEvent.HANG: FailureAction.EVICT,
    FailureEvent.SLOWDOWN: FailureAction.EVICT,
    FailureEvent.MFU_DECLINE: FailureAction.RESTART,  # after the stop-time checks, which may evict
    FailureEvent.PREFLIGHT_FAILED: FailureAction.EVICT,
    FailureEvent.CODE_UPDATE: FailureAction.RESTART,
    FailureEvent.ELASTIC_GROW: FailureAction.RESTART,
}


class RecoveryMode(str, Enum):
    HOT_SWAP = "HotSwap"  # healthy nodes keep their agents; evicted nodes' ranks go to warm standbys
    REQUEUE = "Requeue"  # every node is relaunched, as a resubmitted job would be (the baseline)


class FailurePolicyRule(SpecModel):
    """One rung of the ladder: on `event`, take `action`."""

    event: Annotated[FailureEvent, Field(description="The failure event this rule matches.")]
    action: Annotated[
        FailureAction, Field(description="What the controller does: Restart, Evict, Rollback, Fail or Ignore.")
    ]


class FailurePolicy(SpecModel):
    """What the controller does about each kind of failure, and how much restarting it may do."""

    max_restarts: Annotated[
        int,
        Field(
            ge=0,
            le=10_000,
            description="Restarts the job's own failures may cause before it fails. "
            "Restarts caused by the infrastructure (machine faults, lost nodes, hangs) do not count.",
        ),
    ] = 3
    user_code_retries: Annotated[
        int,
        Field(
            ge=0, le=100, description="Restarts after a user-code exception before the job fails with UserCodeError."
        ),
    ] = 1
    rollback_checkpoints: Annotated[
        int, Field(ge=1, le=100, description="On Rollback, skip this many of the newest checkpoints.")
    ] = 1
    rules: Annotated[
        list[FailurePolicyRule],
        Field(max_length=32, description="Event to action rules; events without a rule take the default ladder."),
    ] = []
    recovery: Annotated[
        RecoveryMode,
        Field(
            description="HotSwap (default) restarts workers in place and swaps standbys in; "
            "Requeue relaunches every node, as resubmitting the job would (for comparison)."
        ),
    ] = RecoveryMode.HOT_SWAP
    replay_after: Annotated[
        int,
        Field(
            ge=0,
            le=100,
            description="Dual-phase replay, the last rung: after this many failures in a "
            "row that no check explains (0: never), replay the job on groups of its nodes to find the "
            "faulty one.",
        ),
    ] = 2
    replay_steps: Annotated[
        int,
        Field(
            ge=1,
            le=100_000,
            description="Training steps each replay group runs (from scratch, on a scratch checkpoint folder) to pass.",
        ),
    ] = 20

    @field_validator("rules")
    @classmethod
    def _one_rule_per_event(cls, rules: list[FailurePolicyRule]) -> list[FailurePolicyRule]:
        seen: set[FailureEvent] = set()
        for rule in rules:
            if rule.event in seen:
                raise ValueError(f"event {rule.event.value!r} has more than one rule")
            seen.add(rule.event)
        return rules

    def action_for(self, event: FailureEvent) -> FailureAction:
        return next((r.action for r in self.rules if r.event is event), DEFAULT_ACTIONS[event])


class StandbySettings(SpecModel):
    """Warm standby nodes: pre-flight checked, checkpoint pre-loaded, waiting to take a failed node's ranks."""

    count: Annotated[
        int | None,
        Field(
            ge=0,
            le=1024,
            description="Standby nodes to keep warm. Default: sized from "
            "nodeFailureProbability as the 99th percentile of concurrent failures.",
        ),
    ] = None
    node_failure_probability: Annotated[
        float,
        Field(
            gt=0,
            lt=1,
            description="Chance that one node fails within one replacement window; "
            "the default matches ByteRobust's table (2 standbys for 128-256 nodes, 4 for 1,024).",
        ),
    ] = 0.0012
    minimum: Annotated[int, Field(ge=0, le=1024, description="Never keep fewer standbys than this.")] = 1
    preload_checkpoint: Annotated[
        bool,
        Field(
            description="While it waits, each standby copies the newest in-memory checkpoint into its "
            "own memory store (when it fits in half of checkpoint.memoryCapacityGib), so the ranks it "
            "takes over load locally instead of from other nodes on the recovery's critical path."
        ),
    ] = True


class CleanPodPolicy(str, Enum):
    ALL = "All"  # delete every pod when the job finishes
    RUNNING = "Running"  # delete the pods still running; keep finished ones for their logs
    NONE = "None"  # keep every pod


class Toleration(SpecModel):
    key: str | None = None
    operator: Annotated[str, Field(pattern=r"^(Exists|Equal)$")] = "Equal"
    value: str | None = None
    effect: Annotated[str | None, Field(pattern=r"^(NoSchedule|PreferNoSchedule|NoExecute)$")] = None
    toleration_seconds: int | None = None


class Scheduling(SpecModel):
    """Placement hints for the Kubernetes operator (ignored by `stalwart run`)."""

    node_selector: Annotated[dict[str, str], Field(max_length=64, description="Node labels the pods require.")] = {}
    tolerations: Annotated[list[Toleration], Field(max_length=64, description="Taints the pods tolerate.")] = []
    priority_class_name: Annotated[str | None, Field(description="PriorityClass of the pods.")] = None
    scheduler_name: Annotated[
        str | None, Field(description="Scheduler for gang scheduling, e.g. volcano; default: the cluster's.")
    ] = None
    queue: Annotated[str | None, Field(description="Volcano queue or Kueue LocalQueue name for gang admission.")] = None


class CheckpointSettings(SpecModel):
    """Where and how often workers checkpoint."""

    uri: Annotated[
        str | None,
        Field(
            description="Checkpoint location: a path or file:// URI inside the job's folder (or a folder the "
            "administrator allows), or an s3:// or mem:// URI. Default: the run's own folder."
        ),
    ] = None
    interval_steps: Annotated[int, Field(ge=1, le=10_000_000, description="Save every this many steps.")] = 10
    keep_last: Annotated[int, Field(ge=1, le=1000, description="Committed checkpoints to keep.")] = 3
    memory: Annotated[
        bool,
        Field(
            description="Also keep checkpoints in host memory, on the node and on a peer node, so "
            "that a restart loads from memory when the copy is intact and from storage otherwise."
        ),
    ] = True
    memory_capacity_gib: Annotated[
        float, Field(gt=0, le=4096, description="Host memory each node's checkpoint store may use.")
    ] = 16.0
    save_before_suspend_seconds: Annotated[
        float,
        Field(
            ge=0,
            le=3600,
            description="Before a running job suspends (spec.suspend: Kueue's preemption, `stalwart suspend`), "
            "its workers are asked to checkpoint (worker_sdk.checkpoint_requested) and given this long to "
            "commit; then they stop whether it came or not (a Warning Event says so). 0: stop at once.",
        ),
    ] = 120.0

    @field_validator("uri")
    @classmethod
    def _known_scheme(cls, uri: str | None) -> str | None:
        match = _URI_SCHEME.match(uri) if uri else None
        if match and match.group(1).lower() not in CHECKPOINT_SCHEMES:
            raise ValueError(f"unsupported URI scheme {brief(match.group(1))}: use a path, file://, s3:// or mem://")
        if uri is not None and not uri.strip():
            raise ValueError("an empty location: leave uri out to checkpoint in the run's folder")
        return uri


class DataSource(SpecModel):
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$", description="Source name.")]
    shards: Annotated[
        list[str],
        Field(min_length=1, max_length=1024, description="Token shard files or globs (relative: to the job file)."),
    ]
    weight: Annotated[float, Field(gt=0, description="Mixture weight (relative to the other sources).")] = 1.0
    format: Annotated[
        Literal["stok", "hf", "megatron"],
        Field(
            description="stok: Stalwart's token shards; hf: Hugging Face data files (parquet, jsonl, arrow) "
            "tokenized with `tokenizer`; megatron: Megatron indexed datasets (the .bin files, .idx beside them)."
        ),
    ] = "stok"
    tokenizer: Annotated[
        str | None, Field(max_length=4096, description="hf: a tokenizers tokenizer.json (relative: to the job file).")
    ] = None
    text_field: Annotated[str, Field(min_length=1, max_length=256, description="hf: the text column.")] = "text"
    eos_token: Annotated[str | None, Field(max_length=256, description="hf: a token appended after each document.")] = (
        None
    )
    index_dir: Annotated[
        str | None,
        Field(max_length=4096, description="hf, megatron: folder of the one-time index (relative: to the job file)."),
    ] = None

    @model_validator(mode="after")
    def _check_format(self) -> DataSource:
        if self.format == "hf" and not self.tokenizer:
            raise ValueError(f"data source {self.name!r}: format hf needs a tokenizer (a tokenizer.json)")
        if self.format != "hf" and self.tokenizer:
            raise ValueError(f"data source {self.name!r}: a tokenizer is only read for format hf")
        return self


class GlobalBatchOnResize(str, Enum):
    """What a step trains on while a role runs below its replicas (elastic data parallelism)."""

    KEEP = "Keep"  # the declared global batch: each rank takes a larger share, in accumulated micro-batches
    SCALE = "Scale"  # each rank keeps microBatch: the global batch shrinks with data parallelism


class DataSettings(SpecModel):
    """The deterministic data loader; with it, each node runs a shadow loader beside its workers."""

    sources: Annotated[list[DataSource], Field(min_length=1, max_length=64)]
    seq_len: Annotated[int, Field(ge=1, le=1 << 20, description="Tokens per sample (packed).")]
    micro_batch: Annotated[int, Field(ge=1, le=65536, description="Samples per rank per step.")] = 8
    seed: Annotated[int, Field(ge=0, description="Seed of the global sample order.")] = 0
    global_batch_on_resize: Annotated[
        GlobalBatchOnResize,
        Field(
            description="While a role runs below its replicas (minReplicas): Keep, every step still trains on "
            "the declared global batch (replicas' data parallelism x microBatch), each rank taking its larger "
            "share in accumulated micro-batches of at most microBatch (STALWART_DATA_MICRO_BATCH x "
            "STALWART_DATA_ACCUMULATION); Scale, each rank keeps microBatch and the global batch shrinks. "
            "With Keep, a size whose data parallelism does not divide the global batch is skipped."
        ),
    ] = GlobalBatchOnResize.KEEP


class DataPlaneSettings(SpecModel):
    """RLHF: the data plane between the roles (stalwart.rlhf), not through etcd. Weights go from the
    actor to the rollouts, versioned; trajectories go from the rollouts through the reward and the
    reference to the actor, through a relay with a bounded buffer. One section for the whole job: the
    bounds are contracts between roles (the actor refuses what the rollouts must not produce)."""

    max_weight_staleness: Annotated[
        int,
        Field(
            ge=0,
            le=1000,
            description="A trajectory for the actor's step t is generated with the weights of step "
            "t - 1 - maxWeightStaleness or newer (0: synchronous, on-policy GRPO). Rollouts wait for "
            "newer weights rather than exceed it, and the actor refuses anything older.",
        ),
    ] = 1
    relay_capacity: Annotated[
        int,
        Field(
            ge=1,
            le=1_000_000,
            description="Prompt groups the relay holds at once (waiting, being generated, scored or "
            "ready): the bound on its memory and on the work lost with it.",
        ),
    ] = 64
    lease_seconds: Annotated[
        float,
        Field(
            gt=0,
            le=86_400,
            description="A rollout, reward or reference worker that holds a prompt group this long "
            "without returning it loses it to another worker (a dead worker's groups return at once).",
        ),
    ] = 60.0


class TrainingJobSpec(SpecModel):
    roles: Annotated[list[Role], Field(min_length=1, max_length=16, description="The job's roles, as a named list.")]
    fault_tolerance: FaultTolerance = FaultTolerance()
    failure_policy: FailurePolicy = FailurePolicy()
    standbys: StandbySettings = StandbySettings()
    checkpoint: CheckpointSettings = CheckpointSettings()
    data: DataSettings | None = None
    data_plane: Annotated[
        DataPlaneSettings | None,
        Field(description="RLHF: the data plane between roles (weights, trajectories). Unset: none."),
    ] = None
    code_version: Annotated[
        str | None,
        Field(
            max_length=128,
            description="Version of the training code. Changing it updates the "
            "workers lazily, at the next restart, or at hotUpdateDeadlineSeconds at the latest.",
        ),
    ] = None
    hot_update_deadline_seconds: Annotated[
        float | None,
        Field(
            gt=0,
            le=7 * 86_400,
            description="Force a restart this long after codeVersion "
            "changed if no failure restarted the job first. Default: wait for a restart.",
        ),
    ] = None
    suspend: Annotated[bool, Field(description="Stop the job's pods and keep its state; resume by unsetting.")] = False
    managed_by: Annotated[
        str,
        Field(
            max_length=63,
            pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_./]*[A-Za-z0-9])?$",
            description="The controller that runs this job (a domain-prefixed path; immutable). The "
            f"Stalwart operator runs only jobs managed by {MANAGED_BY_STALWART}; any other value (e.g. "
            "kueue.x-k8s.io/multikueue) leaves the job, its status included, to that controller.",
        ),
    ] = MANAGED_BY_STALWART
    active_deadline_seconds: Annotated[
        int | None,
        Field(
            ge=1,
            le=365 * 86_400,
            description="Kubernetes only: fail the job (reason DeadlineExceeded) once it has been active "
            "this long, counted from status.startTime or from its last resume, whichever is later. "
            "`stalwart run` ignores it (it has --timeout).",
        ),
    ] = None
    ttl_seconds_after_finished: Annotated[
        int | None, Field(ge=0, le=365 * 86_400, description="Delete the finished job this long after it ends.")
    ] = None
    clean_pod_policy: Annotated[
        CleanPodPolicy, Field(description="Which pods to delete when the job finishes: All, Running or None.")
    ] = CleanPodPolicy.ALL
    scheduling: Scheduling = Scheduling()

    @field_validator("roles")
    @classmethod
    def _unique_role_names(cls, roles: list[Role]) -> list[Role]:
        seen: set[str] = set()
        for role in roles:
            if role.name in seen:
                raise ValueError(f"role name {role.name!r} appears more than once")
            seen.add(role.name)
        return roles

    @property
    def world_size(self) -> int:
        return sum(r.replicas * r.processes_per_node for r in self.roles)

    @property
    def node_count(self) -> int:
        return sum(r.replicas for r in self.roles)


class ObjectMeta(SpecModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore", frozen=True)

    name: str
    namespace: str = "default"
    labels: dict[str, str] = {}

    @field_validator("name")
    @classmethod
    def _check_name(cls, v: str) -> str:
        return _check_dns_label(v)


class TrainingJob(SpecModel):
    """A whole TrainingJob document, in the same shape as the Kubernetes custom resource."""

    api_version: Annotated[str, Field(alias="apiVersion")]
    kind: str
    metadata: ObjectMeta
    spec: TrainingJobSpec

    @field_validator("api_version")
    @classmethod
    def _check_api_version(cls, v: str) -> str:
        if v != API_VERSION:
            raise ValueError(f"expected {API_VERSION!r}, got {brief(v)}")
        return v

    @field_validator("kind")
    @classmethod
    def _check_kind(cls, v: str) -> str:
        if v != KIND:
            raise ValueError(f"expected {KIND!r}, got {brief(v)}")
        return v

    @property
    def name(self) -> str:
        return self.metadata.name
