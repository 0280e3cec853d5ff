"""How `stalwart run` rides out an etcd it cannot reach (a SIGKILL, a SIGSTOP, a starved machine):
the job's processes keep running, the runner says so in one line and retries, restarts the etcd it
started if that process died (same port, same data: nothing is lost), says when etcd is back, and
only after `limit` seconds without etcd (the job's faultTolerance.etcdOutageSeconds, which its
agents follow too) gives up, so the job is stopped with a summary rather than a traceback. The
controller, if etcd's absence made it exit, is started again by the runner's loop once etcd
answers."""

from __future__ import annotations

import time
from collections.abc import Callable

from stalwart.store.client import StoreUnavailable
from stalwart.store.etcd_server import EtcdServer


class EtcdOutage:
    def __init__(
        self,
        etcd: EtcdServer | None,
        note: Callable[[str], None],
        limit: float,
        clock: Callable[[], float] = time.monotonic,
        may_restart: Callable[[], bool] = lambda: True,
    ) -> None:
        """`limit`: the job's faultTolerance.etcdOutageSeconds, the agents' limit too. `may_restart`:
        False while a `kill-etcd` fault keeps etcd down."""
        self.etcd, self.note, self.limit, self.clock = etcd, note, limit, clock
        self.may_restart = may_restart
        self.since: float | None = None  # etcd's last answer before it went away
        self.last_answer: float | None = None
        self.gave_up: str | None = None  # why the job was stopped, once it was

    def failed(self, exc: StoreUnavailable) -> bool:
        """etcd did not answer; False once it has been away for longer than the limit."""
        now = self.clock()
        if self.since is None:
            self.since = self.last_answer if self.last_answer is not None else now
            self.note(f"etcd unreachable ({exc}); the job keeps running, retrying for up to {self.limit:.0f}s")
        proc = self.etcd.proc if self.etcd is not None else None
        if self.etcd is not None and proc is not None and proc.poll() is not None and self.may_restart():
            self.note(f"etcd exited (code {proc.returncode}); starting it again on {self.etcd.endpoint}, same data")
            try:
                self.etcd.start()
            except RuntimeError as start_failed:
                self.note(f"etcd did not start again: {str(start_failed).splitlines()[0]}")
        if now - self.since > self.limit:
            self.gave_up = (
                f"etcd unreachable for {now - self.since:.0f}s, longer than faultTolerance.etcdOutageSeconds "
                f"({self.limit:g}s): the job was stopped"
            )
            self.note(self.gave_up)
            return False
        return True

    def answered(self) -> None:
        """etcd answered: the outage, if there was one, is over."""
        self.last_answer = self.clock()
        if self.since is not None:
            self.note(f"etcd is back after {self.last_answer - self.since:.1f}s")
            self.since = None
