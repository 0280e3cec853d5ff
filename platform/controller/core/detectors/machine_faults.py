"""Rung 1: machine faults the probes report in heartbeats (Xid, ECC, GPU lost, disk full; a NIC
down `nicFlapCount` times in its window) condemn the node at once, no diagnosis."""

from __future__ import annotations

from stalwart.controller.core.detectors.base import Detector, Failure, Finding, Report, View
from stalwart.controller.core.policy import Classified, NicHistory, machine_fault_suspects
from stalwart.spec.model import FailureEvent


class MachineFaults(Detector):
    name = "machine-faults"

    def __init__(self) -> None:
        super().__init__()
        self._nics: dict[str, NicHistory] = {}  # kept across generations: flaps count within their window
        self._handled: dict[str, frozenset[str]] = {}  # node -> the faults already acted on (an Ignore rule)

    def observe(self, view: View) -> Report:
        ft = view.spec.fault_tolerance
        # The slot nodes that report a fault now (a node with none and no NIC history has nothing to
        # judge: at 10,000 nodes, looking at each one every tick would be most of the tick).
        faults = {
            n: b.machine_faults
            for n in view.state.slots
            if (b := view.beats.get(n)) is not None and b.machine_faults and n in view.registrations
        }
        condemned = machine_fault_suspects(
            faults, self._nics, view.now, nic_count=ft.nic_flap_count, nic_window=ft.nic_flap_window_seconds
        )
        self._handled = {n: seen for n, seen in self._handled.items() if n in condemned}
        fresh = {n: lines for n, lines in condemned.items() if not set(lines) <= self._handled.get(n, frozenset())}
        if not fresh:
            return Report()
        evidence = [f"{n}: {line}" for n, lines in sorted(fresh.items()) for line in lines]
        what = Classified(FailureEvent.MACHINE_FAULT, sorted(fresh), evidence)
        return Report([Failure(what, failed_at=view.now, detected_at=view.now)])

    def handled(self, finding: Finding, now: float) -> None:
        if isinstance(finding, Failure):
            for line in finding.what.evidence:
                node, _, fault = line.partition(": ")
                self._handled[node] = self._handled.get(node, frozenset()) | {fault}
