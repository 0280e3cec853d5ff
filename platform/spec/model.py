"""The TrainingJob spec: the one model that the CRD, `stalwart run` and the controller share.

Field names are camelCase on the wire (as in every Kubernetes API) and snake_case in Python.
"""

from __future__ import annotations

import re
from enum import Enum
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

API_VERSION = "stalwart.dev/v1alpha1"
KIND = "TrainingJob"

# DNS-1123 label: the name becomes part of etcd keys, pod names and Service names.
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


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
            f"{value!r} is not a DNS-1123 label (lowercase letters, digits and '-', "
            "starting and ending with a letter or digit, at most 63 characters)"
        )
    return value


class RestartScope(str, Enum):
    """What restarts when one of the role's workers fails."""

    JOB = "Job"  # every role restarts for a new generation (pretraining)
    ROLE = "Role"  # only this role's workers restart (e.g. an RLHF reward model)


class Role(SpecModel):
    """A group of identical nodes running the same command (trainer, actor, rollout, ...)."""

    name: Annotated[str, Field(description="Role name, unique within the job (a DNS-1123 label).")]
    replicas: Annotated[int, Field(ge=1, le=100_000, description="Number of nodes in this role.")] = 1
    processes_per_node: Annotated[
        int, Field(ge=1, le=64, description="Worker processes per node (usually one per GPU).")
    ] = 1
    command: Annotated[
        list[str],
        Field(min_length=1, max_length=256, description="Worker command, run once per process."),
    ]
    env: Annotated[
        dict[str, str],
        Field(max_length=256, description="Extra environment variables for the workers."),
    ] = {}
    working_dir: Annotated[
        str | None,
        Field(description="Working directory of the workers; relative paths are relative to the job file."),
    ] = None
    restart_scope: Annotated[
        RestartScope, Field(description="What restarts when a worker of this role fails: Job or Role.")
    ] = RestartScope.JOB

    @field_validator("name")
    @classmethod
    def _check_name(cls, v: str) -> str:
        return _check_dns_label(v)

    @field_validator("env")
    @classmethod
    def _check_env(cls, env: dict[str, str]) -> dict[str, str]:
        for key in env:
            if not _ENV_NAME.match(key):
                raise ValueError(f"{key!r} is not a valid environment variable name")
        return env


class FaultTolerance(SpecModel):
    """How failures are detected and how much restarting the job may do."""

    heartbeat_interval_seconds: Annotated[
        float, Field(gt=0, le=60, description="How often each node agent renews its lease and reports.")
    ] = 1.0
    lease_ttl_seconds: Annotated[
        int, Field(ge=2, le=600, description="A node whose lease lapses for this long is lost.")
    ] = 5
    max_restarts: Annotated[
        int, Field(ge=0, le=10_000, description="Restarts allowed before the job fails.")
    ] = 3
    stop_grace_seconds: Annotated[
        float, Field(ge=0, le=600, description="SIGTERM-to-SIGKILL grace period for workers.")
    ] = 5.0
    preflight: Annotated[
        bool,
        Field(description="Run collective and compute checks on the nodes before the job starts; evict failures."),
    ] = True

    @model_validator(mode="after")
    def _lease_outlives_heartbeats(self) -> FaultTolerance:
        if self.lease_ttl_seconds < 2 * self.heartbeat_interval_seconds:
            raise ValueError(
                "leaseTtlSeconds must be at least twice heartbeatIntervalSeconds, "
                f"got {self.lease_ttl_seconds} and {self.heartbeat_interval_seconds}"
            )
        return self


class CheckpointSettings(SpecModel):
    """Where and how often workers checkpoint."""

    uri: Annotated[
        str | None,
        Field(description="Checkpoint location (a path or file:// URI). Default: the run's own folder."),
    ] = None
    interval_steps: Annotated[int, Field(ge=1, le=10_000_000, description="Save every this many steps.")] = 10
    keep_last: Annotated[int, Field(ge=1, le=1000, description="Committed checkpoints to keep.")] = 3


class DataSource(SpecModel):
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$", description="Source name.")]
    shards: Annotated[
        list[str],
        Field(min_length=1, max_length=1024, description="Token shard files or globs (relative: to the job file)."),
    ]
    weight: Annotated[float, Field(gt=0, description="Mixture weight (relative to the other sources).")] = 1.0


class DataSettings(SpecModel):
    """The deterministic data loader; with it, each node runs a shadow loader beside its workers."""

    sources: Annotated[list[DataSource], Field(min_length=1, max_length=64)]
    seq_len: Annotated[int, Field(ge=1, le=1 << 20, description="Tokens per sample (packed).")]
    micro_batch: Annotated[int, Field(ge=1, le=65536, description="Samples per rank per step.")] = 8
    seed: Annotated[int, Field(ge=0, description="Seed of the global sample order.")] = 0


class TrainingJobSpec(SpecModel):
    roles: Annotated[
        list[Role], Field(min_length=1, max_length=16, description="The job's roles, as a named list.")
    ]
    fault_tolerance: FaultTolerance = FaultTolerance()
    checkpoint: CheckpointSettings = CheckpointSettings()
    data: DataSettings | None = None

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
            raise ValueError(f"expected {API_VERSION!r}, got {v!r}")
        return v

    @field_validator("kind")
    @classmethod
    def _check_kind(cls, v: str) -> str:
        if v != KIND:
            raise ValueError(f"expected {KIND!r}, got {v!r}")
        return v

    @property
    def name(self) -> str:
        return self.metadata.name
