"""The job's checkpoint token: the node's memory store asks it of every caller, and the workers and
the standby's mirror send it (stalwart.checkpoint.memory_auth). The same on every node:
STALWART_CHECKPOINT_TOKEN when the agent was given one, else one per job in etcd, created by the
first agent to ask."""

from __future__ import annotations

from stalwart.agents.data_plane import DataPlaneError
from stalwart.checkpoint.memory_auth import new_token, token_from_env
from stalwart.store import keys
from stalwart.store.client import Store


class TokenVanished(DataPlaneError):
    """The job's token key was created, then gone before it could be read."""


class CheckpointToken:
    def __init__(self, store: Store, job: str) -> None:
        self.store, self.job = store, job
        self._token: str | None = None

    def get(self) -> str:
        if self._token is None:
            token = token_from_env()
            if token is None:
                key = keys.checkpoint_token(self.job)
                self.store.create(key, new_token())
                raw = self.store.get_raw(key)
                if raw is None:
                    raise TokenVanished(f"the job's checkpoint token at {key} vanished")
                token = raw.decode()
            self._token = token
        return self._token
