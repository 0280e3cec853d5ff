"""The operator's settings, read from its environment (the Deployment sets them)."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

ENV_PREFIX = "STALWART_"
LIST_SEPARATORS = {"namespaces": ",", "allowed_paths": os.pathsep}  # STALWART_ALLOWED_PATHS is a PATH-like list


class OperatorConfig(BaseModel):
    """Everything that differs between clusters; each field is an environment variable
    STALWART_<FIELD IN UPPER CASE>, e.g. STALWART_ETCD, STALWART_AGENT_IMAGE."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    etcd: Annotated[
        str,
        Field(description="etcd endpoint HOST:PORT, shared by the operator, controllers and agents."),
    ]
    operator_name: Annotated[
        str,
        Field(description="Replicas with the same name elect one leader among them."),
    ] = "stalwart-operator"
    identity: Annotated[str, Field(description="This replica's name in the election (the pod name).")] = (
        socket.gethostname()
    )
    namespaces: Annotated[
        list[str],
        Field(description="Namespaces to serve (comma-separated); empty: the whole cluster."),
    ] = []
    agent_image: Annotated[str, Field(description="Image of the node pods when a role names none.")] = (
        "stalwart/stalwart:0.1.0"
    )
    image_pull_policy: str = "IfNotPresent"
    python: Annotated[
        str,
        Field(description="The Python interpreter in the image, which runs the agent."),
    ] = "python"
    pod_workdir: Annotated[str, Field(description="Where each pod's agent keeps logs (an emptyDir).")] = (
        "/var/run/stalwart"
    )
    job_dir: Annotated[
        str,
        Field(description="Folder in the image that relative paths of the spec start from."),
    ] = "/workspace"
    rendezvous_port: Annotated[
        int,
        Field(
            ge=0,
            le=65535,
            description="torch.distributed's port on the rank-0 pod; 0: a free "
            "loopback port (only for an emulated cluster whose 'pods' share one host).",
        ),
    ] = 29500
    agent_metrics_port: Annotated[int, Field(ge=0, le=65535, description="The agent's /metrics port; 0: any.")] = 9400
    agent_metrics_host: Annotated[
        str, Field(description="Address the agent's /metrics binds to; empty: the pod's IP (not every interface).")
    ] = ""
    allowed_paths: Annotated[
        list[str],
        Field(
            description="Folders (absolute, ':'-separated) that a job's workingDir and checkpoint path may "
            "use besides jobDir; passed on to the agents (docs/security.md)."
        ),
    ] = []
    termination_grace_seconds: Annotated[int, Field(ge=0, le=3600)] = 30
    status_interval_seconds: Annotated[
        float,
        Field(
            gt=0,
            le=300,
            description="How often each TrainingJob's status is refreshed from etcd.",
        ),
    ] = 5.0
    pod_resync_seconds: Annotated[
        float,
        Field(
            ge=1,
            le=86400,
            description="Each job's pod cache LISTs its pods again this often, whatever the pod watch "
            "said (it also does after the watch re-lists); between LISTs the watch keeps it.",
        ),
    ] = 300.0
    job_metrics_port: Annotated[
        int,
        Field(ge=0, le=65535, description="The job-metrics exporter's /metrics (every job, on the leader); 0: none."),
    ] = 9401
    job_metrics_host: str = "0.0.0.0"
    diagnosis_url: Annotated[
        str,
        Field(
            description="The diagnosis service's URL (the chart's Service); the leader publishes it in etcd, "
            "where controllers and the CLI find it. Empty: publish nothing."
        ),
    ] = ""
    etcd_client_secret: Annotated[
        str,
        Field(
            description="A Secret in each job's namespace with etcd's CA and a client certificate (ca.crt, "
            "tls.crt, tls.key): mounted into the node pods, whose agents then speak TLS to etcd. Empty: none."
        ),
    ] = ""
    run_as_user: Annotated[
        int,
        Field(ge=1, description="The uid (and gid) node pods run as unless their template says otherwise."),
    ] = 1000
    probe_port: Annotated[int, Field(ge=0, le=65535, description="/healthz and /readyz; 0: none.")] = 8080
    probe_host: str = "0.0.0.0"
    election_ttl_seconds: Annotated[
        int,
        Field(
            ge=2,
            le=300,
            description="Operator leadership lapses this long after its holder stops renewing.",
        ),
    ] = 10

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> OperatorConfig:
        env = os.environ if env is None else env
        values: dict[str, object] = {}
        for name in cls.model_fields:
            raw = env.get(ENV_PREFIX + name.upper())
            if raw is None or raw == "":
                continue
            separator = LIST_SEPARATORS.get(name)
            values[name] = [n.strip() for n in raw.split(separator) if n.strip()] if separator else raw
        if "etcd" not in values:
            raise ValueError(f"{ENV_PREFIX}ETCD must name the etcd endpoint (HOST:PORT)")
        return cls.model_validate(values)
