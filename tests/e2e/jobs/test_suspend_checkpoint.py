"""`stalwart suspend` on a running `stalwart run` job checkpoints first, through the platform.

The job (tests/data/jobs/e2e.yaml: 2 nodes x 2 gloo workers of examples/pretrain_tiny.py, whose
PeriodicCheckpoints follows worker_sdk.checkpoint_requested) runs with periodic checkpoints out of
reach. `stalwart suspend` makes the controller ask every rank for a checkpoint at a step it names;
the ranks save it together (a collective DCP save), the controller records it and only then stops
the workers; `stalwart resume` starts the next generation at that step, and the job trains on to
its last step.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml
from support import stalwart_run
from support.paths import REPO

from stalwart.processes import spawn, stop_process, wait_for
from stalwart.store import Store, keys
from stalwart.store.etcd_server import EtcdServer
from stalwart.store.records import CheckpointEntry, CheckpointRequest, Incident, JobState

WAIT = 300.0


@pytest.mark.timeout(900)  # a job, a suspension and a resume: minutes on a starved machine
def test_suspend_saves_the_step_the_controller_asks_for_and_resume_starts_there(
    tmp_path: Path, etcd: EtcdServer, stalwart_cmd: list[str]
) -> None:
    job_file = stalwart_run.job_variant(
        REPO / "tests" / "data" / "jobs" / "e2e.yaml", tmp_path, args=["--steps", "300", "--step-delay", "0.05"]
    )
    doc = yaml.safe_load(job_file.read_text())
    name = doc["metadata"]["name"] = "e2e-tiny-suspend-save"
    doc["spec"]["checkpoint"]["intervalSteps"] = 100_000  # no periodic save: only the one asked for
    job_file.write_text(yaml.safe_dump(doc))
    store = Store(etcd.endpoint)
    store.delete_prefix(keys.job_prefix(name))
    run_out = tmp_path / "run.out"
    with open(run_out, "wb") as output:
        run = spawn(
            [*stalwart_cmd, "run", str(job_file), "--etcd", etcd.endpoint, "--workdir", str(tmp_path / "run")],
            stdout=output,
        )

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        argv = [*stalwart_cmd, *args, name, "--etcd", etcd.endpoint, "--timeout", str(WAIT)]
        return subprocess.run(argv, capture_output=True, text=True, timeout=WAIT + 60)

    def state() -> JobState | None:
        return store.get(keys.job_state(name), JobState)

    try:
        assert wait_for(lambda: run.poll() is not None or ((s := state()) and (s.last_step or 0) >= 5), WAIT, 0.5)
        assert run.poll() is None, run_out.read_text(errors="replace")
        suspended = cli("suspend")
        assert suspended.returncode == 0 and "Suspended" in suspended.stdout, suspended.stdout + suspended.stderr
        after = state()
        assert after is not None and after.stage.value == "Suspended"
        asked, saved = after.suspensions[-1].save_step, after.suspensions[-1].saved_step
        assert asked is not None and saved == asked, after.suspensions
        assert store.get(keys.checkpoint_request(name), CheckpointRequest) is None
        [entry] = store.get_prefix(keys.checkpoints_prefix(name), CheckpointEntry)
        assert entry.step == asked and entry.generation == 1
        resumed = cli("resume")
        assert resumed.returncode == 0, resumed.stdout + resumed.stderr

        # Rank 0's log of the resumed generation, on whichever node holds it (a node that dies
        # before joining on a loaded machine is replaced).
        def resumed_log() -> str:
            logs = (tmp_path / "run" / "nodes").glob("*/gen-0002/rank-0.log")
            return next((t for p in logs if "resuming_from_step=" in (t := p.read_text(errors="replace"))), "")

        assert wait_for(lambda: resumed_log() != "", WAIT, 0.5)
        assert f"resuming_from_step={asked} " in resumed_log()
        assert run.wait(timeout=WAIT) == 0, run_out.read_text(errors="replace")  # trained on to its last step
        assert store.get_prefix(keys.incidents_prefix(name), Incident) == []  # a suspension is no failure
    finally:
        stop_process(run, grace=30)
        store.delete_prefix(keys.job_prefix(name))
        store.close()
