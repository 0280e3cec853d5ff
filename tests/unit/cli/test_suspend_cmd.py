"""`stalwart suspend` / `resume` edit spec.suspend in a real etcd; the controller's side is
tests/unit/controller (test_transitions.py, test_controller_loop.py)."""

from __future__ import annotations

import json
import uuid

from typer.testing import CliRunner

from stalwart.cli.main import app
from stalwart.store import Store, keys
from stalwart.store.records import JobStage, JobState

runner = CliRunner()


def job(store: Store, stage: JobStage = JobStage.RUNNING) -> str:
    name = f"susp-{uuid.uuid4().hex[:6]}"
    store.put(keys.job_spec(name), json.dumps({"metadata": {"name": name}, "spec": {"codeVersion": "v1"}}))
    store.put(keys.job_state(name), JobState(job=name, stage=stage, generation=2, created_at=0, updated_at=0))
    return name


def spec_suspend(store: Store, name: str) -> object:
    raw = store.get_raw(keys.job_spec(name))
    assert raw is not None
    return json.loads(raw)["spec"].get("suspend")


def test_suspend_and_resume_set_the_flag_and_keep_the_rest_of_the_spec(store: Store) -> None:
    name = job(store)
    result = runner.invoke(app, ["suspend", name, "--yes", "--no-wait", "--etcd", store.endpoint, "-o", "json"])
    assert result.exit_code == 0, result.output
    assert spec_suspend(store, name) is True and json.loads(result.stdout)["suspend"] is True
    again = runner.invoke(app, ["suspend", name, "-y", "--no-wait", "--etcd", store.endpoint])
    assert again.exit_code == 0 and "already true" in again.output
    result = runner.invoke(app, ["resume", name, "--no-wait", "--etcd", store.endpoint])
    assert result.exit_code == 0, result.output
    assert spec_suspend(store, name) is False
    raw = store.get_raw(keys.job_spec(name))
    assert raw is not None and json.loads(raw)["spec"]["codeVersion"] == "v1"


def test_suspend_asks_first(store: Store) -> None:
    name = job(store)
    result = runner.invoke(app, ["suspend", name, "--etcd", store.endpoint], input="n\n")
    assert result.exit_code != 0 and "nothing was done" in result.output and spec_suspend(store, name) is None


def test_waiting_for_a_controller_that_does_not_come_is_a_clear_error(store: Store) -> None:
    name = job(store)
    result = runner.invoke(app, ["suspend", name, "-y", "--timeout", "1", "--etcd", store.endpoint])
    assert result.exit_code != 0 and "still Running (Running) after 1s" in result.output


def test_a_finished_or_unknown_job_cannot_be_suspended(store: Store) -> None:
    done = job(store, JobStage.SUCCEEDED)
    result = runner.invoke(app, ["suspend", done, "-y", "--etcd", store.endpoint])
    assert result.exit_code != 0 and "has finished (Succeeded)" in result.output
    result = runner.invoke(app, ["resume", "no-such-job", "--etcd", store.endpoint])
    assert result.exit_code != 0 and "no job 'no-such-job'" in result.output
