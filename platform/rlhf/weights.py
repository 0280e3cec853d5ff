"""Weights from the actor to the rollouts: versioned, and only ever whole.

The actor's rank 0 publishes each new version by serializing it completely, then swapping it in as
the one version it serves (the newest; older ones are of no use to anyone). A rollout asks for
anything other than what it has, checks the size and digest of what arrives, and only then loads
it, between two generations: a rollout never generates with a half-written or half-loaded version.
"""

from __future__ import annotations

import hashlib
import io
import threading
import time
from collections.abc import Mapping

import torch
from pydantic import BaseModel

from stalwart import logs
from stalwart.rlhf import wire
from stalwart.rlhf.connection import Connection
from stalwart.rlhf.contract import WEIGHTS_CHANNEL, DataPlaneContext
from stalwart.rlhf.endpoints import DataPlaneEndpoint, EndpointDirectory
from stalwart.rlhf.lineage import WeightVersion
from stalwart.rlhf.messages import FetchWeights, Message, WeightsMeta
from stalwart.rlhf.server import ChannelServer, RequestRefused

StateDict = dict[str, torch.Tensor]


class CorruptWeights(RuntimeError):
    """What arrived does not match its size or digest."""


def serialize(state_dict: Mapping[str, torch.Tensor]) -> bytes:
    buf = io.BytesIO()
    torch.save({k: v.detach().cpu().contiguous() for k, v in state_dict.items()}, buf)
    return buf.getvalue()


def digest(blob: bytes) -> str:
    return hashlib.blake2b(blob, digest_size=16).hexdigest()


def size_bound(state_dict: Mapping[str, torch.Tensor]) -> int:
    """The most bytes a serialized version of a model with these tensors can take: its tensors' bytes
    plus torch.save's framing (a zip entry and a pickle record per tensor). A rollout passes it as its
    subscriber's `max_bytes`, so weights for a model larger than its own are refused unread."""
    tensors = sum(v.numel() * v.element_size() for v in state_dict.values())
    return min(tensors + 4096 * (len(state_dict) + 16), wire.MAX_PAYLOAD)


def deserialize(blob: bytes) -> StateDict:
    state = torch.load(io.BytesIO(blob), map_location="cpu", weights_only=True)
    if not isinstance(state, dict):
        raise CorruptWeights(f"weights payload holds a {type(state).__name__}, not a state dict")
    return state


class WeightPublisher:
    """Serves the newest published version on the weights channel; its endpoint is in etcd."""

    def __init__(self, ctx: DataPlaneContext, *, port: int = 0, directory: EndpointDirectory | None = None) -> None:
        self.ctx = ctx
        self.directory = directory or ctx.directory()
        self._own_directory = directory is None
        self.log = logs.get_logger("stalwart.rlhf.weights", job=ctx.job)
        self._cond = threading.Condition()
        self._latest: tuple[WeightsMeta, bytes] | None = None
        self.server = ChannelServer(
            WEIGHTS_CHANNEL, self._handle, token=ctx.token, host=ctx.address, port=port, log=self.log
        )
        self.endpoint: DataPlaneEndpoint | None = None

    @property
    def version(self) -> WeightVersion | None:
        with self._cond:
            return self._latest[0].version if self._latest else None

    def start(self) -> WeightPublisher:
        self.server.start()
        self.endpoint = self.directory.publish(WEIGHTS_CHANNEL, self.ctx.address, self.server.port)
        return self

    def publish(self, version: WeightVersion, state_dict: Mapping[str, torch.Tensor]) -> None:
        blob = serialize(state_dict)  # whole before anyone can see it
        meta = WeightsMeta(version=version, size=len(blob), digest=digest(blob))
        with self._cond:
            self._latest = (meta, blob)
            self._cond.notify_all()

    def close(self, *, finished: bool = True) -> None:
        """Stop serving; `finished` (the actor's last step is done) tells rollouts no weights will come."""
        if self.endpoint is not None and finished:
            self.directory.retire(self.endpoint)
        self.server.close()
        if self._own_directory:
            self.directory.close()

    def _handle(self, client: str, message: Message, payload: bytes) -> tuple[BaseModel, bytes]:
        if not isinstance(message, FetchWeights):
            raise RequestRefused(f"the weights channel does not serve {type(message).__name__}")
        deadline = time.monotonic() + message.wait_seconds
        with self._cond:
            while self._latest is None or self._latest[0].version == message.newer_than:
                left = deadline - time.monotonic()
                if left <= 0:
                    return WeightsMeta(), b""
                self._cond.wait(left)
            meta, blob = self._latest
        return meta, blob


class WeightSubscriber:
    """A rollout's view of the actor's weights: `fetch` returns a new whole version, or None.

    `max_bytes` bounds a version's serialized size (the model's, with room for torch.save's framing):
    a reply announcing more is refused before any of it is read."""

    def __init__(
        self,
        ctx: DataPlaneContext,
        client: str,
        *,
        directory: EndpointDirectory | None = None,
        max_bytes: int = wire.MAX_PAYLOAD,
    ) -> None:
        if not 0 < max_bytes <= wire.MAX_PAYLOAD:
            raise ValueError(f"max_bytes must be in 1..{wire.MAX_PAYLOAD}, not {max_bytes}")
        self._reply = wire.Limits(payload=max_bytes)
        self.directory = directory or ctx.directory()
        self._own_directory = directory is None
        self.conn = Connection(self.directory, WEIGHTS_CHANNEL, client, token=ctx.token)
        self.version: WeightVersion | None = None

    def fetch(self, wait: float = 0.0, *, patience: float | None = None) -> StateDict | None:
        """A whole newer version, or None if none came within `wait`. Raises DataPlaneUnavailable when
        the actor is unreachable for `patience` seconds, ChannelFinished once the actor has finished."""
        header, blob = self.conn.call(
            FetchWeights(newer_than=self.version, wait_seconds=wait), wait=wait, patience=patience, reply=self._reply
        )
        meta = WeightsMeta.model_validate(header)
        if meta.version is None:
            return None
        if len(blob) != meta.size or digest(blob) != meta.digest:
            raise CorruptWeights(
                f"weights {meta.version} arrived with {len(blob)} of {meta.size} bytes or a bad digest"
            )
        state = deserialize(blob)
        self.version = meta.version
        return state

    def close(self) -> None:
        self.conn.close()
        if self._own_directory:
            self.directory.close()
