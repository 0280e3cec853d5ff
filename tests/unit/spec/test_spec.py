"""The job spec: valid files load; bad ones are refused naming the file, the field and the problem."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from support.cli_invoke import Cli
from support.paths import REPO

from stalwart.spec import RestartScope, SpecError, load_job

GOOD = """\
apiVersion: stalwart.dev/v1alpha1
kind: TrainingJob
metadata: {name: rlhf}
spec:
  roles:
    - {name: actor, replicas: 2, processesPerNode: 8, command: [python, actor.py], restartScope: Job}
    - {name: reward, replicas: 1, command: [python, reward.py], restartScope: Role, env: {MODE: rm}}
  faultTolerance: {heartbeatIntervalSeconds: 0.5, leaseTtlSeconds: 3}
  failurePolicy: {maxRestarts: 5, rules: [{event: NaNLoss, action: Fail}]}
  checkpoint: {uri: s3://bucket/ckpt, intervalSteps: 100}
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def test_example_job_loads() -> None:
    job = load_job(REPO / "examples" / "pretrain-tiny.yaml")
    assert job.name == "pretrain-tiny"
    assert [r.name for r in job.spec.roles] == ["trainer"]
    assert job.spec.node_count == 2 and job.spec.world_size == 4


def test_several_roles_for_rlhf(tmp_path: Path) -> None:
    job = load_job(write(tmp_path, GOOD))
    assert [r.name for r in job.spec.roles] == ["actor", "reward"]
    assert job.spec.roles[1].restart_scope is RestartScope.ROLE
    assert job.spec.world_size == 17
    assert job.spec.failure_policy.max_restarts == 5


def test_round_trips_through_the_wire_shape(tmp_path: Path) -> None:
    job = load_job(write(tmp_path, GOOD))
    doc = job.model_dump(mode="json", by_alias=True)
    assert doc["spec"]["roles"][0]["processesPerNode"] == 8
    assert doc["apiVersion"] == "stalwart.dev/v1alpha1"


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (("replicas: 2,", "replicas: 0,"), "spec.roles[0].replicas"),
        (("processesPerNode: 8", "procsPerNode: 8"), "spec.roles[0].procsPerNode: unknown field"),
        (("name: reward", "name: actor"), "role name 'actor' appears more than once"),
        (("restartScope: Role", "restartScope: Pod"), "spec.roles[1].restartScope"),
        (("{name: rlhf}", "{name: RLHF_job}"), "metadata.name"),
        (("leaseTtlSeconds: 3", "leaseTtlSeconds: 0.9"), "spec.faultTolerance.leaseTtlSeconds"),
        (("kind: TrainingJob", "kind: Job"), "kind: expected 'TrainingJob'"),
        (("command: [python, actor.py], ", ""), "spec.roles[0].command: required field is missing"),
    ],
)
def test_bad_fields_are_named(tmp_path: Path, edit: tuple[str, str], expected: str) -> None:
    path = write(tmp_path, GOOD.replace(*edit))
    with pytest.raises(SpecError) as info:
        load_job(path)
    message = str(info.value)
    assert str(path) in message
    assert expected in message


def test_missing_roles(tmp_path: Path) -> None:
    path = write(
        tmp_path, "apiVersion: stalwart.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: x}\nspec: {roles: []}\n"
    )
    with pytest.raises(SpecError, match=r"spec\.roles"):
        load_job(path)


def test_not_yaml(tmp_path: Path) -> None:
    path = write(tmp_path, "spec: [unclosed\n")
    with pytest.raises(SpecError, match="not valid YAML"):
        load_job(path)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="cannot read file"):
        load_job(tmp_path / "nope.yaml")


def test_cli_refuses_an_invalid_job_naming_the_field(tmp_path: Path, cli: Cli) -> None:
    path = write(tmp_path, GOOD.replace("replicas: 2,", "replicas: -1,"))
    out = cli("run", str(path))
    assert out.returncode == 2
    assert "spec.roles[0].replicas" in out.stderr
    assert "Traceback" not in out.stderr + out.stdout
    assert not (tmp_path / ".stalwart").exists()  # nothing started, nothing half-written


def test_cli_refuses_a_bad_fault_spec(tmp_path: Path, cli: Cli) -> None:
    path = write(tmp_path, GOOD)
    out = cli("run", str(path), "--inject", "explode:rank=1")
    assert out.returncode == 2
    assert "unknown fault kind 'explode'" in out.stderr
