"""A detector's own summary of each slot node's workers, redone only for the nodes whose heartbeat
changed since the detector last looked.

A tick used to walk every worker record of the running generation once per detector (80,000 at
10,000 nodes x 8 GPUs, several times over). A detector that keeps a `NodeDigests` instead reduces
each node's current workers to what it needs (a few numbers) when that node's heartbeat changes,
and decides from the digests. The changes come from the observation (`BeatChanges`, fed by the
shell's watch-fed view); where they are not known (an observation built without them, a detector
that has not looked for a long while), every slot node is digested again, so the result is always
what a full walk would give.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from stalwart.controller.core.detectors.base import PEER_TROUBLE_SECONDS, View
from stalwart.diagnosis.log_classify import SYMPTOMS
from stalwart.store.records import WorkerStatus

T = TypeVar("T")


class NodeDigests(Generic[T]):
    """`digest(workers, sent_at)` of each slot node, where `workers` are the node's current workers
    as its last heartbeat tells (empty without one, or with one from a generation it does not run)
    and `sent_at` when that heartbeat was sent (None without one)."""

    def __init__(self, digest: Callable[[Sequence[WorkerStatus], float | None], T]) -> None:
        self._digest = digest
        self._cursor = -1
        self._layout: tuple[int, tuple[str, ...]] | None = None  # (generation, slots) last digested
        self._slot_index: dict[str, int] = {}
        self.by_node: dict[str, T] = {}
        self.changed: set[str] = set()  # the nodes redone at the last update (a cache of the whole may stand)

    def update(self, view: View) -> dict[str, T]:
        """Bring the digests to `view`; idempotent for a given view."""
        state = view.state
        changes = view.obs.beat_changes
        nodes = changes.since(self._cursor) if changes is not None else None
        layout = (state.generation, tuple(state.slots))
        if nodes is None or layout != self._layout:
            nodes = set(state.slots)  # not known what changed, or a new layout: every slot again
            self.by_node = {n: d for n, d in self.by_node.items() if n in nodes}
            self._layout = layout
            self._slot_index = {n: i for i, n in enumerate(state.slots)}
        else:
            nodes = {n for n in nodes if n in self._slot_index}  # slots only (a standby's beat says nothing here)
        if changes is not None:
            self._cursor = changes.end
        for node in nodes:
            beat = view.beats.get(node)
            workers = beat.workers if beat is not None and beat.generation == state.running_generation(node) else []
            self.by_node[node] = self._digest(workers, beat.sent_at if beat is not None else None)
        self.changed = nodes
        return self.by_node

    def in_slot_order(self, nodes: Iterable[str]) -> list[str]:
        """`nodes` (slot nodes) in the order of the state's slots: where a walk's order matters."""
        return sorted(nodes, key=self._slot_index.__getitem__)


@dataclass(frozen=True)
class Failures:
    """What a node's workers say of a failure: those that exited non-zero (in the heartbeat's order)
    and the newest match of a symptom of another rank's failure."""

    crashed: tuple[WorkerStatus, ...] = ()
    last_symptom_at: float | None = None


def failures(workers: Sequence[WorkerStatus], _sent_at: float | None = None) -> Failures:
    crashed = tuple(w for w in workers if w.exit_code not in (None, 0))
    symptoms = [m.matched_at for w in workers for m in w.matches if m.failure_class in SYMPTOMS]
    return Failures(crashed, max(symptoms, default=None)) if crashed or symptoms else NO_FAILURES


NO_FAILURES = Failures()


class FailureWatch:
    """View.crashed, first_exit and peer_trouble from digests (what a full walk gives, the same
    order included), for the detectors that look at them every tick."""

    def __init__(self) -> None:
        self.digests: NodeDigests[Failures] = NodeDigests(failures)
        self._failing: set[str] = set()  # slot nodes with a crashed worker or a symptom
        self._crashed: list[WorkerStatus] = []
        self._last_symptom_at: float | None = None

    def update(self, view: View) -> None:
        by_node = self.digests.update(view)
        changed = self.digests.changed
        if not changed:
            return
        if len(changed) == len(by_node):
            self._failing = {n for n, d in by_node.items() if d is not NO_FAILURES}
        else:
            for node in changed:
                if by_node[node] is NO_FAILURES:
                    self._failing.discard(node)
                else:
                    self._failing.add(node)
        nodes = self.digests.in_slot_order(self._failing)
        failed = [w for n in nodes for w in by_node[n].crashed]
        self._crashed = sorted(failed, key=lambda w: (w.failure_class in SYMPTOMS, w.exited_at or 0))
        symptoms = [t for n in nodes if (t := by_node[n].last_symptom_at) is not None]
        self._last_symptom_at = max(symptoms, default=None)

    def crashed(self, view: View) -> list[WorkerStatus]:
        """View.crashed()."""
        self.update(view)
        return list(self._crashed)

    def first_exit(self, view: View) -> float | None:
        """View.first_exit()."""
        return min((w.exited_at or view.now for w in self.crashed(view)), default=None)

    def peer_trouble(self, view: View) -> bool:
        """View.peer_trouble()."""
        self.update(view)
        return self._last_symptom_at is not None and view.now - self._last_symptom_at < PEER_TROUBLE_SECONDS
