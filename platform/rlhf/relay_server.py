"""The relay as a process: `python -m stalwart.rlhf.relay_server` (the command of a job's relay role).

It reads the data-plane contract from its environment (contract.py), listens on its node's address,
publishes its endpoint in etcd and serves the relay (relay.py) until the actor has finished and
every client has left (or `--exit-grace` seconds after the finish, whichever comes first). It needs
no torch: it moves JSON.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel

from stalwart import logs
from stalwart.rlhf.contract import RELAY_CHANNEL, ContractError, DataPlaneContext
from stalwart.rlhf.endpoints import DataPlaneEndpoint, EndpointDirectory
from stalwart.rlhf.messages import Advance, Demand, Finish, Lease, Message, Resume, Stats, Submit, Take
from stalwart.rlhf.relay import Relay
from stalwart.rlhf.server import ChannelServer, RequestRefused
from stalwart.store import keys
from stalwart.store.client import StoreUnavailable
from stalwart.store.records import DataPlaneHealth

HEALTH_SECONDS = 2.0  # how often the relay writes its health for the controller


class Ack(BaseModel):
    ok: bool = True


class StatsReply(BaseModel):
    stats: dict[str, Any]


class RelayService:
    """A relay behind its channel server, its endpoint published in etcd while it runs."""

    def __init__(self, ctx: DataPlaneContext, *, port: int = 0, directory: EndpointDirectory | None = None) -> None:
        self.ctx = ctx
        self.relay = Relay(ctx.settings)
        self.log = logs.get_logger("stalwart.rlhf.relay", job=ctx.job, role="relay")
        self.directory = directory or ctx.directory()
        self._own_directory = directory is None
        self.server = ChannelServer(
            RELAY_CHANNEL,
            self._handle,
            token=ctx.token,
            host=ctx.address,
            port=port,
            on_disconnect=self._disconnected,
            log=self.log,
        )
        self.endpoint: DataPlaneEndpoint | None = None

    def publish_health(self) -> None:
        """Tell the controller which workers held groups past their lease (a hang it can localize)."""
        assert self.endpoint is not None
        record = DataPlaneHealth(
            incarnation=self.endpoint.incarnation,
            written_at=time.time(),
            expired_at=self.relay.stats()["expired_at"],
        )
        try:
            self.directory.store.put(keys.dataplane_health(self.ctx.job), record)
        except StoreUnavailable as exc:
            self.log.warning("could not publish the data plane's health", fields={"error": str(exc)})

    def start(self) -> RelayService:
        self.server.start()
        self.endpoint = self.directory.publish(RELAY_CHANNEL, self.ctx.address, self.server.port)
        self.log.info(
            "relay serving",
            fields={"endpoint": self.endpoint.target, "settings": self.ctx.settings.model_dump(by_alias=True)},
        )
        return self

    def close(self) -> None:
        """Stop serving. After the actor's finish the key is marked finished (late workers stop);
        otherwise it stays, and clients wait for the relay's successor."""
        if self.endpoint is not None and self.relay.done:
            self.directory.retire(self.endpoint)
        self.server.close()
        if self._own_directory:
            self.directory.close()

    def _disconnected(self, client: str) -> None:
        n = self.relay.release(client)
        if n:
            self.log.info("client gone: its groups return to their stage", fields={"client": client, "groups": n})

    def _handle(self, client: str, message: Message, payload: bytes) -> tuple[BaseModel, bytes]:
        relay = self.relay
        if isinstance(message, Lease):
            return relay.lease(client, message), b""
        if isinstance(message, Submit):
            return relay.submit(client, message), b""
        if isinstance(message, Take):
            return relay.take(message), b""
        if isinstance(message, Demand):
            return relay.demand(message), b""
        if isinstance(message, Advance):
            relay.advance(message.incarnation, message.watermark)
            return Ack(), b""
        if isinstance(message, Resume):
            relay.resume(message.lineage, message.watermark)
            self.log.info(
                "actor resumed",
                fields={"client": client, "watermark": message.watermark, "lineage": message.lineage.model_dump()},
            )
            return Ack(), b""
        if isinstance(message, Finish):
            relay.finish()
            self.log.info("actor finished", fields={"stats": relay.stats()})
            return Ack(), b""
        if isinstance(message, Stats):
            return StatsReply(stats=relay.stats()), b""
        raise RequestRefused(f"the relay does not serve {type(message).__name__}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m stalwart.rlhf.relay_server", description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0, help="TCP port (default: any free one; etcd says which)")
    parser.add_argument(
        "--exit-grace", type=float, default=60.0, help="seconds after the actor finished to wait for clients to leave"
    )
    args = parser.parse_args(argv)
    try:
        ctx = DataPlaneContext.from_env()
    except ContractError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    logs.configure()
    service = RelayService(ctx, port=args.port).start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    finished_at: float | None = None
    health_due = 0.0
    try:
        while not stop.wait(0.2):
            if time.monotonic() >= health_due:
                service.publish_health()
                health_due = time.monotonic() + HEALTH_SECONDS
            if not service.relay.done:
                finished_at = None
                continue
            finished_at = finished_at or time.monotonic()
            if not service.server.clients or time.monotonic() - finished_at > args.exit_grace:
                break
    finally:
        service.log.info("relay stopping", fields={"stats": service.relay.stats()})
        service.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
