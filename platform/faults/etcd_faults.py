"""etcd faults for `stalwart run --inject`, on the etcd the run started: `pause-etcd` (SIGSTOP, then
SIGCONT after `seconds`: a hung or starved etcd, every call times out and leases lapse on its
return) and `kill-etcd` (SIGKILL; the runner starts it again on its port with its data, no sooner
than `seconds` later). The job is meant to ride both out (docs/control-plane.md, "When etcd is away")."""

from __future__ import annotations

import os
import signal
import threading
import time

from stalwart.logs import get_logger
from stalwart.store.etcd_server import EtcdServer

DEFAULT_PAUSE_SECONDS = 10.0

log = get_logger("stalwart.faults")


class EtcdFaults:
    def __init__(self, etcd: EtcdServer | None) -> None:
        self.etcd = etcd
        self._down_until = 0.0  # monotonic: a killed etcd is not started again before then
        self._paused: int | None = None  # the pid stopped by pause-etcd
        self._resume_timer: threading.Timer | None = None
        self._lock = threading.Lock()

    def pause(self, seconds: float | None) -> str | None:
        """SIGSTOP etcd now and SIGCONT it `seconds` later; what was paused, or None (no etcd of ours)."""
        pid = self._pid()
        if pid is None:
            return None
        length = seconds or DEFAULT_PAUSE_SECONDS
        with self._lock:
            os.kill(pid, signal.SIGSTOP)
            self._paused = pid
            self._resume_timer = threading.Timer(length, self.resume)
            self._resume_timer.daemon = True
            self._resume_timer.start()
        return f"etcd (pid {pid}) for {length:g}s"

    def resume(self) -> None:
        with self._lock:
            pid, self._paused = self._paused, None
            if pid is not None:
                try:
                    os.kill(pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
                log.warning("fault injection: etcd resumed", fields={"pid": pid})

    def kill(self, seconds: float | None) -> str | None:
        """SIGKILL etcd; the runner's outage handling starts it again once `may_restart()`."""
        pid = self._pid()
        if pid is None or self.etcd is None or self.etcd.proc is None:
            return None
        self._down_until = time.monotonic() + (seconds or 0.0)
        os.kill(pid, signal.SIGKILL)
        self.etcd.proc.wait()
        return f"etcd (pid {pid})" + (f", down for {seconds:g}s" if seconds else "")

    def may_restart(self) -> bool:
        return time.monotonic() >= self._down_until

    def close(self) -> None:
        """No etcd is left stopped (it must be able to exit) and no timer left running."""
        timer = self._resume_timer
        if timer is not None:
            timer.cancel()
        self.resume()

    def _pid(self) -> int | None:
        proc = self.etcd.proc if self.etcd is not None else None
        return proc.pid if proc is not None and proc.poll() is None else None
