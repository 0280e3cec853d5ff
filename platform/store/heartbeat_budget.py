"""When an agent writes its heartbeat record into etcd: at once on a change the controller acts on,
otherwise at most once per progress interval, so that a whole job stays under a fixed write budget.

Liveness is the lease alone (a keep-alive message every heartbeat interval, no write). The heartbeat
record carries two kinds of content:

- what the controller acts on: the generation, the agent's state, machine faults, committed
  checkpoints, and per worker its process, exit and verdict, its first step of a generation, its
  newest checkpoint and its log-signature matches. A change in any of these is written at once,
  but for the checkpoints of a job whose progress interval is longer than its heartbeat interval:
  every node saves at the same step, and a big job's nodes all writing at that moment would be the
  very burst the budget exists to prevent (10,000 writes at once at 10,000 nodes, and a controller
  tick that digests every node). They go at the node's next progress write instead, within a
  progress interval: the catalog commits a checkpoint that much later, and a suspension waiting
  for any node's save waits for the first node's phase (an interval / nodes).
- progress: step, loss, step time, tokens/s, phases, the node metric vector. It changes every step
  and is written at most every `progress_interval`: the heartbeat interval for a job of at most
  HEARTBEAT_PUTS_PER_SECOND x interval nodes (every job on one machine: exactly as before), longer
  for bigger ones (20 s at 10,000 nodes and a 500/s budget), so that etcd sees at most
  HEARTBEAT_PUTS_PER_SECOND progress writes a second whatever the job's size.

Each node writes its progress at its own phase of the interval (from its name), not an interval
after its last write: every node writes at once when a checkpoint lands, and timing the next progress
write from there would keep a whole big job writing in one burst each interval (10,000 records at
once at 10,000 nodes) instead of a steady HEARTBEAT_PUTS_PER_SECOND; the controller would also see
a stall only when the next burst came, up to an interval late.

The agent (stalwart.agents.lease_keeper) and the simulated agents of the scale harness write by this
rule; the controller allows for it (its hang timeout and its patience with a silent node are at
least a few progress intervals). Both sides compute the interval from the spec alone
(`job_progress_interval`), so they agree without talking.
"""

from __future__ import annotations

import math
import zlib
from typing import Any

from stalwart.spec.model import TrainingJobSpec
from stalwart.store.records import Heartbeat

HEARTBEAT_PUTS_PER_SECOND = 500  # the whole job's progress writes into etcd, at most


def progress_interval(heartbeat_interval: float, nodes: int) -> float:
    """How often a node of a job of `nodes` nodes writes unchanged-but-for-progress heartbeats."""
    return max(heartbeat_interval, nodes / HEARTBEAT_PUTS_PER_SECOND)


def progress_phase(node: str, interval: float) -> float:
    """Where in each progress interval `node` writes its progress: spread evenly over the job's nodes
    by a hash of the name, the same on every run and in every process."""
    return zlib.crc32(node.encode()) / 2**32 * interval


def job_progress_interval(spec: TrainingJobSpec) -> float:
    """`progress_interval` for a job: its heartbeat interval and its nodes (the roles' replicas; the
    standbys, a few percent more and mostly idle, fit in the budget's slack)."""
    return progress_interval(spec.fault_tolerance.heartbeat_interval_seconds, spec.node_count)


def trouble(beat: Heartbeat) -> tuple[Any, ...]:
    """What in a heartbeat changes when a failure unfolds: exits, log signatures (the newest one's
    time too: a worker keeps a bounded list of matches), machine faults."""
    workers = tuple(
        (w.rank, w.state.value, w.exit_code, len(w.matches), w.matches[-1].matched_at if w.matches else None)
        for w in beat.workers
    )
    return workers, tuple(beat.machine_faults)


def urgent(beat: Heartbeat) -> tuple[Any, ...]:
    """What in a heartbeat moves the job's stage: `trouble`, and a new generation, agent state or
    worker (its process, its verdict, its first step). A change here wakes the controller at once."""
    workers = tuple((w.local_rank, w.pid, w.failure_class, w.blame_scope, w.first_step) for w in beat.workers)
    return beat.generation, beat.agent_state, trouble(beat), workers


def significant(beat: Heartbeat) -> tuple[Any, ...]:
    """What in a heartbeat the controller acts on: `urgent`, and the checkpoints saved. A change
    here is written at once (a save, in a big job, at the node's next progress write)."""
    saves = tuple((s.step, s.generation, tuple(s.tiers), s.total_bytes) for s in beat.checkpoints)
    return urgent(beat), saves, tuple(w.last_checkpoint_step for w in beat.workers)


class HeartbeatGate:
    """Decides, beat by beat, whether this heartbeat goes into etcd (`due`), and remembers what
    went (`wrote`). One per agent; not thread-safe (the lease keeper's thread uses it). `phase`: where
    in each progress interval this node writes its progress (`progress_phase`); it matters only when
    the progress interval is longer than the heartbeat interval."""

    def __init__(self, heartbeat_interval: float, progress_interval: float, phase: float = 0.0) -> None:
        self.heartbeat_interval = heartbeat_interval
        self.progress_interval = progress_interval
        self.phase = phase % progress_interval if progress_interval > 0 else 0.0
        self._written: tuple[Any, ...] | None = None
        self._progress_at = 0.0  # when the next progress write is due

    def due(self, beat: Heartbeat, now: float) -> bool:
        """A change the controller acts on (but a save, in a job that writes progress less often than
        every beat), or progress that is due."""
        if self._written is None or self.progress_due(now):
            return True
        changed = significant(beat)
        if changed == self._written:
            return False
        # (significant()[0] is urgent(): what moves the job's stage goes at once whatever the size)
        return self.saves_at_once or changed[0] != self._written[0]

    @property
    def saves_at_once(self) -> bool:
        """Whether a save is written at once (a job that writes every beat) or with the progress."""
        return self.progress_interval <= self.heartbeat_interval

    def progress_due(self, now: float) -> bool:
        """This node's progress is due: whatever the heartbeat holds, it goes. Half a heartbeat
        interval of slack: a timed beat that wakes a hair early still writes, so a job whose progress
        interval is its heartbeat interval writes every beat, as it always did."""
        return now + self.heartbeat_interval / 2 >= self._progress_at

    def wrote(self, beat: Heartbeat, now: float) -> None:
        self._written = significant(beat)
        if self.saves_at_once:  # (a job that writes every beat)
            self._progress_at = now + self.progress_interval
        else:  # this node's next phase point after this write (a beat a hair early counts as on it)
            reference = now + self.heartbeat_interval / 2 - self.phase
            self._progress_at = (
                self.phase + (math.floor(reference / self.progress_interval) + 1) * self.progress_interval
            )

    def forget(self) -> None:
        """The written record is gone (its lease lapsed): the next beat is written whatever it holds."""
        self._written = None
