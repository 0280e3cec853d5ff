"""The worker SDK: what a training script may call to tell its node agent how it is doing.

Everything here is optional and cheap. Outside Stalwart (no STALWART_PROGRESS_SOCKET), every call
is a no-op, so the same script runs under plain torchrun; only the loss check always holds.

    timer = StepTimer()
    for step in ...:
        with timer.phase("data"):
            batch = loader.next_batch()
        with timer.phase("compute"):
            loss = forward_backward(batch)
        with timer.phase("optimizer"):
            optim.step()
        with timer.phase("comm"):
            loss = all_reduce(loss)
        timer.report(step, loss=loss, tokens=n)   # report_step with the step's phase times

A loss that is NaN or infinite raises FloatingPointError("loss is nan ..."): the worker exits with
the line the signature database classifies as a NaN loss, and the controller rolls the job back
(Checkpointer.load honours the rollback bound by itself), with no help from the script.

A step report costs the training thread a few microseconds: it checks the loss, runs the fault hooks
and queues a tuple; a daemon thread builds the report, serialises it and sends it, in order with the
checkpoint reports (`flush` sends what waits at once, as the worker's exit does). The sender wakes
every SEND_INTERVAL and sends what piled up since; a checkpoint report and a process's first step
wake it at once. What its rounds cost the process is kept (`sender_cpu`): the integrations log it
with their hooks' own time.

A training process imports this module, so it must stay light: no grpc, no etcd client, no torch
(tests/unit/agents/test_worker_sdk.py checks it, and .importlinter forbids the imports).
"""

from __future__ import annotations

import atexit
import faulthandler
import json
import logging
import math
import operator
import os
import signal
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, Literal, NamedTuple, Protocol

from stalwart import worker_contract as contract
from stalwart.agents import fault_hooks
from stalwart.agents.cpu_wait import cpu_wait as _thread_cpu_wait
from stalwart.store.records import CheckpointRequest, CheckpointTiming, ProgressReport

STACK_DUMP_SIGNAL = signal.SIGUSR1
Phase = Literal["data", "compute", "optimizer", "comm"]
PHASES: tuple[Phase, ...] = ("data", "compute", "optimizer", "comm")

log = logging.getLogger(__name__)

_sock: socket.socket | None = None
_installed = False
_steps_reported = 0
_unsent: list[tuple[str, bytes]] = []  # (kind, serialised report) built and not yet sent, in order
DATAGRAM_BYTES = 60_000  # the reports one datagram carries, a line each (the agent reads 64 KiB at most)
FLUSH_SECONDS = 5.0
# The sender's round: a step report reaches the agent this late at most (its sent_at says when the
# step ended). Each round's wake-up costs the process more CPU than a report does (measured in
# bench/results/integrations.md: 75 us per 12 ms step at 0.05 s, 30 us at 0.25 s).
SEND_INTERVAL = 0.2
OUTBOX_LIMIT = 4096  # reports queued and not yet built; beyond that (a sender that cannot run) the oldest go
# What the training thread queued for the sender: a step as a plain tuple (building the report is the
# sender's work), (step, loss, tokens, flops, step_time, sent_at, phase times or None), or a whole report.
StepEntry = tuple[int, float | None, int | None, float | None, float | None, float, dict[str, Any] | None]
_outbox: deque[StepEntry | ProgressReport] = deque(maxlen=OUTBOX_LIMIT)
_wake = threading.Event()
_drain_lock = threading.Lock()
_sender: threading.Thread | None = None
_sender_cpu = 0.0  # the sender thread's CPU seconds in its rounds (sender_cpu)
_replay_steps: int | None = -1  # REPLAY_STEPS, read at the first step report (-1: not read yet)
_last_report_at: float | None = None
_saving = False  # a checkpoint save started since the last step report (its staging is in the next step's time)
_request_read: tuple[tuple[int, int], CheckpointRequest | None] | None = None  # (the file's mtime, size), its request
_requests_served: set[str] = set()  # the CheckpointRequests this worker has said yes to


class Layout(NamedTuple):
    """This worker's parallel layout, from the job spec (through the agent's environment)."""

    tp: int
    pp: int
    cp: int
    ep: int
    dp: int


