"""What a node must have, from the job's spec (each role's `health`), for its agent's probes.

An agent learns its role only with its first assignment, and a standby may serve any role, so until
then the agent judges its machine by what every role of the job requires (the least demanding of
them: in a job of one role, exactly that role's settings); once assigned, by its role's own.
"""

from __future__ import annotations

from collections.abc import Sequence

from stalwart.spec import TrainingJobSpec
from stalwart.spec.model import NodeHealth
from stalwart.store.records import Record


class NodeExpectations(Record):
    expected_gpus: int | None = None
    required_nics: list[str] = []
    watched_disks: list[str] = ["/"]
    writable_paths: list[str] = []
    kernel_log_window_minutes: int | None = None
    min_bus_bandwidth_gbps: float | None = None


def node_expectations(spec: TrainingJobSpec, role: str | None = None) -> NodeExpectations:
    """`role`'s settings; without one (or one the spec does not name), the settings every role of
    the job agrees on: a node that meets them can serve any role."""
    named = [r.health for r in spec.roles if r.name == role]
    return _common(named or [r.health for r in spec.roles])


def _common(healths: Sequence[NodeHealth]) -> NodeExpectations:
    if not healths:
        return NodeExpectations()
    gpus = [h.expected_gpus for h in healths]
    windows = [h.kernel_log_window_minutes for h in healths]
    floors = [h.min_bus_bandwidth_gbps for h in healths]
    return NodeExpectations(
        expected_gpus=None if None in gpus else min(g for g in gpus if g is not None),
        required_nics=_shared([h.required_nics for h in healths]),
        watched_disks=_shared([h.watched_disks for h in healths]),
        writable_paths=_shared([h.writable_paths for h in healths]),
        # The shortest window: an Xid outside any role's window is no role's evidence.
        kernel_log_window_minutes=None if None in windows else min(w for w in windows if w is not None),
        min_bus_bandwidth_gbps=None if None in floors else min(f for f in floors if f is not None),
    )


def _shared(lists: Sequence[Sequence[str]]) -> list[str]:
    """The entries in every list, in the first list's order."""
    return [x for x in lists[0] if all(x in other for other in lists[1:])]
