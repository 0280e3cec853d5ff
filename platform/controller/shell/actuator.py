"""Carrying out a decision's effects, after its commit: commands to agents, nodes started and
stopped, machines cordoned, leases revoked, long work launched, log lines.

Every effect is idempotent and derived from committed state, so one that fails is simply derived
again next tick; a failing effect is logged and the others still run.

Commands go out in transactions of up to MAX_TXN_OPS keys (a generation start commands every slot
node: 10,000 keys in 79 round trips, not 10,000), and each one written is reported to `wrote`
(the controller's view, shell/observer.py's JobView), so the next tick does not write it again.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from stalwart.cluster import Cluster
from stalwart.controller.core.decision import (
    CordonNode,
    Effect,
    FenceNode,
    Launch,
    Log,
    SendCommand,
    StartNode,
    StopNode,
    UncordonNode,
)
from stalwart.controller.shell.clock import Clock
from stalwart.controller.shell.work import Runner
from stalwart.logs import ContextLogger
from stalwart.store import keys
from stalwart.store.client import MAX_TXN_OPS, Store
from stalwart.store.records import AgentAction, AgentCommand

Wrote = Callable[[str, AgentCommand, int], None]  # (node, the command, the revision etcd wrote it at)


class Actuator:
    def __init__(
        self,
        store: Store,
        cluster: Cluster,
        job: str,
        runner: Runner,
        clock: Clock,
        wrote: Wrote | None = None,
    ) -> None:
        self.store, self.cluster, self.job, self.runner, self.clock = store, cluster, job, runner, clock
        self._wrote = wrote
        self._cordoned: set[str] = set()  # machines this controller cordoned (or saw uncordoned)
        self._fenced: set[int] = set()  # leases this controller revoked
        self._stopping: dict[str, threading.Thread] = {}  # nodes being stopped, off the control loop

    def apply(self, effects: Sequence[Effect], log: ContextLogger) -> None:
        commands: list[SendCommand] = []
        for effect in effects:
            if isinstance(effect, SendCommand):
                commands.append(effect)
                continue
            self._send(commands, log)  # in the order they were decided
            commands = []
            try:
                self._apply(effect, log)
            except Exception as exc:
                log.warning(
                    "effect failed; it is derived again next tick", fields={"effect": repr(effect), "error": repr(exc)}
                )
        self._send(commands, log)

    def _send(self, effects: Sequence[SendCommand], log: ContextLogger) -> None:
        """Commands, MAX_TXN_OPS to a transaction; a batch that fails is derived again next tick."""
        for start in range(0, len(effects), MAX_TXN_OPS):
            batch = {
                e.node: AgentCommand(generation=e.generation, action=e.action, issued_at=self.clock.time())
                for e in effects[start : start + MAX_TXN_OPS]
            }
            try:
                if len(batch) == 1:
                    [(node, command)] = batch.items()
                    revision = self.store.put(keys.node_command(self.job, node), command)
                else:
                    revision = self.store.put_batch({keys.node_command(self.job, n): c for n, c in batch.items()})
            except Exception as exc:
                log.warning(
                    "commands failed; they are derived again next tick",
                    fields={"nodes": sorted(batch)[:10], "count": len(batch), "error": repr(exc)},
                )
                continue
            if self._wrote is not None:
                for node, command in batch.items():
                    self._wrote(node, command, revision)

    def _apply(self, effect: Effect, log: ContextLogger) -> None:
        if isinstance(effect, Log):
            getattr(log, effect.level)(effect.message, fields=effect.fields)
        elif isinstance(effect, StartNode):
            log.info("starting node", fields={"node": effect.node, "standby": effect.standby, "role": effect.role})
            self.cluster.start_node(effect.node, role=effect.role)
        elif isinstance(effect, StopNode):
            self._stop_in_background(effect.node, log)
        elif isinstance(effect, CordonNode):
            if effect.node not in self._cordoned:
                self._cordoned.add(effect.node)
                self.cluster.cordon(effect.node, effect.reason)
        elif isinstance(effect, UncordonNode):
            self._cordoned.add(effect.node)  # uncordoned on request: not cordoned again by this controller
            self.cluster.uncordon(effect.node)
        elif isinstance(effect, FenceNode):
            if effect.lease_id not in self._fenced:
                self._fenced.add(effect.lease_id)
                log.warning("fencing node", fields={"node": effect.node, "why": effect.why})
                self.store.revoke_lease(effect.lease_id)
        elif isinstance(effect, Launch):
            if effect.work.key not in self.runner.in_flight():
                log.info("long work started (off the loop)", fields={"work": effect.work.describe()})
            self.runner.launch(effect.work)

    def _stop_in_background(self, node: str, log: ContextLogger) -> None:
        """Stopping a node waits out its grace period: the next generation must not wait with it."""
        if (thread := self._stopping.get(node)) is not None and thread.is_alive():
            return
        log.info("stopping node", fields={"node": node})
        thread = threading.Thread(target=self.cluster.stop_node, args=(node,), name=f"stop-{node}", daemon=True)
        self._stopping[node] = thread
        thread.start()

    def shut_down(self, nodes: Sequence[str], generation: int, wait: float, log: ContextLogger) -> None:
        """The job is over: let the stops under way finish, tell every agent to exit, wait for them
        to go, then take whatever is left away."""
        for thread in self._stopping.values():
            thread.join(timeout=wait)
        self._send([SendCommand(node, generation, AgentAction.SHUTDOWN) for node in nodes], log)