def layout(environ: Mapping[str, str] | None = None) -> Layout:
    """The role's tensor, pipeline, context, expert and data parallel sizes (all 1 outside Stalwart,
    where DP is the world)."""
    env = os.environ if environ is None else environ
    tp, pp, cp, ep = (
        contract.int_var(name, env) or 1
        for name in (
            contract.TENSOR_PARALLEL,
            contract.PIPELINE_PARALLEL,
            contract.CONTEXT_PARALLEL,
            contract.EXPERT_PARALLEL,
        )
    )
    world = contract.int_var(contract.WORLD_SIZE, env) or 1
    dp = contract.int_var(contract.DATA_PARALLEL, env) or max(1, world // (tp * pp * cp))
    return Layout(tp=tp, pp=pp, cp=cp, ep=ep, dp=dp)


def _socket() -> socket.socket | None:
    global _sock
    if _sock is None and os.environ.get(contract.PROGRESS_SOCKET):
        _sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        _sock.setblocking(False)
    return _sock


def _queue(entry: StepEntry | ProgressReport) -> bool:
    """Hand a report to the sender thread (started at the first report under Stalwart); False outside
    Stalwart, where nothing is sent. The process's first report wakes the sender at once (the agent
    sees the first step after a restart without waiting for a round)."""
    if _sender is None:
        if not _start_sender():
            return False
        _outbox.append(entry)
        _wake.set()
        return True
    _outbox.append(entry)
    return True


def _start_sender() -> bool:
    global _sender
    if not os.environ.get(contract.PROGRESS_SOCKET):
        return False
    with _drain_lock:
        if _sender is None:
            atexit.register(_flush_at_exit)
            _sender = threading.Thread(target=_send_forever, name="stalwart-progress", daemon=True)
            _sender.start()
    return True


def _send_forever() -> None:
    global _sender_cpu
    while True:
        _wake.wait(SEND_INTERVAL)
        _wake.clear()
        if not _outbox and not _unsent:
            continue  # nothing reported since the last round
        started = time.thread_time()
        try:
            flush()
        except Exception:  # the sender must outlive anything one round meets
            log.warning("a progress round failed; the next one tries again", exc_info=True)
        _sender_cpu += time.thread_time() - started


def sender_cpu() -> float:
    """CPU seconds the sender thread has spent building and sending reports in this process (0 outside
    Stalwart): what the SDK costs a training process besides the calls on its training thread."""
    return _sender_cpu


def _send(report: ProgressReport) -> None:
    """Queue a whole report (a checkpoint's) behind the steps before it, and wake the sender for it."""
    if _queue(report):
        _wake.set()


def flush() -> bool:
    """Build and send what waits, now, on the calling thread; True when nothing is left waiting.

    Best effort, never blocking: training must not stall on its agent. What piled up since the last
    round goes in one datagram (several if large), a report a line, so a round costs one send however
    many steps it carries. A Unix datagram queue holds only a few datagrams (net.unix.max_dgram_qlen,
    often 10, shared by the node's workers), so when a busy agent lets it fill, the newest report of
    each kind waits for the next round, or for the worker's exit: the last step and checkpoint must not
    be lost, or a job that finished would look stopped short. A report that cannot be built or sent is
    dropped, never raised into training."""
    with _drain_lock:
        sender: dict[str, int | None] | None = None  # who sends: read once a round, not once a report
        while _outbox:
            entry = _outbox.popleft()
            try:
                if isinstance(entry, ProgressReport):
                    built = (entry.kind, entry.dumps().encode())
                else:
                    sender = sender or _identity()
                    built = _step_json(entry, sender)
            except Exception:  # a report the records refuse: progress is best-effort, training goes on
                log.warning("dropped a progress report that could not be built: %r", entry, exc_info=True)
                continue
            _unsent.append(built)
        return _try_unsent()


def _step_report(entry: StepEntry) -> ProgressReport:
    """A queued step as the record the agent reads (what `_step_json` serialises, validated)."""
    return ProgressReport.loads(_step_json(entry, _identity())[1])


def _identity() -> dict[str, int | None]:
    """The fields that say who sent a report: this worker's ranks and generation."""
    rank, local_rank = _ranks()
    return {"rank": rank, "local_rank": local_rank, "generation": contract.int_var(contract.GENERATION)}


def _step_json(entry: StepEntry, sender: Mapping[str, int | None]) -> tuple[Literal["step"], bytes]:
    """A queued step, serialised as a ProgressReport the agent reads (tests/unit/agents checks that it
    is one). Built with json rather than the pydantic models: one report a step, and the models' build
    and dump cost the sender twice as much. Values are coerced as the records would (an integer-like
    step or token count, float-like times); anything else raises, and the report is dropped."""
    step, loss, tokens, flops, step_time, sent_at, phases = entry
    report = {
        "kind": "step",
        **sender,
        "step": operator.index(step),
        "loss": _float(loss),
        "tokens": None if tokens is None else operator.index(tokens),
        "flops": _float(flops),
        "step_time": _float(step_time),
        "sent_at": float(sent_at),
        "phases": None if phases is None else _phases(phases),
    }
    return "step", json.dumps(report).encode()


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def _phases(phases: Mapping[str, Any]) -> dict[str, Any]:
    """A step's phase times as PhaseTimes holds them."""
    out: dict[str, Any] = {name: _float(phases.get(name)) for name in ("data", "compute", "optimizer", "comm", "other")}
    out["saving"] = bool(phases.get("saving", False))
    waits = phases.get("cpu_wait")
    out["cpu_wait"] = None if waits is None else {str(k): float(v) for k, v in waits.items()}
    return out


def _try_unsent() -> bool:
    """Send what waits; True when nothing is left waiting."""
    sock, path = _socket(), os.environ.get(contract.PROGRESS_SOCKET)
    if sock is None or path is None:
        _unsent.clear()  # no agent to send to any more
        return True
    while _unsent:
        count, size = 0, 0
        for _, payload in _unsent:
            if count and size + len(payload) + 1 > DATAGRAM_BYTES:
                break
            count, size = count + 1, size + len(payload) + 1
        try:
            sock.sendto(b"\n".join(payload for _, payload in _unsent[:count]), path)
        except BlockingIOError:  # the agent's queue is full: the newest of each kind, at the next round
            newest = {kind: i for i, (kind, _) in enumerate(_unsent)}
            _unsent[:] = [_unsent[i] for i in sorted(newest.values())]
            return False
        except OSError:
            pass  # the agent is restarting or gone: progress is best-effort
        del _unsent[:count]
    return True


def _flush_at_exit() -> None:
    """The reports that waited, before the worker exits (bounded: an agent that is gone drops them)."""
    deadline = time.monotonic() + FLUSH_SECONDS
    while not flush() and time.monotonic() < deadline:
        time.sleep(0.02)


def _forget_sender() -> None:
    """In a forked child: the parent's sender thread and queue are not this process's."""
    global _sender, _wake, _drain_lock
    _sender, _wake, _drain_lock = None, threading.Event(), threading.Lock()
    _outbox.clear()


os.register_at_fork(after_in_child=_forget_sender)


def _ranks() -> tuple[int, int]:
    return contract.int_var(contract.RANK) or 0, contract.int_var(contract.LOCAL_RANK) or 0


def since_launch(now: float | None = None) -> float | None:
    """Seconds since the agent started this worker (None outside Stalwart): the start-up before the
    script's first line (the fork or spawn, the interpreter, the script's imports)."""
    raw = os.environ.get(contract.LAUNCHED_AT, "")
    try:
        return (time.time() if now is None else now) - float(raw) if raw else None
    except ValueError:
        return None


def install() -> None:
    """Dump all thread stacks to stderr on SIGUSR1, so the agent can capture a hung worker's stack,
    and load the fault hooks a test asked for. Done at import under Stalwart."""
    global _installed
    if not _installed:
        if threading.current_thread() is threading.main_thread():
            faulthandler.register(STACK_DUMP_SIGNAL, file=sys.stderr, all_threads=True)
        fault_hooks.load()
        _installed = True


def check_loss(step: int, loss: float | None) -> None:
    """Raise the NaN failure for a loss that is NaN or infinite (the log line is the signature)."""
    if loss is not None and not math.isfinite(loss):  # (a 0-d tensor converts itself)
        what = "nan" if math.isnan(loss) else "inf"
        raise FloatingPointError(f"loss is {what} at step {step} (reported {loss!r}): rolling back")


def report_step(
    step: int,
    loss: float | None = None,
    tokens: int | None = None,
    step_time: float | None = None,
    *,
    flops: float | None = None,
    data_time: float | None = None,
    compute_time: float | None = None,
    optimizer_time: float | None = None,
    comm_time: float | None = None,
    cpu_wait: Mapping[str, float] | None = None,
) -> None:
    """Report a completed training step (call once per step, after the optimizer step).

    The phase times say where the step went: waiting for data, forward and backward, the
    optimizer step, blocked in communication (seconds; leave out what you do not measure). The
    rest of the wall time since the previous report is reported as `other`. `flops`: the model
    FLOPs this rank did in the step (e.g. 6 x parameters x tokens for a dense transformer's training
    step): with the role's peakFlopsPerWorker, the job's MFU. `cpu_wait`: of data, optimizer and
    other, the seconds the rank waited for a CPU held by other processes (StepTimer measures it).
    """
    global _steps_reported, _last_report_at, _saving
    install()
    if loss is not None:
        loss = float(loss)  # (a tensor's value, read once: the check and the report share it)
    check_loss(step, loss)  # on this thread: the NaN failure stops training at this step
    fault_hooks.at_step(step)
    loss = fault_hooks.reported_loss(step, loss)
    _steps_reported += 1
    now = time.monotonic()
    phases = None
    if data_time is not None or compute_time is not None or optimizer_time is not None or comm_time is not None:
        measured = sum(t for t in (data_time, compute_time, optimizer_time, comm_time) if t is not None)
        phases = {
            "data": data_time,
            "compute": compute_time,
            "optimizer": optimizer_time,
            "comm": comm_time,
            "other": None if _last_report_at is None else max(0.0, now - _last_report_at - measured),
            "saving": _saving,
            "cpu_wait": dict(cpu_wait) if cpu_wait else None,
        }
    _last_report_at, _saving = now, False
    _queue((step, loss, tokens, flops, step_time, time.time(), phases))  # the sender builds and sends it
    _end_replay_if_done()


def report_work(done: int) -> None:
    """A worker that does not step (an RLHF rollout, reward or reference worker) marks each unit of
    work as it takes it on. No progress report goes out: its pace is its upstream's, so silence is not
    a hang (the relay tells the controller when one holds work too long). Injected faults reach it
    here as they reach a trainer at its steps."""
    install()
    fault_hooks.at_step(done)


def _end_replay_if_done() -> None:
    """A replay generation's workers stop, successfully, after the steps the controller asked for."""
    global _replay_steps
    if _replay_steps == -1:
        _replay_steps = contract.int_var(contract.REPLAY_STEPS)  # the worker's environment: read once
    if _replay_steps and _steps_reported >= _replay_steps:
        _flush_at_exit()
        sys.stdout.flush()
        sys.stderr.flush()
        # Every rank of the group stops after the same step's collectives, so none is left waiting;
        # exiting at once skips the process group's teardown, which would wait for the others.
        os._exit(0)


class SaveOutcome(Protocol):
    """What stalwart.checkpoint's SaveResult carries (the SDK does not import the engine: it is torch)."""

    step: int
    committed: bool
    stall_seconds: float
    total_seconds: float
    bytes_written: int
    tiers: list[str]


def _send_checkpoint(step: int, timing: CheckpointTiming | None, data_state: Mapping[str, Any] | None) -> None:
    rank, local_rank = _ranks()
    _send(
        ProgressReport(
            kind="checkpoint",
            rank=rank,
            local_rank=local_rank,
            step=step,
            sent_at=time.time(),
            generation=contract.int_var(contract.GENERATION),
            checkpoint=timing,
            data_state=dict(data_state) if data_state is not None else None,
        )
    )


def saving_checkpoint() -> None:
    """Say that a checkpoint save starts now: the next step report is marked, and the controller's
    straggler scores leave that step out (the save's staging slows the saving ranks, not a machine)."""
    global _saving
    _saving = True


def report_checkpoint(step: int, data_state: Mapping[str, Any] | None = None) -> None:
    """Report that the checkpoint for `step` is committed (without timings: prefer report_save)."""
    _send_checkpoint(step, None, data_state)


def report_save(result: SaveOutcome, data_state: Mapping[str, Any] | None = None) -> None:
    """Report a finished save, committed or not, with the engine's timings (`SaveHandle.wait()`);
    `data_state` is the data loader's `state_delta()` at that step, which lets a standby pre-warm
    its shadow loader for the ranks it takes over."""
    _send_checkpoint(
        result.step,
        CheckpointTiming(
            operation="save",
            committed=result.committed,
            stall_seconds=result.stall_seconds,
            seconds=result.total_seconds,
            bytes_written=result.bytes_written,
            tiers=list(result.tiers),
            # Stalwart's engine says these too (a checkpointer of one's own may not): the job's
            # checkpoint catalog shows them.
            total_bytes=getattr(result, "total_bytes", None) or None,
            location=getattr(result, "location", None),
        ),
        data_state,
    )


def report_load(step: int, seconds: float, tier: str | None) -> None:
    """Report a checkpoint load: the step, how long it took and the tier it came from."""
    _send_checkpoint(
        step, CheckpointTiming(operation="load", seconds=seconds, tiers=[tier] if tier else [], committed=True), None
    )


def _checkpoint_request() -> CheckpointRequest | None:
    """The agent's request file, read again only when it changed (one stat per call otherwise)."""
    global _request_read
    path = os.environ.get(contract.CHECKPOINT_REQUEST)
    if not path:
        return None
    try:
        info = os.stat(path)
    except OSError:
        return None
    version = (info.st_mtime_ns, info.st_size)
    if _request_read is None or _request_read[0] != version:
        try:
            request: CheckpointRequest | None = CheckpointRequest.loads(Path(path).read_bytes())
        except (OSError, ValueError):
            request = None  # (written whole by rename: unreadable only if someone else wrote it)
        _request_read = (version, request)
    return _request_read[1]


def checkpoint_requested(step: int) -> bool:
    """True when the platform asks for a checkpoint at this step: the controller does before it
    suspends the job (Kueue's preemption, `stalwart suspend`), naming a step just ahead of the fastest
    rank, so that every rank saves the same step. Call it after each step and save when it says so;
    it says so once per request (a rank that reads a request only after its step says so at once).
    PeriodicCheckpoints does this by itself. Outside Stalwart: always False."""
    request = _checkpoint_request()
    if request is None or request.id in _requests_served or step < request.step:
        return False
    generation = contract.int_var(contract.GENERATION)
    if generation is not None and generation != request.generation:
        return False  # asked of another generation's workers
    _requests_served.add(request.id)
    return True


class PeriodicCheckpoints:
    """Save every `interval` steps (and at `last_step`, and when the platform asks: checkpoint_requested)
    without waiting for the write, and report each save once it is done (report_save), with the data
    loader's state at that step; a failed save is said on rank 0 and training goes on (the previous
    checkpoint still stands). Works with any checkpointer
    whose `save(state, step)` returns a handle with `done()` and `wait()` (stalwart.checkpoint's does).
    """

    def __init__(self, checkpointer: Any, state: Any, loader: Any, interval: int, last_step: int) -> None:
        self.checkpointer, self.state, self.loader = checkpointer, state, loader
        self.interval, self.last_step = interval, last_step
        self._pending: Any = None
        self._data_state: Mapping[str, Any] | None = None

    def after_step(self, step: int) -> None:
        if self._pending is not None and self._pending.done():
            self._report(self._pending.wait())
        asked = checkpoint_requested(step)  # (asked first: a periodic save at that step answers it too)
        if step % self.interval == 0 or step == self.last_step or asked:
            if self._pending is not None:
                self._report(self._pending.wait())  # one save in flight at a time
            saving_checkpoint()
            self._data_state = self.loader.state_delta()  # the loader's position at this checkpoint
            self._pending = self.checkpointer.save(self.state, step)  # returns once staged

    def finish(self) -> None:
        if self._pending is not None:
            self._report(self._pending.wait())

    def _report(self, result: Any) -> None:
        self._pending = None
        report_save(result, data_state=self._data_state)  # the engine's timings, for the agent's metrics
        if not result.committed and _ranks()[0] == 0:
            print(f"checkpoint at step {result.step} failed: {result.error}", flush=True)


class SampleLog:
    """An audit of what was trained: one JSON line per step with the ids of the samples this rank
    trained on, and the generation that trained them, in `folder/rank-N.jsonl`. A job's recoveries
    skipped and repeated nothing when, keeping each step's newest generation, the steps hold the
    same samples as a clean run's (`stalwart.agents.worker_sdk.trained_samples`). No folder: no-op."""

    def __init__(self, folder: str | os.PathLike[str] | None) -> None:
        self._file: IO[str] | None = None
        if folder:
            os.makedirs(folder, exist_ok=True)
            rank = _ranks()[0]
            self._file = open(os.path.join(folder, f"rank-{rank}.jsonl"), "a", encoding="utf-8")
        self.generation = contract.int_var(contract.GENERATION) or 0

    @property
    def enabled(self) -> bool:
        """Whether steps are recorded (a folder was given): a caller may skip gathering the ids otherwise."""
        return self._file is not None

    def write(self, step: int, sample_ids: Iterable[int]) -> None:
        if self._file is not None:
            ids = [int(i) for i in sample_ids]
            self._file.write(json.dumps({"step": step, "generation": self.generation, "ids": ids}) + "\n")
            self._file.flush()  # a killed worker leaves every step it finished

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def trained_samples(folder: str | os.PathLike[str]) -> dict[int, list[int]]:
    """Step -> the sorted ids every rank trained on at that step, as the job's last word on it: a step
    redone after a restart counts once, from the newest generation that trained it. A line cut short
    by a killed worker is skipped."""
    newest: dict[int, int] = {}
    ids: dict[tuple[int, int], list[int]] = {}
    for path in sorted(Path(folder).glob("rank-*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
                step, generation, sample_ids = int(record["step"]), int(record["generation"]), record["ids"]
            except (ValueError, KeyError, TypeError):
                continue
            newest[step] = max(newest.get(step, generation), generation)
            ids.setdefault((step, generation), []).extend(int(i) for i in sample_ids)
    return {step: sorted(ids[(step, generation)]) for step, generation in sorted(newest.items())}


class StepTimer:
    """Times the phases of a step for report_step: `with timer.phase("data"): ...`, then
    `timer.report(step, loss=...)`. A phase entered several times in a step adds up. Where the
    kernel says (Linux), it also measures how long each phase waited for a CPU held by other
    processes: the straggler scores leave that out of a rank's own work."""

    def __init__(self) -> None:
        self.times: dict[Phase, float] = {}
        self.cpu_waits: dict[Phase, float] = {}
        self._started = time.perf_counter()
        self._waited = _thread_cpu_wait()  # this thread's CPU wait at the step's start (None: not known)

    @contextmanager
    def phase(self, name: Phase) -> Iterator[None]:
        if name not in PHASES:
            raise ValueError(f"unknown phase {name!r} (one of {', '.join(PHASES)})")
        started = time.perf_counter()
        waited = _thread_cpu_wait() if self._waited is not None else None
        try:
            fault_hooks.at_phase(name)  # inside the phase: an injected slow loader is slow data loading
            yield
        finally:
            self.times[name] = self.times.get(name, 0.0) + time.perf_counter() - started
            if waited is not None and (now := _thread_cpu_wait()) is not None:
                self.cpu_waits[name] = self.cpu_waits.get(name, 0.0) + now - waited

    def step_time(self) -> float:
        """Seconds since the step started (the previous report, or the timer's creation)."""
        return time.perf_counter() - self._started

    def report(
        self, step: int, loss: float | None = None, tokens: int | None = None, flops: float | None = None
    ) -> float:
        """report_step with this step's phase times; starts the next step. Returns the step time."""
        elapsed = self.step_time()
        t = self.times
        report_step(
            step,
            loss=loss,
            tokens=tokens,
            flops=flops,
            step_time=elapsed,
            data_time=t.get("data"),
            compute_time=t.get("compute"),
            optimizer_time=t.get("optimizer"),
            comm_time=t.get("comm"),
            cpu_wait=self._own_cpu_waits(),
        )
        self.times, self.cpu_waits = {}, {}
        self._started = time.perf_counter()
        self._waited = _thread_cpu_wait()
        return elapsed

    def _own_cpu_waits(self) -> dict[str, float] | None:
        """The step's CPU waits in the rank's own work: data, optimizer and the rest of the step
        outside the timed phases (None where the kernel does not say)."""
        now = _thread_cpu_wait()
        if self._waited is None or now is None:
            return None
        other = max(0.0, now - self._waited - sum(self.cpu_waits.values()))
        waits = {"data": self.cpu_waits.get("data", 0.0), "optimizer": self.cpu_waits.get("optimizer", 0.0)}
        return {k: round(v, 4) for k, v in {**waits, "other": other}.items() if v >= 0.0001}


if os.environ.get(contract.PROGRESS_SOCKET) and threading.current_thread() is threading.main_thread():
    install()  # at import: a worker that hangs before its first step still answers SIGUSR1
