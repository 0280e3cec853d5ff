"""`stalwart suspend` / `resume` through etcd: they edit spec.suspend in a real etcd and wait for
the controller; the controller's side is tests/unit/controller (test_transitions.py,
test_controller_loop.py), the Kubernetes path tests/e2e/operator."""

from __future__ import annotations

import json
import uuid

from typer.testing import CliRunner

from stalwart.cli.main import app
from stalwart.ops.errors import EXIT_TIMEOUT
from stalwart.store import Store, keys
from stalwart.store.records import JobStage, JobState

runner = CliRunner()


def job(store: Store, stage: JobStage = JobStage.RUNNING, generation: int = 2) -> str:
    name = f"susp-{uuid.uuid4().hex[:6]}"
    store.put(keys.job_spec(name), json.dumps({"metadata": {"name": name}, "spec": {"codeVersion": "v1"}}))
    set_stage(store, name, stage, generation)
    return name


def set_stage(store: Store, name: str, stage: JobStage, generation: int) -> None:
    store.put(keys.job_state(name), JobState(job=name, stage=stage, generation=generation, created_at=0, updated_at=0))


def spec_suspend(store: Store, name: str) -> object:
    raw = store.get_raw(keys.job_spec(name))
    assert raw is not None
    return json.loads(raw)["spec"].get("suspend")


def test_suspend_sets_the_flag_keeps_the_spec_and_waits_for_the_controller(store: Store) -> None:
    name = job(store)
    result = runner.invoke(app, ["suspend", name, "--timeout", "1", "--etcd", store.endpoint])
    assert result.exit_code == EXIT_TIMEOUT, result.output
    assert "is set to true, but the job is still Running (Running, generation 2) after 1s" in result.output
    raw = store.get_raw(keys.job_spec(name))
    assert spec_suspend(store, name) is True and raw is not None and json.loads(raw)["spec"]["codeVersion"] == "v1"
    set_stage(store, name, JobStage.SUSPENDED, 2)  # what the controller does
    again = runner.invoke(app, ["suspend", name, "--etcd", store.endpoint])
    assert again.exit_code == 0 and "already suspended" in again.output


def test_resume_is_done_when_a_newer_generation_runs(store: Store) -> None:
    name = job(store, JobStage.SUSPENDED)
    store.put(keys.job_spec(name), json.dumps({"metadata": {"name": name}, "spec": {"suspend": True}}))
    result = runner.invoke(app, ["resume", name, "--timeout", "1", "--etcd", store.endpoint])
    assert result.exit_code == EXIT_TIMEOUT and spec_suspend(store, name) is False
    set_stage(store, name, JobStage.RUNNING, 3)
    done = runner.invoke(app, ["resume", name, "--etcd", store.endpoint])
    assert done.exit_code == 0 and "already not suspended" in done.output


def test_a_finished_or_unknown_job_cannot_be_suspended(store: Store) -> None:
    done = job(store, JobStage.SUCCEEDED)
    result = runner.invoke(app, ["suspend", done, "--etcd", store.endpoint])
    assert result.exit_code != 0 and "has finished (Succeeded)" in result.output
    result = runner.invoke(app, ["resume", "no-such-job", "--etcd", store.endpoint])
    assert result.exit_code != 0 and "no job 'no-such-job'" in result.output
