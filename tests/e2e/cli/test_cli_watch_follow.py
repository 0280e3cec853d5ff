"""`stalwart status --watch` and `stalwart logs -f` beside a real `stalwart run` job, ending with it.

The job (tests/data/jobs/e2e.yaml's 2 nodes x 2 workers, running tests/data/workers/gated_worker.py)
holds at two steps until the test opens their gates. The watch and the follow start as real processes
while it holds at the first; once the follow has printed rank 0's lines up to it, the first gate opens;
once it has printed the lines up to the second, the second opens, and the test waits for both to end
by themselves: the watch when the job has finished, the follow when rank 0's worker has exited or the
job has finished.
"""

from __future__ import annotations

import subprocess
import threading
from pathlib import Path

import yaml
from support import stalwart_run
from support.paths import REPO

from stalwart.processes import spawn, stop_process, wait_for
from stalwart.store import Store, keys
from stalwart.store.etcd_server import EtcdServer
from stalwart.store.records import JobState

STEPS, HOLDS = 12, (5, 9)


def test_status_watch_and_logs_follow_end_when_the_job_does(
    tmp_path: Path, etcd: EtcdServer, stalwart_cmd: list[str]
) -> None:
    gates = tmp_path / "gates"
    gates.mkdir()
    job_file = stalwart_run.job_variant(
        REPO / "tests" / "data" / "jobs" / "e2e.yaml",
        tmp_path,
        fault_tolerance={"hangTimeoutFloorSeconds": 900},  # the held step is the test's, not a hang
    )
    doc = yaml.safe_load(job_file.read_text())
    name = doc["metadata"]["name"] = doc["metadata"]["name"] + "-watch"
    role = doc["spec"]["roles"][0]
    role["command"] = ["python", "gated_worker.py", str(gates), str(STEPS), ",".join(map(str, HOLDS))]
    role["workingDir"] = str(REPO / "tests" / "data" / "workers")
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
    followed: list[str] = []
    try:

        def training() -> bool:
            state = store.get(keys.job_state(name), JobState)
            return run.poll() is not None or (state is not None and (state.last_step or 0) > 0)

        assert wait_for(training, 300, interval=0.5) and run.poll() is None, run_out.read_text(errors="replace")
        watch_argv = [*stalwart_cmd, "status", name, "-w", "-o", 'jsonpath={.phase}{"\\n"}', "--etcd", etcd.endpoint]
        follow_argv = [*stalwart_cmd, "logs", name, "-f", "--rank", "0", "--etcd", etcd.endpoint]
        for argv in (watch_argv, follow_argv):
            watchers.append(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        follow = watchers[1]
        assert follow.stdout is not None
        reader = threading.Thread(target=lambda: followed.extend(follow.stdout or []), daemon=True)
        reader.start()

        for hold in HOLDS:  # the follow prints the lines before the hold, then the gate lets the job on

            def printed_up_to_the_hold(hold: int = hold) -> bool:
                return follow.poll() is not None or f"step {hold - 1} " in "".join(followed)

            assert wait_for(printed_up_to_the_hold, 300, interval=0.2) and follow.poll() is None, "".join(followed)
            (gates / f"open-{hold}").touch()
        watched, watch_err = watchers[0].communicate(timeout=600)
        follow.wait(timeout=600)
        reader.join(timeout=60)
        follow_err = follow.stderr.read() if follow.stderr else ""
        assert run.wait(timeout=120) == 0, run_out.read_text(errors="replace")
    finally:
        for hold in HOLDS:
            (gates / f"open-{hold}").touch()
        for proc in [*watchers, run]:
            stop_process(proc, grace=30)
        store.close()
    assert watchers[0].returncode == 0, watch_err
    phases = watched.split()
    assert phases[-1] == "Succeeded" and "Running" in phases, watched
    assert follow.returncode == 0, follow_err
    lines = [line for line in followed if line.strip()]
    assert lines and lines[0].startswith("rank 0"), followed
    steps = [int(line.split()[1]) for line in lines if line.startswith("step ")]
    assert steps == sorted(set(steps)), followed  # each new line printed once, in order
    assert set(range(1, HOLDS[-1])) <= set(steps), followed  # lines written while it followed came too
