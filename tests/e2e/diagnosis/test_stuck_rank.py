"""A stuck rank in a real 2-node x 2-process job: the stacks captured on command show which one."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

from support.paths import REPO

from stalwart.controller.shell.diagnosis import collect_stacks, request_stacks
from stalwart.processes import wait_for
from stalwart.store import Store, keys
from stalwart.store.nodes import read_nodes
from stalwart.store.records import JobState

JOB = REPO / "tests" / "data" / "jobs" / "e2e.yaml"


def stalled(store: Store, job: str, since_step: int) -> bool:
    """Every worker has passed `since_step` and none has reported progress for 2 seconds."""
    state = store.get(keys.job_state(job), JobState)
    if state is None:
        return False
    workers = [
        w for b in read_nodes(store, job).heartbeats.values() if b.generation == state.generation for w in b.workers
    ]
    now = time.time()
    return (
        len(workers) == 4
        and all((w.step or 0) >= since_step for w in workers)
        and all(w.exit_code is None and now - (w.last_progress_at or now) > 2 for w in workers)
    )


def test_stacks_show_the_rank_that_differs(tmp_path: Path, store: Store, stalwart_cmd: list[str]) -> None:
    store.delete_prefix(keys.job_prefix("e2e-tiny"))
    argv = [
        *stalwart_cmd,
        "run",
        str(JOB),
        "--etcd",
        store.endpoint,
        "--workdir",
        str(tmp_path / "run"),
        "--inject",
        "hang-worker:rank=1,step=15",
        "--timeout",
        "300",
    ]
    run = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert wait_for(lambda: stalled(store, "e2e-tiny", 15), 180), "the job never stalled"
        t0 = time.monotonic()
        request = request_stacks(store, "e2e-tiny")
        reports = collect_stacks(store, "e2e-tiny", request, ["node-0", "node-1"], timeout=30)
        elapsed = time.monotonic() - t0
        dumps = {d["rank"]: d for r in reports for d in r.stacks}
        assert sorted(dumps) == [0, 1, 2, 3], [r.node for r in reports]
        assert all(d["text"] for d in dumps.values()), {r: d.get("error") for r, d in dumps.items()}
        hung = {rank for rank, d in dumps.items() if "_injected_hang" in d["text"]}
        assert hung == {1}
        for rank in (0, 2, 3):  # the others wait in the collective that rank 1 never joins
            waiting = ("backward", "all_reduce", "all_gather", "barrier")  # a step's or a checkpoint's collective
            assert any(w in dumps[rank]["text"] for w in waiting), dumps[rank]["text"]
        print(f"stacks of 4 ranks captured in {elapsed:.1f}s by {sorted({d['method'] for d in dumps.values()})}")
    finally:
        run.send_signal(signal.SIGINT)
        try:
            run.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            run.kill()
            run.communicate()
        store.delete_prefix(keys.job_prefix("e2e-tiny"))  # the session's etcd serves the worker's next tests
