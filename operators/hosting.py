"""One JobController per TrainingJob, each on its own thread inside the operator.

The controller is the platform's, unchanged: a level-triggered loop whose state is in etcd. So a
hosted controller can be stopped at any tick (a suspended job parked, deletion, the operator losing
leadership) and started again later, here or in another replica, and it carries on from etcd. Its per-job
etcd leadership still guards every commit, so even two hosts never both act for one job.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from stalwart.cluster.base import Cluster
from stalwart.controller import JobController, NotLeader
from stalwart.logs import get_logger
from stalwart.store import keys
from stalwart.store.client import Store
from stalwart.store.records import JobState

RETRY_SECONDS = 1.0
log = get_logger("stalwart.operator.hosting")


class ControllerStopped(Exception):
    """Raised inside the controller's loop to leave it at a tick boundary."""


class HostedController(JobController):
    """The platform's controller with a stop switch checked at every tick."""

    def __init__(self, store: Store, cluster: Cluster, job_name: str, stop: threading.Event) -> None:
        super().__init__(store, cluster, job_name)
        self._stop = stop

    def tick(self):  # type: ignore[no-untyped-def]
        if self._stop.is_set():
            raise ControllerStopped(self.job_name)
        return super().tick()


@dataclass
class _Hosted:
    thread: threading.Thread
    stop: threading.Event
    cluster: Cluster


class ControllerHost:
    """Starts, restarts and stops the controllers of the jobs this operator serves."""

    def __init__(self, store: Store, leader_timeout: float = 30.0) -> None:
        self.store = store
        self.leader_timeout = leader_timeout
        self._jobs: dict[str, _Hosted] = {}
        self._lock = threading.Lock()

    def running(self, job_id: str) -> bool:
        with self._lock:
            hosted = self._jobs.get(job_id)
        return hosted is not None and hosted.thread.is_alive()

    def ensure(self, job_id: str, make_cluster: Callable[[], Cluster]) -> bool:
        """Host the job's controller unless it is hosted already or the job has finished.
        True if a new controller thread started."""
        with self._lock:
            hosted = self._jobs.get(job_id)
            if hosted is not None and hosted.thread.is_alive():
                return False
            state = self.store.get(keys.job_state(job_id), JobState)
            if state is not None and state.phase.terminal:
                return False  # its controller wound it up (or a previous operator's did)
            stop = threading.Event()
            cluster = make_cluster()
            hosted = _Hosted(
                thread=threading.Thread(
                    target=self._run, args=(job_id, cluster, stop), name=f"controller-{job_id}", daemon=True
                ),
                stop=stop,
                cluster=cluster,
            )
            self._jobs[job_id] = hosted
            hosted.thread.start()
            return True

    def _run(self, job_id: str, cluster: Cluster, stop: threading.Event) -> None:
        jlog = log.bind(job=job_id)
        while not stop.is_set():
            try:
                phase = HostedController(self.store, cluster, job_id, stop).run(leader_timeout=self.leader_timeout)
                jlog.info("controller finished", fields={"phase": phase.value})
                return
            except ControllerStopped:
                jlog.info("controller stopped")
                return
            except NotLeader as exc:
                jlog.info(
                    "another controller leads this job; waiting",
                    fields={"reason": str(exc)},
                )
            except Exception as exc:
                jlog.exception(
                    "controller crashed; starting a new one",
                    fields={"error": repr(exc)},
                )
            stop.wait(RETRY_SECONDS)

    def stop(self, job_id: str, timeout: float = 30.0) -> None:
        """Stop the job's controller at its next tick and wait for it (its pods stay)."""
        with self._lock:
            hosted = self._jobs.pop(job_id, None)
        if hosted is None:
            return
        hosted.stop.set()
        hosted.thread.join(timeout=timeout)
        if hosted.thread.is_alive():
            log.warning("controller did not stop in time", fields={"job": job_id})
        hosted.cluster.close()

    def stop_all(self, timeout: float = 30.0) -> None:
        with self._lock:
            jobs = list(self._jobs)
        for job_id in jobs:
            self.stop(job_id, timeout)

    def jobs(self) -> list[str]:
        with self._lock:
            return sorted(self._jobs)
