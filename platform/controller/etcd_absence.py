"""What the controller's loop saw of etcd going away and coming back.

While etcd does not answer the loop decides nothing. When it answers again, leases may have lapsed
meanwhile (etcd expires them by its own clock, and a pause longer than the TTL does it to every one
at once): the agents register again under new leases within a heartbeat or two, so the lost-node
detector gives them `outage_grace` from etcd's return before it counts a missing lease as a lost
node (stalwart.controller.detectors.lost_nodes). The controller's own leadership may have lapsed the
same way: it takes it again if nobody else did (controller.py).
"""

from __future__ import annotations

from stalwart.logs import ContextLogger
from stalwart.spec.model import FaultTolerance

OUTAGE_GRACE_TTLS = 2  # after etcd's return, nodes have this many lease TTLs to register again


def outage_grace(ft: FaultTolerance) -> float:
    """How long after etcd's return a lapsed lease is still taken for the outage's, not the node's."""
    return OUTAGE_GRACE_TTLS * ft.lease_ttl_seconds


class EtcdAbsence:
    def __init__(self, log: ContextLogger, limit: float) -> None:
        """`limit`: faultTolerance.etcdOutageSeconds, past which the agents stop their workers."""
        self.log, self.limit = log, limit
        self.since: float | None = None  # etcd stopped answering (None: it answers)
        self.back_at: float | None = None  # when it last answered again after not answering
        self._past_limit = False

    def failed(self, now: float, exc: Exception) -> None:
        if self.since is None:
            self.since = now
            self.log.warning("etcd unreachable; retrying", fields={"error": str(exc), "limit_seconds": self.limit})
        if not self._past_limit and now - self.since > self.limit:
            self._past_limit = True
            self.log.error(
                "etcd unreachable for longer than faultTolerance.etcdOutageSeconds: the agents stop "
                "their workers; nodes that do not come back when etcd does are replaced",
                fields={"away": round(now - self.since, 1), "limit_seconds": self.limit},
            )

    def answered(self, now: float) -> None:
        if self.since is not None:
            self.log.info("etcd is back", fields={"after": round(now - self.since, 1)})
            self.since, self.back_at, self._past_limit = None, now, False

    def explains(self, now: float, window: float) -> bool:
        """etcd is away, or came back less than `window` ago: a lapsed lease may be its doing."""
        return self.since is not None or (self.back_at is not None and now - self.back_at <= window)
