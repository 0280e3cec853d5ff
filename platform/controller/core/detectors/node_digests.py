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

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from stalwart.controller.core.detectors.base import PEER_TROUBLE_SECONDS, View
from stalwart.controller.core.progress import Progress, progress_of
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
        # (generation, slots, the nodes' own generations) last digested: which workers count
        self._layout: tuple[int, tuple[str, ...], tuple[tuple[str, int], ...]] | None = None
        self._slot_index: dict[str, int] = {}
        self.by_node: dict[str, T] = {}
        self.changed: set[str] = set()  # the nodes redone at the last update (a cache of the whole may stand)

    def update(self, view: View) -> dict[str, T]:
        """Bring the digests to `view`; idempotent for a given view."""
        state = view.state
        changes = view.obs.beat_changes
        nodes = changes.since(self._cursor) if changes is not None else None
        layout = (state.generation, tuple(state.slots), tuple(sorted(state.node_generations.items())))
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


@dataclass(frozen=True)
class NodeProgress:
    """One node's share of the job's `Progress` (stalwart.controller.core.progress), and of the
    count of workers that exited 0 (the job is done when every rank did)."""

    newest_step: int | None
    rank0_loss: float | None
    first_step_at: float | None
    newest_checkpoint: int
    rates: tuple[float, ...]
    workers: int
    exited_zero: int


def node_progress(workers: Sequence[WorkerStatus], _sent_at: float | None = None) -> NodeProgress:
    p = progress_of(workers)
    return NodeProgress(
        newest_step=p.newest_step,
        rank0_loss=p.rank0_loss,
        first_step_at=p.first_step_at,
        newest_checkpoint=p.newest_checkpoint,
        rates=tuple(p.rates()),
        workers=len(workers),
        exited_zero=sum(1 for w in workers if w.exit_code == 0),
    )


class ProgressWatch:
    """The job's `Progress` and its count of workers (and of those that exited 0) from digests: what
    a walk over every worker gives (progress_of), the first rank 0 and the rates' order included.
    The aggregates follow the nodes that changed: counts by difference, the newest step, first step
    and newest checkpoint as counters of the nodes' values (a job's nodes hold a few distinct ones)."""

    def __init__(self) -> None:
        self.digests: NodeDigests[NodeProgress] = NodeDigests(node_progress)
        self._counted: dict[str, NodeProgress] = {}  # what the aggregates below hold of each node
        self._by_node: dict[str, NodeProgress] | None = None  # the digests' dict they were built from
        self._rank0: set[str] = set()  # slot nodes with a rank 0 that reports a loss
        self._steps: Counter[int] = Counter()
        self._firsts: Counter[float] = Counter()
        self._checkpoints: Counter[int] = Counter()
        self._workers = self._exited = 0
        self._whole: tuple[Progress, int, int] | None = None

    def update(self, view: View) -> tuple[Progress, int, int]:
        """(the workers' Progress, how many workers, how many exited 0)."""
        by_node = self.digests.update(view)
        changed = self.digests.changed
        if self._whole is not None and not changed:
            return self._whole
        if by_node is not self._by_node:  # a new layout: every slot again
            self._by_node, self._counted = by_node, {}
            self._rank0 = set()
            self._steps, self._firsts, self._checkpoints = Counter(), Counter(), Counter()
            self._workers = self._exited = 0
            changed = set(by_node)
        for node in changed:
            old = self._counted.get(node)
            if old is not None:
                self._count(old, -1)
            new = self._counted[node] = by_node[node]
            self._count(new, 1)
            if new.rank0_loss is not None:
                self._rank0.add(node)
            else:
                self._rank0.discard(node)
        first_rank0 = self.digests.in_slot_order(self._rank0)[:1]
        slots = list(view.state.slots)

        def rates() -> list[float]:  # the slots' order, each node's workers in order: the walk's sum
            return [r for n in slots if (d := by_node.get(n)) is not None for r in d.rates]

        progress = Progress(
            newest_step=max(self._steps) if self._steps else None,
            rank0_loss=by_node[first_rank0[0]].rank0_loss if first_rank0 else None,
            first_step_at=min(self._firsts) if self._firsts else None,
            newest_checkpoint=max(self._checkpoints, default=0),
            rates=rates,
        )
        self._whole = (progress, self._workers, self._exited)
        return self._whole

    def _count(self, d: NodeProgress, sign: int) -> None:
        _tally(self._steps, d.newest_step, sign)
        _tally(self._firsts, d.first_step_at, sign)
        _tally(self._checkpoints, d.newest_checkpoint, sign)
        self._workers += sign * d.workers
        self._exited += sign * d.exited_zero


K = TypeVar("K", int, float)


def _tally(counter: Counter[K], value: K | None, sign: int) -> None:
    if value is None:
        return
    counter[value] += sign
    if counter[value] <= 0:
        del counter[value]
