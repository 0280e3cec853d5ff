"""The worker SDK: what a training script may call to tell its node agent how it is doing.

Everything here is optional and cheap. Outside Stalwart (no STALWART_PROGRESS_SOCKET), every call
is a no-op, so the same script runs under plain torchrun.
"""

from __future__ import annotations

import atexit
import faulthandler
import os
import signal
import socket
import sys
import time
from typing import Protocol

from stalwart.store.records import CheckpointTiming, ProgressReport

PROGRESS_SOCKET_ENV = "STALWART_PROGRESS_SOCKET"
STACK_DUMP_SIGNAL = signal.SIGUSR1
HANG_SIGNAL = signal.SIGUSR2  # fault injection: hang at the next report_step (tests, demos)
HANG_LIMIT_SECONDS = 3600.0
# Fault injection: a rank turns slow, as on a throttled GPU or a flapping link: every later step
# pays this much more, before its next collective, so the other ranks wait for it there.
SLOW_SIGNAL: int = signal.SIGRTMIN + 1
SLOW_STEP_SECONDS = 0.4
# A replay generation's workers stop, successfully, after this many steps (set by the agent).
REPLAY_STEPS_ENV = "STALWART_REPLAY_STEPS"
GENERATION_ENV = "STALWART_GENERATION"  # set by the agent: the generation this worker belongs to
# Fault injection: a bad machine that passes every check but kills its workers, with no message,
# after this many steps of every run (set on the node's agent, so its workers inherit it).
CRASH_AFTER_STEPS_ENV = "STALWART_FAULT_CRASH_AFTER_STEPS"
CRASH_EXIT_CODE = 134

_sock: socket.socket | None = None
_installed = False
_hang_requested = False
_slow_requested = False
_steps_reported = 0
_unsent: dict[str, ProgressReport] = {}  # report kind -> the newest report the agent's queue refused
FLUSH_SECONDS = 5.0


def threading_is_main() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def _socket() -> socket.socket | None:
    global _sock
    if _sock is None and os.environ.get(PROGRESS_SOCKET_ENV):
        _sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        _sock.setblocking(False)
        atexit.register(_flush_at_exit)
    return _sock


def _send(report: ProgressReport) -> None:
    """Best effort, never blocking: training must not stall on its agent. A Unix datagram queue
    holds only a few reports (net.unix.max_dgram_qlen, often 10), so when a busy agent lets it fill,
    the newest report of each kind waits here for the next call, or for the worker's exit: the last
    step and checkpoint must not be lost, or a job that finished would look stopped short."""
    if _socket() is None:
        return
    _unsent[report.kind] = report
    _try_unsent()


def _try_unsent() -> bool:
    """Send what waits; True when nothing is left waiting."""
    sock = _socket()
    for kind, report in list(_unsent.items()):
        if sock is None:
            break
        try:
            sock.sendto(report.dumps().encode(), os.environ[PROGRESS_SOCKET_ENV])
        except BlockingIOError:
            return False  # the agent's queue is full: again at the next report
        except OSError:
            pass  # the agent is restarting or gone: progress is best-effort
        del _unsent[kind]
    return True


def _flush_at_exit() -> None:
    """The reports that waited, before the worker exits (bounded: an agent that is gone drops them)."""
    deadline = time.monotonic() + FLUSH_SECONDS
    while not _try_unsent() and time.monotonic() < deadline:
        time.sleep(0.02)


def _ranks() -> tuple[int, int]:
    return int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))


def _generation() -> int | None:
    raw = os.environ.get(GENERATION_ENV)
    return int(raw) if raw and raw.isdigit() else None


def _request_hang(_signum: int, _frame: object) -> None:
    global _hang_requested
    _hang_requested = True


def _request_slowdown(_signum: int, _frame: object) -> None:
    global _slow_requested
    _slow_requested = True


def _injected_hang() -> None:
    """Where an injected hang waits: a rank stuck before its next collective, as a real one would be."""
    deadline = time.monotonic() + HANG_LIMIT_SECONDS
    while time.monotonic() < deadline:
        time.sleep(0.1)


def install() -> None:
    """Dump all thread stacks to stderr on SIGUSR1 (so the agent can capture a hung worker's stack),
    hang at the next step on SIGUSR2 and turn slow on SIGRTMIN+1 (fault injection). Done at import
    under Stalwart."""
    global _installed
    if not _installed:
        faulthandler.register(STACK_DUMP_SIGNAL, file=sys.stderr, all_threads=True)
        signal.signal(HANG_SIGNAL, _request_hang)
        signal.signal(SLOW_SIGNAL, _request_slowdown)
        _installed = True


def report_step(
    step: int,
    loss: float | None = None,
    tokens: int | None = None,
    step_time: float | None = None,
) -> None:
    """Report a completed training step (call once per step, after the optimizer step)."""
    global _steps_reported
    install()
    if _hang_requested:
        _injected_hang()
    if _slow_requested:
        time.sleep(SLOW_STEP_SECONDS)
    _steps_reported += 1
    if os.environ.get(CRASH_AFTER_STEPS_ENV) and _steps_reported >= int(os.environ[CRASH_AFTER_STEPS_ENV]):
        os._exit(CRASH_EXIT_CODE)
    rank, local_rank = _ranks()
    _send(
        ProgressReport(
            kind="step",
            rank=rank,
            local_rank=local_rank,
            generation=_generation(),
            step=step,
            loss=loss,
            tokens=tokens,
            step_time=step_time,
            sent_at=time.time(),
        )
    )
    _end_replay_if_done()


def _end_replay_if_done() -> None:
    if os.environ.get(REPLAY_STEPS_ENV) and _steps_reported >= int(os.environ[REPLAY_STEPS_ENV]):
        _flush_at_exit()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)  # every rank of the group stops after the same step's collectives: none is left waiting


class SaveOutcome(Protocol):
    """What stalwart.checkpoint's SaveResult carries (the SDK does not import the engine: it is torch)."""

    step: int
    committed: bool
    stall_seconds: float
    total_seconds: float
    bytes_written: int
    tiers: list[str]


def _send_checkpoint(step: int, timing: CheckpointTiming | None) -> None:
    rank, local_rank = _ranks()
    _send(
        ProgressReport(
            kind="checkpoint",
            rank=rank,
            local_rank=local_rank,
            step=step,
            sent_at=time.time(),
            generation=_generation(),
            checkpoint=timing,
        )
    )


def report_checkpoint(step: int) -> None:
    """Report that the checkpoint for `step` is committed (without timings: prefer report_save)."""
    _send_checkpoint(step, None)


def report_save(result: SaveOutcome) -> None:
    """Report a finished save, committed or not, with the engine's timings (`SaveHandle.wait()`)."""
    _send_checkpoint(
        result.step,
        CheckpointTiming(
            operation="save",
            committed=result.committed,
            stall_seconds=result.stall_seconds,
            seconds=result.total_seconds,
            bytes_written=result.bytes_written,
            tiers=list(result.tiers),
        ),
    )


def report_load(step: int, seconds: float, tier: str | None) -> None:
    """Report a checkpoint load: the step, how long it took and the tier it came from."""
    _send_checkpoint(
        step, CheckpointTiming(operation="load", seconds=seconds, tiers=[tier] if tier else [], committed=True)
    )


if os.environ.get(PROGRESS_SOCKET_ENV) and threading_is_main():
    install()  # at import: a worker that hangs before its first step still answers SIGUSR1
