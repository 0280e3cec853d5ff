"""One job's pods in memory: one LIST, then every change from the operator's own pod watch.

The controller asks `KubernetesCluster` for its nodes every heartbeat interval (every tick while
the job starts or restarts) and the status mirror every status interval; a LIST of 10,000 pods is
tens of MB. kopf already watches every Stalwart pod for the operator (`handlers.pod_event`), so the
cache is fed from that watch rather than from a second one per job: the API server serves one
watch, and a pod deleted or failed shows in the cache as soon as kopf hands over its event.

What a watch can miss, a LIST repairs:
- the first read LISTs the job's pods (label selector); events that arrive while a LIST is in
  flight are applied again on top of its answer, so a LIST never hides a newer event;
- kopf re-lists after 410 Gone or a broken watch, and a re-list reports no DELETED for pods that
  went meanwhile: its listing's events (type None) make every cache LIST again once they settle;
- a full LIST every `resync_seconds` (the operator's `pod_resync_seconds`, 5 minutes by default)
  whatever happened, so nothing stays wrong longer than that;
- a failed LIST keeps the last answer and is retried with a doubling backoff up to
  `BACKOFF_MAX_SECONDS` (only the very first one raises: there is nothing to answer with).

A pod's own create and delete calls are applied at once (read your own writes). Pods are keyed by
uid, with tombstones for deleted uids, so a late event of a deleted pod never brings it back, and
a re-created pod of the same name is a different entry.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from stalwart.logs import ContextLogger

RESYNC_SECONDS = 300.0  # a full LIST this often, whatever the watch said (OperatorConfig.pod_resync_seconds)
RELIST_SETTLE_SECONDS = 1.0  # after kopf's re-list events stop arriving, LIST once
RELIST_WAIT_MAX_SECONDS = 10.0  # ... but no later than this after the first of them
BACKOFF_FIRST_SECONDS = 1.0
BACKOFF_MAX_SECONDS = 60.0
GONE_KEEP_SECONDS = 600.0  # how long a deleted uid is remembered (a late event is seconds late)

Lister = Callable[[], list[dict[str, Any]]]


def slim(pod: Mapping[str, Any]) -> dict[str, Any]:
    """The fields the operator reads, in the pod's own shape (a full pod is 5-10 KB)."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    return {
        "metadata": {
            k: (dict(meta[k]) if k == "labels" else meta[k])
            for k in ("name", "namespace", "uid", "labels", "resourceVersion", "creationTimestamp", "deletionTimestamp")
            if meta.get(k) is not None
        },
        "spec": {"nodeName": spec.get("nodeName")} if spec.get("nodeName") else {},
        "status": {
            **{k: status[k] for k in ("phase", "podIP") if status.get(k) is not None},
            # The scheduler's word on a Pending pod (no machine for it: elastic roles shrink).
            **({"conditions": unscheduled} if (unscheduled := _unscheduled(status)) else {}),
        },
    }


