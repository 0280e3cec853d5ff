"""Lost nodes: a slot node whose lease lapsed; whose machine the cluster reports dead (its processes
exited, its pod failed); or that stays silent after its peers crashed on its closed sockets.

The last two are fenced (the decision revokes their lease) instead of waiting out the TTL. The
cluster is listed only when it matters: a worker just reported a peer's connection closed (often a
few hundred ms before any worker exits), or a crash left a node silent; and at every pool check.

A lapsed lease is not always the node's doing: etcd expires leases by its own clock, so etcd paused
for longer than the TTL lapses every lease at once, and the agents register again when it answers.
So a lapsed lease counts only `outage_grace` after etcd came back (when this controller saw it go)
and `outage_grace` after every slot's lease lapsed together (the same signature, for a controller
that started after the outage or never noticed it).
"""

from __future__ import annotations

from stalwart.controller.core.decision import Needs
from stalwart.controller.core.detectors.base import Detector, Failure, Report, View
from stalwart.controller.core.detectors.node_digests import FailureWatch
from stalwart.controller.core.policy import Classified, outage_grace
from stalwart.spec.model import FailureEvent

GONE_PER_CLUSTER = "its machine is gone (the cluster reports it dead)"  # why a node was fenced at once
MISSED_BEATS_AFTER_CRASH = 3  # with half the lease TTL: how long a node may stay silent after a crash


class LostNodes(Detector):
    name = "lost-nodes"

    def reset(self) -> None:
        self._registered: frozenset[str] | None = None  # slot nodes with a lease at the last look
        self._all_lapsed_at: float | None = None  # when every slot's lease lapsed together
        self._failures = FailureWatch()  # crashes and peer-loss symptoms, kept per node

    def observe(self, view: View) -> Report:
        ft = view.spec.fault_tolerance
        lapsed = f"node lease lapsed (no heartbeat for {ft.lease_ttl_seconds}s)"
        why: dict[str, str] = dict.fromkeys(view.lost() if not self._etcd_may_explain(view) else [], lapsed)
        fence: dict[str, tuple[int, str]] = {}
        first_exit = self._failures.first_exit(view)
        silent = view.silent_since(first_exit) if first_exit is not None and not why else []
        needs = Needs(cluster=bool(silent) or self._failures.peer_trouble(view))
        if needs.cluster and view.cluster is None:
            return Report(needs=needs)
        registered = view.registrations
        if view.cluster is not None:
            for node in view.state.slots:
                info = view.cluster.get(node)
                if node in registered and info is not None and not info.alive:
                    why[node] = f"{GONE_PER_CLUSTER}; lease revoked"
                    fence[node] = (registered[node].lease_id, GONE_PER_CLUSTER)
        # A live node whose workers did not exit writes again within its progress interval (a big
        # job's is longer than the heartbeat interval): never fence it sooner.
        patience = max(
            MISSED_BEATS_AFTER_CRASH * ft.heartbeat_interval_seconds,
            ft.lease_ttl_seconds / 2,
            view.progress_interval + ft.heartbeat_interval_seconds,
        )
        if silent and first_exit is not None and not fence and view.now - first_exit > patience:
            # Its peers just lost their connections to it, so a few missed heartbeats are evidence
            # enough: fence it rather than wait out the TTL.
            reason = f"silent for {patience:g}s since its peers crashed"
            for node in silent:
                if node in registered:
                    why[node] = f"{reason}; lease revoked"
                    fence[node] = (registered[node].lease_id, reason)
        if not why:
            return Report(needs=needs)
        lost = [n for n in view.state.slots if n in why]
        last = [b.sent_at for n in lost if (b := view.beats.get(n)) is not None]
        failed_at = min(last) if last else view.now - ft.lease_ttl_seconds
        what = Classified(FailureEvent.LOST_NODE, lost, [f"{n}: {why[n]}" for n in lost])
        return Report([Failure(what, failed_at=failed_at, detected_at=view.now, fence=fence)], needs=needs)

    def _etcd_may_explain(self, view: View) -> bool:
        """Lapsed leases may still be an etcd outage's: etcd came back, or every slot's lease lapsed
        at once, less than `outage_grace` ago. Idempotent for a given view."""
        slots = frozenset(view.state.slots)
        registered = frozenset(n for n in slots if n in view.registrations)
        if registered == slots:
            self._all_lapsed_at = None
        elif not registered and self._registered in (None, slots) and self._all_lapsed_at is None:
            self._all_lapsed_at = view.now
        self._registered = registered
        since = [t for t in (view.obs.etcd_back_at, self._all_lapsed_at) if t is not None]
        return bool(since) and view.now - max(since) < outage_grace(view.spec.fault_tolerance)
