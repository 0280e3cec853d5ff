"""Hangs in an RLHF job's data-plane roles (rollout, reward, reference): workers that do not step.

They wait whenever their upstream is idle, so "no progress for N step times" would misfire on them;
the relay knows better. A worker that held prompt groups past `dataPlane.leaseSeconds` lost them to
the relay (stalwart.rlhf.relay: they go back for another worker) and is reported in the relay's
`DataPlaneHealth`; that worker ("role-rank") runs on one node of its role, which this detector names
as a hang's suspect. The ladder then evicts it and hot-swaps it, in that role's scope.
"""

from __future__ import annotations

from stalwart.controller.core.detectors.base import Detector, Failure, Finding, Report, View
from stalwart.controller.core.policy import Classified
from stalwart.spec.model import FailureEvent


class DataPlaneHangs(Detector):
    name = "dataplane-hangs"

    def reset(self) -> None:
        self._handled: dict[str, float] = {}  # worker -> the expiry already acted on
        self._pending: tuple[str, float] | None = None  # the finding reported this tick

    def observe(self, view: View) -> Report:
        health, spec, state = view.obs.dataplane, view.spec, view.state
        if health is None or spec.data_plane is None:
            return Report()
        roles = {r.name: r for r in spec.roles}
        findings: list[Finding] = []
        for worker, expired in sorted(health.expired_at.items()):
            name, _, rank_text = worker.rpartition("-")
            role, record = roles.get(name), state.roles.get(name)
            if role is None or record is None or not rank_text.isdigit():
                continue  # not a role's worker (the actor's ranks take, they never lease)
            if expired <= (record.generation_started_at or 0) or self._handled.get(worker, 0) >= expired:
                continue  # before the role's current generation, or acted on already
            slot = int(rank_text) // role.processes_per_node
            nodes = state.role_slots(name)
            if slot >= len(nodes):
                continue
            lease = spec.data_plane.lease_seconds
            what = Classified(
                FailureEvent.HANG,
                [nodes[slot]],
                [
                    f"{worker} on {nodes[slot]} held prompt groups for over {lease:g}s (dataPlane.leaseSeconds): "
                    "the relay took them back for another worker"
                ],
                rank=record.first_rank + int(rank_text),
            )
            findings.append(Failure(what, failed_at=expired - lease, detected_at=view.now))
            self._pending = (worker, expired)
            break  # one at a time: the ladder handles one failure per decision
        return Report(findings)

    def handled(self, finding: Finding, now: float) -> None:
        if self._pending is not None:
            worker, expired = self._pending
            self._handled[worker] = expired
