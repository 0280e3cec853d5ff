"""The worker processes of one node for one generation: launch, watch, stop."""

from __future__ import annotations

import math
import os
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from stalwart import worker_contract as contract
from stalwart.processes import ChildProcess, spawn, stop_process
from stalwart.signatures import LogScanner, SignatureMatch, classify_exit
from stalwart.store.records import (
    Assignment,
    LogMatch,
    NodeAssignment,
    ProgressReport,
    WorkerState,
    WorkerStatus,
)

# (argv, env, cwd, log) -> a started worker, or None to spawn it cold.
Launcher = Callable[[list[str], dict[str, str], Path, Path], "ChildProcess | None"]

LOG_TAIL_LINES = 40
MAX_MATCHES_KEPT = 20  # per worker, the most recent: a heartbeat stays small
SCAN_BYTES_PER_TICK = 1 << 20  # a worker printing faster than this is scanned over several ticks
PEAK_LOSS_BEATS = 3  # the peak loss covers the steps of this many heartbeat intervals


def tail_lines(path: Path, lines: int = LOG_TAIL_LINES, max_bytes: int = 64 * 1024) -> list[str]:
    """The last `lines` lines of a log file, reading at most `max_bytes` from its end."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read()
    except FileNotFoundError:
        return []
    text = data.decode(errors="replace")
    return [line[:500] for line in deque(text.splitlines(), maxlen=lines)]


@dataclass
class Worker:
    local_rank: int
    rank: int
    proc: ChildProcess
    log_path: Path
    status: WorkerStatus = field(init=False)
    scanner: LogScanner = field(init=False)
    scanned: int = 0  # bytes of the log already scanned
    losses: deque[tuple[float, int, float]] = field(default_factory=deque)  # (reported at, step, loss), recent

    def note_loss(self, now: float, step: int, loss: float | None, window: float) -> None:
        """Keep the peak of the recent losses in the status (a finite loss; NaN is the SDK's own failure)."""
        if loss is not None and math.isfinite(loss):
            self.losses.append((now, step, loss))
        while self.losses and self.losses[0][0] < now - window:
            self.losses.popleft()
        if self.losses:
            _, self.status.peak_loss_step, self.status.peak_loss = max(self.losses, key=lambda entry: entry[2])

    def __post_init__(self) -> None:
        self.status = WorkerStatus(
            local_rank=self.local_rank,
            rank=self.rank,
            pid=self.proc.pid,
            state=WorkerState.RUNNING,
            started_at=time.time(),
        )
        self.scanner = LogScanner(rank=self.rank)

    def scan(self, final: bool = False) -> list[SignatureMatch]:
        """Feed what the worker printed since the last scan through the signature scanner."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self.scanned)
                data = f.read(SCAN_BYTES_PER_TICK if not final else 16 * SCAN_BYTES_PER_TICK)
        except FileNotFoundError:
            return []
        self.scanned += len(data)
        found = self.scanner.feed(data.decode(errors="replace")) if data else []
        if final:
            found += self.scanner.flush()
        if found:
            kept = self.status.matches + [
                LogMatch(
                    failure_class=m.failure_class,
                    scope=m.scope.value,
                    severity=m.severity.value,
                    line=m.line,
                    line_number=m.line_number,
                    matched_at=m.matched_at,
                )
                for m in found
            ]
            self.status.matches = kept[-MAX_MATCHES_KEPT:]
        return found


class WorkerGroup:
    """One node's workers for one generation."""

    def __init__(
        self,
        assignment: Assignment,
        node: NodeAssignment,
        command: list[str],
        envs: Sequence[Mapping[str, str]],
        working_dir: Path,
        log_dir: Path,
        launcher: Launcher | None = None,
        heartbeat_interval: float = 1.0,
    ) -> None:
        """One worker per environment in `envs` (local rank order; stalwart.agents.launcher.worker_env
        makes them). `launcher` may start a worker faster than a cold spawn (a warm worker); when it
        returns None the worker is spawned cold. Each status's peak loss covers the steps of the last
        PEAK_LOSS_BEATS heartbeat intervals."""
        if len(envs) != node.local_world_size:
            raise ValueError(f"{len(envs)} worker environments for {node.local_world_size} local ranks")
        self.generation = assignment.generation
        self.peak_loss_window = PEAK_LOSS_BEATS * heartbeat_interval
        self.workers: list[Worker] = []
        self.warm_starts = 0
        log_dir.mkdir(parents=True, exist_ok=True)
        for local_rank, env in enumerate(envs):
            worker_env = {**env, contract.LAUNCHED_AT: f"{time.time():.6f}"}
            log_path = log_dir / f"rank-{node.first_rank + local_rank}.log"
            # The log is appended to: skip earlier runs' lines, measured before the start (a forked
            # worker may have printed its first lines by the time the launcher returns).
            earlier = log_path.stat().st_size if log_path.exists() else 0
            proc: ChildProcess | None = launcher(list(command), worker_env, working_dir, log_path) if launcher else None
            self.warm_starts += proc is not None
            if proc is None:
                with open(log_path, "ab") as log:
                    proc = spawn(command, env=worker_env, cwd=working_dir, stdout=log)
            self.workers.append(Worker(local_rank, node.first_rank + local_rank, proc, log_path, scanned=earlier))

    @property
    def running(self) -> bool:
        """Whether any worker still runs (as of the last poll)."""
        return any(w.status.state is WorkerState.RUNNING for w in self.workers)

    def scan(self) -> list[SignatureMatch]:
        """New signature matches in the running workers' output."""
        return [m for w in self.workers if w.status.state is WorkerState.RUNNING for m in w.scan()]

    def poll(self) -> tuple[bool, list[SignatureMatch]]:
        """Record exits, with the verdict on each; (any exited since the last poll, matches found)."""
        changed = False
        found: list[SignatureMatch] = []
        for w in self.workers:
            if w.status.state is WorkerState.RUNNING and w.proc.poll() is not None:
                w.status.state = WorkerState.EXITED
                w.status.exit_code = w.proc.returncode
                w.status.exited_at = time.time()
                found += w.scan(final=True)
                if w.proc.returncode != 0:
                    w.status.log_tail = tail_lines(w.log_path)
                    verdict = classify_exit(w.proc.returncode, w.status.log_tail, pid=w.proc.pid, rank=w.rank)
                    w.status.failure_class = verdict.failure_class
                    w.status.blame_scope = verdict.scope.value if verdict.scope else None
                    w.status.failure_reason = verdict.reason
                changed = True
        return changed, found

    def record(self, report: ProgressReport) -> None:
        if not 0 <= report.local_rank < len(self.workers):
            return
        if report.generation is not None and report.generation != self.generation:
            return  # sent by the previous generation's worker before it stopped
        s = self.workers[report.local_rank].status
        if report.kind == "checkpoint":
            timing = report.checkpoint
            if timing is None or (timing.operation == "save" and timing.committed):
                s.last_checkpoint_step, s.last_checkpoint_data = report.step, report.data_state
            return
        now = report.sent_at or time.time()
        if s.first_step is None:
            s.first_step, s.first_step_at, s.first_loss = report.step, now, report.loss
        s.step, s.loss, s.step_time, s.last_progress_at = report.step, report.loss, report.step_time, now
        s.phases = report.phases
        self.workers[report.local_rank].note_loss(now, report.step, report.loss, self.peak_loss_window)
        if report.tokens is not None and report.step_time:
            s.tokens_per_second = report.tokens / report.step_time
        if report.flops is not None and report.step_time:
            s.flops_per_second = report.flops / report.step_time

    def statuses(self) -> list[WorkerStatus]:
        return [w.status.model_copy() for w in self.workers]

    def stop(self, grace: float) -> None:
        for w in self.workers:
            if w.proc.poll() is None:
                w.proc.terminate()
        deadline = time.monotonic() + grace
        for w in self.workers:
            stop_process(w.proc, grace=max(0.0, deadline - time.monotonic()))
        self.poll()

    def stack_targets(self) -> list[tuple[int, int, Path]]:
        """(pid, rank, log) of each running worker."""
        return [(w.proc.pid, w.rank, w.log_path) for w in self.workers if w.status.state is WorkerState.RUNNING]
