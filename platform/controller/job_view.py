"""The controller's view of a job's nodes, operator requests and checkpoint catalog, fed by watches.

Reading the job's nodes prefix every tick costs O(N) (tens of MB at 10,000 nodes, over the
client's 4 MiB reply) and one Range per slot to know which commands to write did as much again.
Instead, one watch per prefix (stalwart.store.prefix_mirror) keeps an in-memory copy, and a tick
parses only the records that changed since the last one:

    nodes/        registrations (a lapsed lease deletes its node's: the next tick sees it lost),
                  heartbeats (the last one of a node is kept after its lease lapsed), commands
    requests/     operator requests (the oldest pending one is read again, with its revision,
                  to guard the commit that answers it)
    checkpoints/  the catalog

A command the controller writes is noted here as soon as etcd acknowledges it (with the write's
revision), so the next tick compares what it wants with what it wrote, without reading it back and
without writing it again. The view is read at the controller's start, and again whenever etcd has
compacted the changes a broken watch missed (prefix_mirror.py); the Observation it gives the core
is the same as a full read of those prefixes would give.

The view also says when a tick is worth running (`notice(trouble)`, called on the watches' threads):
a node registered or lost its lease, a heartbeat changed in what moves the job's stage
(`heartbeat_budget.urgent`: the generation, the agent's state, a worker started, exited or matched
a log signature, a machine fault), or an operator request came. `trouble` says whether it looks like
a failure unfolding (a lease lost, `heartbeat_budget.trouble`: an exit, a log signature, a machine
fault): the controller then watches closely for a
while. Progress (step, loss, metrics) and saved checkpoints are no notice: the controller's timed
tick reads them, as fresh as the watch has them, so a job that trains quietly costs the controller
a tick per IDLE_TICK_SECONDS, not one per heartbeat (at 1,000 nodes saving every 10 s, a save
arrives every 10 ms). Commands (the controller's own writes, echoed back) and the catalog are none
either.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from stalwart.logs import ContextLogger
from stalwart.store import keys
from stalwart.store.client import Store
from stalwart.store.heartbeat_budget import trouble, urgent
from stalwart.store.prefix_mirror import PrefixMirror
from stalwart.store.records import (
    AgentCommand,
    CheckpointEntry,
    Heartbeat,
    NodeRegistration,
    OperatorRequest,
    Record,
    RequestStatus,
)

R = TypeVar("R", bound=Record)


class JobView:
    def __init__(
        self, store: Store, job: str, log: ContextLogger, notice: Callable[[bool], None] | None = None
    ) -> None:
        """`notice(trouble)`: something the controller acts on at once arrived (module docstring)."""
        self.job, self.log = job, log
        self._notice = notice
        # Per node, what its last heartbeat said; the nodes watch's thread alone uses them.
        self._urgent: dict[str, tuple[Any, ...]] = {}
        self._trouble: dict[str, tuple[Any, ...]] = {}
        self._parsed_beats: dict[str, tuple[bytes, Heartbeat]] = {}  # read by the tick: parsed once
        self.nodes = PrefixMirror(store, keys.nodes_prefix(job), self._on_node_change if notice else None)
        self.requests_mirror = PrefixMirror(
            store, keys.requests_prefix(job), (lambda _key, _value: notice(False)) if notice else None
        )
        self.checkpoints_mirror = PrefixMirror(store, keys.checkpoints_prefix(job))
        self.registrations: dict[str, NodeRegistration] = {}
        self.heartbeats: dict[str, Heartbeat] = {}  # nodes whose heartbeat key exists now
        self.last_beats: dict[str, Heartbeat] = {}  # every node's last heartbeat, lapsed leases included
        self.commands: dict[str, AgentCommand] = {}
        self.requests: dict[str, OperatorRequest] = {}  # by key
        self.catalog: dict[str, CheckpointEntry] = {}  # by key

    def start(self) -> None:
        """Read the prefixes (paged) and watch them; idempotent; raises StoreUnavailable."""
        for mirror in (self.nodes, self.requests_mirror, self.checkpoints_mirror):
            mirror.start()

    def close(self) -> None:
        for mirror in (self.nodes, self.requests_mirror, self.checkpoints_mirror):
            mirror.close()

    def refresh(self) -> list[Heartbeat]:
        """Apply what changed since the last call; returns the heartbeats that arrived."""
        self.start()
        beats: list[Heartbeat] = []
        for key, raw in self.nodes.take().items():
            parsed = keys.parse_node_key(self.job, key)
            if parsed is None:
                continue
            node, leaf = parsed
            if leaf == "registration":
                self._apply(self.registrations, node, key, raw, NodeRegistration)
            elif leaf == "heartbeat":
                parsed_by_watch = self._parsed_beats.get(node)
                beat: Heartbeat | None
                if raw is not None and parsed_by_watch is not None and parsed_by_watch[0] is raw:
                    beat = self.heartbeats[node] = parsed_by_watch[1]  # the watch parsed this very value
                else:
                    beat = self._apply(self.heartbeats, node, key, raw, Heartbeat)
                if beat is not None:
                    self.last_beats[node] = beat
                    beats.append(beat)
            elif leaf == "command":
                self._apply(self.commands, node, key, raw, AgentCommand)
        for key, raw in self.requests_mirror.take().items():
            self._apply(self.requests, key, key, raw, OperatorRequest)
        for key, raw in self.checkpoints_mirror.take().items():
            self._apply(self.catalog, key, key, raw, CheckpointEntry)
        return beats

    def _on_node_change(self, key: str, raw: bytes | None) -> None:
        assert self._notice is not None
        parsed = keys.parse_node_key(self.job, key)
        if parsed is None or parsed[1] == "command":
            return
        node, leaf = parsed
        if leaf != "heartbeat" or raw is None:
            if leaf == "heartbeat":
                self._parsed_beats.pop(node, None)  # its lease lapsed: no value left to reuse
            self._notice(raw is None)  # a node joined, or lost its lease
            return
        try:
            beat = Heartbeat.loads(raw)
        except ValueError:
            self._notice(False)  # the tick says what is wrong with it
            return
        self._parsed_beats[node] = (raw, beat)
        now, signs = urgent(beat), trouble(beat)
        if self._urgent.get(node) != now:
            self._notice(self._trouble.get(node, signs) != signs)
        self._urgent[node], self._trouble[node] = now, signs

    def wrote_command(self, node: str, command: AgentCommand, revision: int) -> None:
        """The controller wrote `command` (etcd acknowledged it at `revision`)."""
        self.nodes.note(keys.node_command(self.job, node), command.dumps().encode(), revision)

    def pending_requests(self) -> list[OperatorRequest]:
        return [r for r in self.requests.values() if r.status is RequestStatus.PENDING]

    def checkpoints(self) -> dict[int, CheckpointEntry]:
        return {e.step: e for e in self.catalog.values()}

    def _apply(self, into: dict[str, R], name: str, key: str, raw: bytes | None, cls: type[R]) -> R | None:
        if raw is None:
            into.pop(name, None)
            return None
        try:
            record: R = cls.loads(raw)
        except ValueError as exc:
            # A record that does not parse is left out (as if absent), and said once per write.
            self.log.error("unreadable record in etcd; ignored", fields={"key": key, "error": str(exc)[:300]})
            into.pop(name, None)
            return None
        into[name] = record
        return record
