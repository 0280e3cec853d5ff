"""The data plane's servers and clients over real sockets, found through a real etcd."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator

import pytest
import torch

from stalwart.rlhf import wire
from stalwart.rlhf.connection import ChannelFinished, Connection, DataPlaneUnavailable, RemoteError
from stalwart.rlhf.contract import RELAY_CHANNEL, DataPlaneContext
from stalwart.rlhf.lineage import Lineage, WeightVersion
from stalwart.rlhf.messages import PromptItem, Stage, Stats, WeightsMeta
from stalwart.rlhf.relay_client import RelayClient
from stalwart.rlhf.relay_server import RelayService
from stalwart.rlhf.weights import CorruptWeights, WeightPublisher, WeightSubscriber, size_bound
from stalwart.spec.model import DataPlaneSettings
from stalwart.store.etcd_server import EtcdServer


def eventually(predicate: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.02)


@pytest.fixture
def ctx(etcd: EtcdServer) -> DataPlaneContext:
    return DataPlaneContext(
        job=f"dp-{uuid.uuid4().hex[:8]}",
        etcd=etcd.endpoint,
        settings=DataPlaneSettings(relay_capacity=16),
        token="secret",
        address="127.0.0.1",
    )


@pytest.fixture
def relay(ctx: DataPlaneContext) -> Iterator[RelayService]:
    service = RelayService(ctx).start()
    yield service
    service.close()


@pytest.fixture
def clients(ctx: DataPlaneContext) -> Iterator[Callable[[str], RelayClient]]:
    """Relay clients, closed after the test; actor clients speak for incarnation `a`."""
    made: list[RelayClient] = []

    def make(name: str) -> RelayClient:
        made.append(RelayClient(ctx, name, incarnation="a" if name.startswith("actor") else ""))
        return made[-1]

    yield make
    for client in made:
        client.close()


def prompt(position: int) -> PromptItem:
    return PromptItem(sample_id=position, position=position, step=1, tokens=[1, 2])


def test_a_dead_workers_connection_gives_its_groups_to_another(
    relay: RelayService, clients: Callable[[str], RelayClient]
) -> None:
    actor, dead, alive = clients("actor-0"), clients("rollout-1"), clients("rollout-0")
    actor.resume(Lineage().extend("a", 0), 0)
    actor.demand([prompt(0), prompt(1)])
    version = WeightVersion(incarnation="a", step=0)
    got = dead.lease(Stage.ROLLOUT, 2, have_version=version, wait=0)
    assert got.status == "ok" and len(got.prompts) == 2
    assert actor.stats()["holding"] == {"rollout-1": 2}
    dead.conn._sock.close()  # type: ignore[union-attr]  # as the kernel does for a killed process
    eventually(lambda: actor.stats()["holding"] == {}, "the relay took the groups back")
    again = alive.lease(Stage.ROLLOUT, 2, have_version=version, wait=5)
    assert [p.position for p in again.prompts] == [0, 1]


def test_a_wrong_token_or_channel_is_refused_with_a_message(ctx: DataPlaneContext, relay: RelayService) -> None:
    directory = ctx.directory()
    try:
        with pytest.raises(RemoteError, match="wrong data-plane token"):
            Connection(directory, RELAY_CHANNEL, "intruder", token="guess").call(Stats())
        endpoint = directory.lookup(RELAY_CHANNEL)
        assert endpoint is not None
        with socket.create_connection((endpoint.address, endpoint.port), timeout=5) as sock:
            wire.send(sock, {"op": "stats"})  # no hello first: the server hangs up
            with pytest.raises(ConnectionError):
                wire.recv(sock)
    finally:
        directory.close()


def test_clients_follow_a_restarted_relay_and_the_actor_tells_it_where_it_is(
    ctx: DataPlaneContext, clients: Callable[[str], RelayClient]
) -> None:
    first = RelayService(ctx).start()
    actor = clients("actor-0")
    lineage = Lineage().extend("a", 0)
    actor.resume(lineage, 0)
    actor.advance(32)
    first.close()  # not finished: the key stays, and clients wait for a successor
    second = RelayService(ctx).start()
    try:
        stats = actor.stats()  # reconnects to the new relay, saying who the actor is first
        assert stats["watermark"] == 32 and Lineage.model_validate(stats["lineage"]) == lineage
        assert actor.conn.reconnects == 2
    finally:
        second.close()


def test_any_actor_rank_tells_a_restarted_relay_who_the_actor_is(
    ctx: DataPlaneContext, clients: Callable[[str], RelayClient]
) -> None:
    """Actor rank 0 may sit in a collective, waiting for rank 1's groups, when the relay dies: rank 1
    alone reaches the new relay, and no rollout may work before the relay knows the actor's lineage."""
    first = RelayService(ctx).start()
    rank0, rank1, rollout = clients("actor-0"), clients("actor-1"), clients("rollout-0")
    lineage = Lineage().extend("a", 0)
    for rank in (rank0, rank1):
        rank.resume(lineage, 0)
        rank.advance(16)
    first.close()
    second = RelayService(ctx).start()
    try:
        item = PromptItem(sample_id=16, position=16, step=2, tokens=[1, 2])
        assert rank1.demand([item]).accepted == 1  # rank 1 reconnects, saying who the actor is first
        got = rollout.lease(Stage.ROLLOUT, 1, have_version=WeightVersion(incarnation="a", step=1), wait=0)
        assert got.status == "ok" and [p.position for p in got.prompts] == [16]
        assert second.relay.watermark == 16 and second.relay.lineage == lineage
        assert rank0.conn.reconnects == 1  # rank 0 never spoke to the new relay
    finally:
        second.close()


