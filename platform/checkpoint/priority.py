"""A background thread that yields to training: lower CPU priority (nice) and idle I/O class.

On Linux both are per thread, so the checkpoint writer can run behind the training threads of
the same process: when training wants the cores the writer waits, and it writes in the gaps
(communication waits, data loading, idle cores). Best effort: where the system does not allow it,
the writer runs at normal priority and says so in its log.
"""

from __future__ import annotations

import logging
import os
import threading

import psutil

log = logging.getLogger("stalwart.checkpoint")

WRITER_NICE = 10  # CFS weight 110 against training's 1024: about a tenth of a contended core


def lower_this_thread(nice: int = WRITER_NICE) -> dict[str, bool]:
    """Lower the calling thread's CPU and I/O priority; returns what took effect."""
    tid = threading.get_native_id()
    done = {"nice": False, "ionice": False}
    try:
        os.setpriority(os.PRIO_PROCESS, tid, max(nice, os.getpriority(os.PRIO_PROCESS, tid)))
        done["nice"] = True
    except (OSError, AttributeError) as exc:
        log.info("checkpoint writer runs at normal CPU priority", extra={"context": {"error": str(exc)}})
    try:
        psutil.Process(tid).ionice(psutil.IOPRIO_CLASS_IDLE)
        done["ionice"] = True
    except (OSError, AttributeError, ValueError, psutil.Error) as exc:
        log.info("checkpoint writer runs at normal I/O priority", extra={"context": {"error": str(exc)}})
    return done
