"""The real job controller, over the simulated cluster, in a process of its own (so that its CPU
and memory are its own), with every tick timed.

    python -m support.scale.controller_host --etcd HOST:PORT --job NAME --hosts A.sock,B.sock --stats S.json

It runs `JobController.run` unchanged; only `tick` is wrapped to record when it started, how long
it took and how much CPU its thread used in it (less than its wall time when the watches' threads or
other processes held the CPU), and what its watch-fed view of the nodes received (events, whole
reads again). The figures go to `--stats` (rewritten whole, atomically, every second). With
`--profile-dir`, every tick runs under cProfile and the slowest ones' profiles are written there
(`tick-<seconds>.prof`, for `python -m pstats`). A controller
that raises is recorded and started again after a second, as a supervisor would: the bench reports
the crashes, since a crash is a finding.
"""

from __future__ import annotations

import argparse
import cProfile
import heapq
import json
import os
import signal
import threading
import time
import traceback
from collections import deque
from pathlib import Path
from typing import Any

import psutil

from stalwart.controller import JobController
from stalwart.logs import configure
from stalwart.store import Store
from stalwart.store.records import JobState
from support.scale.sim_cluster import SimCluster

MAX_TICKS_KEPT = 100_000
PROFILES_KEPT = 5


class TickLog:
    def __init__(self) -> None:
        # (wall start, seconds, the tick thread's CPU seconds)
        self.ticks: deque[tuple[float, float, float]] = deque(maxlen=MAX_TICKS_KEPT)
        self.crashes: list[dict[str, Any]] = []
        self.finished: str | None = None
        self.view: dict[str, int] = {}  # the controller's nodes view: watch events, resyncs


class TimedController(JobController):
    def __init__(self, *args: Any, ticks: TickLog, profile_dir: Path | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._tick_log = ticks
        self._profile_dir = profile_dir
        self._slowest: list[tuple[float, str]] = []  # a heap of (seconds, file) of the profiles kept

    def tick(self) -> JobState | None:
        profile = cProfile.Profile() if self._profile_dir is not None else None
        wall, start, cpu = time.time(), time.perf_counter(), time.thread_time()
        try:
            if profile is not None:
                profile.enable()
            return super().tick()
        finally:
            if profile is not None:
                profile.disable()
            seconds = time.perf_counter() - start
            self._tick_log.ticks.append((wall, seconds, time.thread_time() - cpu))
            nodes = self.observer.view.nodes
            self._tick_log.view = {"events": nodes.events, "resyncs": nodes.resyncs}
            if profile is not None:
                self._keep_profile(profile, seconds)

    def _keep_profile(self, profile: cProfile.Profile, seconds: float) -> None:
        assert self._profile_dir is not None
        if len(self._slowest) >= PROFILES_KEPT and seconds <= self._slowest[0][0]:
            return
        path = self._profile_dir / f"tick-{seconds:08.3f}-{time.time():.0f}.prof"
        profile.dump_stats(path)
        heapq.heappush(self._slowest, (seconds, str(path)))
        if len(self._slowest) > PROFILES_KEPT:
            Path(heapq.heappop(self._slowest)[1]).unlink(missing_ok=True)


def _write_stats(path: Path, ticks: TickLog, cluster: SimCluster) -> None:
    me = psutil.Process()
    cpu = me.cpu_times()
    doc = {
        "pid": os.getpid(),
        "at": time.time(),
        "rss_bytes": me.memory_info().rss,
        "cpu_seconds": cpu.user + cpu.system,
        "ticks": list(ticks.ticks),
        "crashes": ticks.crashes,
        "view": ticks.view,
        "finished": ticks.finished,
        "listings": cluster.listings,
        "listing_seconds": cluster.listing_seconds,
        "listed_nodes": cluster.listed_nodes,
    }
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc))
    tmp.replace(path)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--etcd", required=True)
    parser.add_argument("--job", required=True)
    parser.add_argument("--hosts", required=True, help="the simulators' control sockets, comma-separated")
    parser.add_argument("--stats", required=True, type=Path)
    parser.add_argument("--profile-dir", type=Path, default=None, help="keep the slowest ticks' cProfile here")
    args = parser.parse_args(argv)
    if args.profile_dir is not None:
        args.profile_dir.mkdir(parents=True, exist_ok=True)
    configure("INFO")  # JSON lines on stderr: the bench sends them to a file
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set() or os._exit(0))  # type: ignore[func-returns-value]
    store = Store(args.etcd)
    cluster = SimCluster(args.hosts.split(","))
    ticks = TickLog()

    def report() -> None:
        while not stop.wait(1.0):
            _write_stats(args.stats, ticks, cluster)

    threading.Thread(target=report, name="stats", daemon=True).start()
    while not stop.is_set():
        try:
            phase = TimedController(store, cluster, args.job, ticks=ticks, profile_dir=args.profile_dir).run(
                leader_timeout=60.0
            )
            ticks.finished = phase.value
            break
        except Exception as exc:
            ticks.crashes.append({"at": time.time(), "error": f"{type(exc).__name__}: {exc}"[:500]})
            traceback.print_exc()
            time.sleep(1.0)
    _write_stats(args.stats, ticks, cluster)


if __name__ == "__main__":
    main()
