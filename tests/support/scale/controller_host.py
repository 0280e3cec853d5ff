"""The real job controller, over the simulated cluster, in a process of its own (so that its CPU
and memory are its own), with every tick timed.

    python -m support.scale.controller_host --etcd HOST:PORT --job NAME --hosts A.sock,B.sock --stats S.json

It runs `JobController.run` unchanged; only `tick` is wrapped to record when it started and how
long it took, and what its watch-fed view of the nodes received (events, whole reads again). The
figures go to `--stats` (rewritten whole, atomically, every second). A controller
that raises is recorded and started again after a second, as a supervisor would: the bench reports
the crashes, since a crash is a finding.
"""

from __future__ import annotations

import argparse
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


class TickLog:
    def __init__(self) -> None:
        self.ticks: deque[tuple[float, float]] = deque(maxlen=MAX_TICKS_KEPT)  # (wall start, seconds)
        self.crashes: list[dict[str, Any]] = []
        self.finished: str | None = None
        self.view: dict[str, int] = {}  # the controller's nodes view: watch events, resyncs


class TimedController(JobController):
    def __init__(self, *args: Any, ticks: TickLog, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._tick_log = ticks

    def tick(self) -> JobState | None:
        wall, start = time.time(), time.perf_counter()
        try:
            return super().tick()
        finally:
            self._tick_log.ticks.append((wall, time.perf_counter() - start))
            nodes = self.observer.view.nodes
            self._tick_log.view = {"events": nodes.events, "resyncs": nodes.resyncs}


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
    args = parser.parse_args(argv)
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
            phase = TimedController(store, cluster, args.job, ticks=ticks).run(leader_timeout=60.0)
            ticks.finished = phase.value
            break
        except Exception as exc:
            ticks.crashes.append({"at": time.time(), "error": f"{type(exc).__name__}: {exc}"[:500]})
            traceback.print_exc()
            time.sleep(1.0)
    _write_stats(args.stats, ticks, cluster)


if __name__ == "__main__":
    main()