def test_after_the_actor_finished_late_workers_stop_instead_of_waiting(
    ctx: DataPlaneContext, clients: Callable[[str], RelayClient]
) -> None:
    service = RelayService(ctx).start()
    clients("actor-0").finish()
    service.close()  # finished: the key says so
    late = clients("reward-0")
    assert late.lease(Stage.REWARD, 1, wait=0).status == "done"
    with pytest.raises(ChannelFinished):
        late.stats()


def test_rollouts_get_whole_weight_versions_and_refuse_damaged_ones(ctx: DataPlaneContext) -> None:
    publisher = WeightPublisher(ctx).start()
    subscriber = WeightSubscriber(ctx, "rollout-0")
    try:
        assert subscriber.fetch(wait=0) is None  # nothing published yet
        weights = {"w": torch.arange(6.0).reshape(2, 3)}
        publisher.publish(WeightVersion(incarnation="a", step=0), weights)
        got = subscriber.fetch(wait=5)
        assert got is not None and torch.equal(got["w"], weights["w"])
        assert subscriber.version == WeightVersion(incarnation="a", step=0)
        assert subscriber.fetch(wait=0) is None  # nothing newer
        publisher.publish(WeightVersion(incarnation="b", step=0), {"w": torch.ones(2)})  # a new incarnation
        assert subscriber.fetch(wait=0) is not None and subscriber.version.incarnation == "b"  # type: ignore[union-attr]
        meta, blob = publisher._latest  # type: ignore[misc]
        publisher._latest = (
            WeightsMeta(version=WeightVersion(incarnation="b", step=1), size=meta.size, digest="0" * 32),
            blob,
        )
        with pytest.raises(CorruptWeights):
            subscriber.fetch(wait=0)
        assert subscriber.version == WeightVersion(incarnation="b", step=0)  # still the last whole one
    finally:
        subscriber.close()
        publisher.close(finished=False)


def test_weights_larger_than_the_rollouts_model_are_refused_unread(ctx: DataPlaneContext) -> None:
    """A rollout bounds what it reads by its own model's size: a bigger version is refused, with a
    message, before its bytes are read."""
    small = {"w": torch.zeros(4)}
    publisher = WeightPublisher(ctx).start()
    subscriber = WeightSubscriber(ctx, "rollout-0", max_bytes=size_bound(small))
    try:
        publisher.publish(WeightVersion(incarnation="a", step=0), small)
        assert subscriber.fetch(wait=5) is not None
        publisher.publish(WeightVersion(incarnation="a", step=1), {"w": torch.zeros(1 << 20)})
        with pytest.raises(RemoteError, match="refusing a message"):
            subscriber.fetch(wait=5)
        assert subscriber.version == WeightVersion(incarnation="a", step=0)
    finally:
        subscriber.close()
        publisher.close(finished=False)


def test_an_unreachable_actor_is_reported_at_once_when_asked_for_no_patience(ctx: DataPlaneContext) -> None:
    subscriber = WeightSubscriber(ctx, "rollout-0")
    try:
        with pytest.raises(DataPlaneUnavailable, match="no weights server"):
            subscriber.fetch(wait=0, patience=0)
    finally:
        subscriber.close()


def test_the_relay_process_needs_no_torch() -> None:
    code = "import sys, stalwart.rlhf.relay_server, stalwart.rlhf.ledger; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
