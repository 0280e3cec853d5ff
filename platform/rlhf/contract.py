"""The environment a data-plane worker reads.

The node agent builds it with `dataplane_env` (stalwart.agents.launcher.worker_env); the names live in
the worker contract (stalwart.worker_contract) with every other variable a worker gets. A role's script
reads it with `DataPlaneContext.from_env`. Besides these, a role reads the usual torchrun variables.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from pydantic import ValidationError

from stalwart import worker_contract as contract
from stalwart.rlhf.endpoints import EndpointDirectory
from stalwart.spec.model import DataPlaneSettings

ETCD_ENV = contract.ETCD  # HOST:PORT of the job's etcd, where the endpoints are
JOB_ENV = contract.JOB
SETTINGS_ENV = contract.DATAPLANE  # the spec's dataPlane section, as JSON
TOKEN_ENV = contract.DATAPLANE_TOKEN  # shared by the job's roles; servers refuse other callers
ADDRESS_ENV = contract.NODE_ADDRESS  # where this node's servers listen (the pod IP on Kubernetes)

RELAY_CHANNEL = "relay"
WEIGHTS_CHANNEL = "weights"


class ContractError(ValueError):
    """The environment lacks what a data-plane worker needs; the message names the variable."""


def dataplane_env(job: str, etcd: str, settings: DataPlaneSettings, token: str = "") -> dict[str, str]:
    return {
        JOB_ENV: job,
        ETCD_ENV: etcd,
        SETTINGS_ENV: settings.model_dump_json(by_alias=True),
        TOKEN_ENV: token,
    }


@dataclass(frozen=True)
class DataPlaneContext:
    job: str
    etcd: str
    settings: DataPlaneSettings
    token: str
    address: str

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> DataPlaneContext:
        env = os.environ if env is None else env
        missing = [name for name in (JOB_ENV, ETCD_ENV) if not env.get(name)]
        if missing:
            raise ContractError(
                f"this RLHF role needs {' and '.join(missing)} in its environment (set by the node agent, "
                "or by hand: the job name and the etcd HOST:PORT where the data-plane endpoints are)"
            )
        try:
            settings = DataPlaneSettings.model_validate_json(env.get(SETTINGS_ENV) or "{}")
        except ValidationError as exc:
            raise ContractError(f"{SETTINGS_ENV} is not a valid dataPlane section: {exc}") from None
        return cls(
            job=env[JOB_ENV],
            etcd=env[ETCD_ENV],
            settings=settings,
            token=env.get(TOKEN_ENV, ""),
            address=env.get(ADDRESS_ENV) or "127.0.0.1",
        )

    def directory(self) -> EndpointDirectory:
        return EndpointDirectory(self.etcd, self.job)
