"""What a data-plane worker reads from its environment, and the spec's dataPlane section."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.paths import REPO

from stalwart.rlhf.contract import ContractError, DataPlaneContext, dataplane_env
from stalwart.rlhf.relay_server import main as relay_main
from stalwart.spec import DataPlaneSettings, SpecError, load_job


def test_the_environment_round_trips() -> None:
    settings = DataPlaneSettings(max_weight_staleness=0, relay_capacity=8, lease_seconds=5)
    ctx = DataPlaneContext.from_env(dataplane_env("job-1", "127.0.0.1:2379", settings, "tok"))
    assert (ctx.job, ctx.etcd, ctx.settings, ctx.token, ctx.address) == (
        "job-1",
        "127.0.0.1:2379",
        settings,
        "tok",
        "127.0.0.1",
    )


def test_what_is_missing_or_wrong_is_named() -> None:
    with pytest.raises(ContractError, match="STALWART_JOB and STALWART_ETCD"):
        DataPlaneContext.from_env({})
    env = dataplane_env("j", "127.0.0.1:1", DataPlaneSettings())
    env["STALWART_DATAPLANE"] = '{"relayCapacity": 0}'
    with pytest.raises(ContractError, match="(?s)STALWART_DATAPLANE.*relayCapacity"):
        DataPlaneContext.from_env(env)


def test_the_relay_refuses_to_start_without_its_contract(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("STALWART_JOB", raising=False)
    monkeypatch.delenv("STALWART_ETCD", raising=False)
    assert relay_main([]) == 2
    assert "needs STALWART_JOB and STALWART_ETCD" in capsys.readouterr().err


def test_the_example_job_declares_its_data_plane() -> None:
    job = load_job(REPO / "examples" / "rlhf" / "grpo.yaml")
    assert [r.name for r in job.spec.roles] == ["relay", "actor", "rollout", "reward", "reference"]
    assert job.spec.data_plane == DataPlaneSettings(max_weight_staleness=1, relay_capacity=64, lease_seconds=60)
    assert all(r.restart_scope.value == "Role" for r in job.spec.roles)
    for role in job.spec.roles:  # every command the roles run exists
        script = role.command[1]
        assert role.command[:2] == ["python", "-m"] or (REPO / "examples" / "rlhf" / script).is_file(), script


def test_bad_data_plane_settings_are_named(tmp_path: Path) -> None:
    text = (REPO / "examples" / "rlhf" / "grpo.yaml").read_text()
    path = tmp_path / "job.yaml"
    path.write_text(text.replace("maxWeightStaleness: 1", "maxWeightStaleness: -1"))
    with pytest.raises(SpecError, match="spec.dataPlane.maxWeightStaleness"):
        load_job(path)
    path.write_text(text.replace("relayCapacity: 64", "relayCap: 64"))
    with pytest.raises(SpecError, match="spec.dataPlane.relayCap: unknown field"):
        load_job(path)