def _unscheduled(status: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The pod's PodScheduled condition when it says the scheduler could not place it."""
    return [
        {k: c[k] for k in ("type", "status", "reason", "message") if k in c}
        for c in status.get("conditions") or []
        if c.get("type") == "PodScheduled" and c.get("status") == "False"
    ]


def _key(pod: Mapping[str, Any]) -> str:
    meta = pod["metadata"]
    return str(meta.get("uid") or meta.get("name"))


class PodCache:
    def __init__(
        self, lister: Lister, *, node_of: Callable[[Mapping[str, Any]], str | None], log: ContextLogger
    ) -> None:
        self._lister = lister
        self._node_of = node_of
        self.log = log
        self.resync_seconds = RESYNC_SECONDS
        self._lock = threading.Lock()  # the map
        self._sync_lock = threading.Lock()  # one LIST at a time
        self._pods: dict[str, dict[str, Any]] = {}
        self._gone: dict[str, float] = {}  # uid -> when its deletion was seen
        self._machines: dict[str, str] = {}  # Stalwart node -> the Kubernetes Node its pod ran on
        self._during: list[tuple[str | None, dict[str, Any]]] | None = None  # events while a LIST runs
        self._synced = False
        self._listed_at = 0.0  # when the last successful LIST started (monotonic)
        self._relist_first: float | None = None
        self._requested: float | None = None  # a LIST wanted at this time (re-list, retry)
        self._reason = ""
        self.lists = 0  # LIST calls made, for the logs and the tests
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    # -- reading -----------------------------------------------------------------------------------
    def pods(self) -> list[dict[str, Any]]:
        """The job's pods as last seen; the first call LISTs them (and raises if it cannot)."""
        if not self._synced:
            with self._sync_lock:
                if not self._synced:
                    self._list("start")
                    self._start_thread()
        with self._lock:
            return list(self._pods.values())

    def machine(self, node: str) -> str | None:
        """The Kubernetes Node the node's pod ran on, remembered after the pod is gone."""
        with self._lock:
            return self._machines.get(node)

    # -- feeding ----------------------------------------------------------------------------------
    def apply(self, kind: str | None, pod: Mapping[str, Any]) -> None:
        """A watch event (ADDED, MODIFIED, DELETED; None for a listing's) or our own write."""
        entry = slim(pod)
        if not entry["metadata"].get("name"):
            return
        with self._lock:
            self._apply(kind, entry, self._pods)
            if self._during is not None:
                self._during.append((kind, entry))

    def forget(self, name: str) -> None:
        """The pod of this name is gone (our delete found it so)."""
        with self._lock:
            for pod in list(self._pods.values()):
                if pod["metadata"]["name"] == name:
                    self._apply("DELETED", pod, self._pods)
                    if self._during is not None:
                        self._during.append(("DELETED", pod))

    def relisted(self) -> None:
        """kopf is listing the pods again (after 410 Gone or a broken watch): LIST once it settles."""
        now = time.monotonic()
        with self._lock:
            if not self._synced:
                return  # the first LIST is still to come
            if self._relist_first is None:
                self._relist_first = now
                self._reason = "the watch re-listed"
            self._requested = min(now + RELIST_SETTLE_SECONDS, self._relist_first + RELIST_WAIT_MAX_SECONDS)
        self._wake.set()

    def _apply(self, kind: str | None, entry: dict[str, Any], pods: dict[str, dict[str, Any]]) -> None:
        key = _key(entry)
        node = self._node_of(entry)
        machine = entry["spec"].get("nodeName")
        if node and machine:
            self._machines[node] = machine
        if kind == "DELETED":
            pods.pop(key, None)
            self._gone[key] = time.monotonic()
        elif key not in self._gone:
            pods[key] = entry

    # -- listing ----------------------------------------------------------------------------------
    def _list(self, reason: str) -> None:
        started = time.monotonic()
        with self._lock:
            self._during = []
            self._relist_first = self._requested = None
        try:
            items = self._lister()
        except BaseException:
            with self._lock:
                self._during = None
            raise
        finally:
            self.lists += 1
        with self._lock:
            horizon = started - GONE_KEEP_SECONDS
            self._gone = {uid: at for uid, at in self._gone.items() if at >= horizon}
            fresh: dict[str, dict[str, Any]] = {}
            for pod in items:
                self._apply("ADDED", slim(pod), fresh)
            for kind, entry in self._during or []:
                self._apply(kind, entry, fresh)
            self._pods, self._during = fresh, None
            self._synced, self._listed_at = True, started
            count = len(fresh)
        self.log.info("pods listed", fields={"pods": count, "reason": reason, "lists": self.lists})

    def _start_thread(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="pod-cache", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        """LIST again when kopf re-listed, after a failed LIST (backoff), and every resync_seconds."""
        backoff = 0.0
        while not self._stop.is_set():
            self._wake.clear()
            with self._lock:
                # A LIST asked for (a re-list settled, a retry after its backoff) comes first; it
                # also stands for the periodic one, which a failed LIST must not make immediate.
                if self._requested is not None:
                    due, reason = self._requested, self._reason
                else:
                    due, reason = self._listed_at + self.resync_seconds, "periodic"
            wait = due - time.monotonic()
            if wait > 0:
                self._wake.wait(wait)
                continue
            try:
                with self._sync_lock:
                    self._list(reason)
                backoff = 0.0
            except Exception as exc:
                backoff = min(max(BACKOFF_FIRST_SECONDS, backoff * 2), BACKOFF_MAX_SECONDS)
                with self._lock:
                    self._requested, self._reason = time.monotonic() + backoff, "retry"
                self.log.warning(
                    "listing the pods failed; serving the last answer",
                    fields={"error": repr(exc)[:300], "retry_in": backoff},
                )

    def close(self) -> None:
        """Stop the resync thread; a later read LISTs again (a parked job's controller comes back)."""
        self._stop.set()
        self._wake.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=10)
        with self._lock:
            self._synced = False
