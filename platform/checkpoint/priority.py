"""A background thread that yields to training: lower CPU priority (nice) and the lowest
best-effort I/O priority.

On Linux both are per thread, so the checkpoint writer can run behind the training threads of
the same process: when training wants the cores the writer waits, and it writes in the gaps
(communication waits, data loading, idle cores). The I/O class is best-effort at its lowest level,
not the idle class: an idle-class writer is served only when no one else reads or writes, so a
data loader that reads without pause could hold a checkpoint back forever. Best effort: where the
system does not allow it, the writer runs at normal priority and says so in its log.
"""

from __future__ import annotations

import logging
import os
import threading

import psutil

log = logging.getLogger("stalwart.checkpoint")

WRITER_NICE = 10  # CFS weight 110 against training's 1024: about a tenth of a contended core
NICE_ENV = "STALWART_CHECKPOINT_WRITER_NICE"  # 0: the writer runs at training's priority
LOWEST_BEST_EFFORT = 7


def writer_nice() -> int:
    """The writer's nice value: STALWART_CHECKPOINT_WRITER_NICE (0 to 19) or WRITER_NICE."""
    raw = os.environ.get(NICE_ENV, "").strip()
    if not raw:
        return WRITER_NICE
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if not 0 <= value <= 19:
        raise ValueError(f"{NICE_ENV}={raw!r}: expected a whole number from 0 (normal priority) to 19 (lowest)")
    return value


def lower_this_thread(nice: int | None = None) -> dict[str, bool]:
    """Lower the calling thread's CPU and I/O priority (never raise them); returns what took effect."""
    nice = writer_nice() if nice is None else nice
    tid = threading.get_native_id()
    done = {"nice": False, "ionice": False}
    if nice <= 0:
        return done
    try:
        os.setpriority(os.PRIO_PROCESS, tid, max(nice, os.getpriority(os.PRIO_PROCESS, tid)))
        done["nice"] = True
    except (OSError, AttributeError) as exc:
        log.info("checkpoint writer runs at normal CPU priority", extra={"context": {"error": str(exc)}})
    try:
        thread = psutil.Process(tid)
        if thread.ionice().ioclass != psutil.IOPRIO_CLASS_IDLE:  # already lower: keep it
            thread.ionice(psutil.IOPRIO_CLASS_BE, LOWEST_BEST_EFFORT)
        done["ionice"] = True
    except (OSError, AttributeError, ValueError, psutil.Error) as exc:
        log.info("checkpoint writer runs at normal I/O priority", extra={"context": {"error": str(exc)}})
    return done
