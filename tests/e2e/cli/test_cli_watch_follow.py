"""`stalwart status --watch` and `stalwart logs -f` beside a real `stalwart run` job, ending with it.

The job (tests/data/jobs/e2e.yaml: 2 nodes × 2 gloo workers, 60 steps) runs in its own process on
the session's etcd; once it trains, the watch and the follow start as real processes and the test
waits for them to end by themselves: the watch when the job has finished, the follow when rank 0's
worker has exited or the job has finished.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml
from support import stalwart_run
from support.paths import REPO

from stalwart.processes import spawn, stop_process, wait_for
from stalwart.store import Store, keys
from stalwart.store.etcd_server import EtcdServer
from stalwart.store.records import JobState


def test_status_watch_and_logs_follow_end_when_the_job_does(
    tmp_path: Path, etcd: EtcdServer, stalwart_cmd: list[str]
) -> None:
    job_file = stalwart_run.job_variant(REPO / "tests" / "data" / "jobs" / "e2e.yaml", tmp_path)
    name = yaml.safe_load(job_file.read_text())["metadata"]["name"] + "-watch"
    doc = yaml.safe_load(job_file.read_text())
    doc["metadata"]["name"] = name
    job_file.write_text(yaml.safe_dump(doc))
    store = Store(etcd.endpoint)
    store.delete_prefix(keys.job_prefix(name))
    run_out = tmp_path / "run.out"
    with open(run_out, "wb") as output:
        run = spawn(
            [*stalwart_cmd, "run", str(job_file), "--etcd", etcd.endpoint, "--workdir", str(tmp_path / "run")],
            stdout=output,
        )
    watchers: list[subprocess.Popen[str]] = []
    try:

        def training() -> bool:
            state = store.get(keys.job_state(name), JobState)
            return run.poll() is not None or (state is not None and (state.last_step or 0) > 0)

        assert wait_for(training, 300, interval=0.5) and run.poll() is None, run_out.read_text(errors="replace")
        watch_argv = [*stalwart_cmd, "status", name, "-w", "-o", 'jsonpath={.phase}{"\\n"}', "--etcd", etcd.endpoint]
        follow_argv = [*stalwart_cmd, "logs", name, "-f", "--rank", "0", "--etcd", etcd.endpoint]
        for argv in (watch_argv, follow_argv):
            watchers.append(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        watched, watch_err = watchers[0].communicate(timeout=600)
        followed, follow_err = watchers[1].communicate(timeout=600)
        assert run.wait(timeout=120) == 0, run_out.read_text(errors="replace")
    finally:
        for proc in [*watchers, run]:
            stop_process(proc, grace=30)
        store.close()
    assert watchers[0].returncode == 0, watch_err
    phases = watched.split()
    assert phases[-1] == "Succeeded" and "Running" in phases, watched
    assert watchers[1].returncode == 0, follow_err
    lines = [line for line in followed.splitlines() if line.strip()]
    assert lines and lines[0].startswith("rank 0"), followed
    steps = [line.split()[1] for line in lines if line.startswith("step ")]
    assert steps, followed  # rank 0's own output, each batch under its header
    assert len(steps) == len(set(steps)), followed  # each new line printed once
