"""Recorded outputs stand for a named node's machine (STALWART_PROBE_RECORDINGS): the agent's probes
judge a recorded `nvidia-smi -q` with a GPU missing, or a sysfs tree with a required NIC down, as
they would the machine; another node, and bad settings, are handled as they should be."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from support.paths import REPO

from stalwart.agents.metrics import MetricsExporter
from stalwart.agents.probe_loop import ProbeLoop
from stalwart.health.node_expectations import NodeExpectations
from stalwart.health.recorded import RECORDINGS_ENV, RecordedOutputs, recorded_outputs

DATA = REPO / "tests" / "data" / "health"
ONE_H100 = DATA / "nvidia-smi" / "h100-80gb-hbm3-driver-580.txt"  # one GPU
PORT_DOWN = DATA / "sysfs" / "ib-port-down"
KERNEL_LOG = DATA / "kernel-log" / "xid-week-old-and-fresh.log"


def at(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


def recordings(table: dict[str, dict[str, str]]) -> dict[str, str]:
    return {RECORDINGS_ENV: json.dumps(table)}


def test_a_node_gets_its_own_entry_else_the_default_else_none() -> None:
    env = recordings({"node-1": {"nvidiaSmiQ": str(ONE_H100)}, "*": {"sysfsRoot": str(PORT_DOWN)}})
    assert recorded_outputs("node-1", env) == RecordedOutputs(nvidia_smi_q=ONE_H100)
    assert recorded_outputs("node-0", env) == RecordedOutputs(sysfs_root=PORT_DOWN)
    assert recorded_outputs("node-0", recordings({"node-1": {}})) is None
    assert recorded_outputs("node-0", {}) is None


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("{not json", "node-0"),
        ('["node-0"]', "node name -> recordings"),
        ('{"node-0": {"nvidiaSmi": "/x"}}', "nvidiaSmi"),
    ],
)
def test_bad_settings_are_refused_naming_the_variable_and_the_node(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=RECORDINGS_ENV) as raised:
        recorded_outputs("node-0", {RECORDINGS_ENV: text})
    assert says in str(raised.value)


def test_the_agents_probes_find_the_recorded_gpu_missing_and_the_nic_down(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(
        RECORDINGS_ENV, json.dumps({"node-1": {"nvidiaSmiQ": str(ONE_H100), "sysfsRoot": str(PORT_DOWN)}})
    )
    expected = NodeExpectations(expected_gpus=2, required_nics=["ib0"])
    faults = ProbeLoop(MetricsExporter("job", "node-1"), expected).check_now()
    assert "gpu: 1 GPUs visible, 2 expected" in faults, faults
    assert "network: ib0 is down" in faults, faults
    # A node the recordings do not name reads its machine (no GPU reader here: not a fault).
    others = ProbeLoop(MetricsExporter("job", "node-0"), NodeExpectations(expected_gpus=2)).check_now()
    assert not any(f.startswith("gpu:") for f in others), others


def test_on_the_agents_path_a_week_old_xid_does_not_evict_and_a_fresh_one_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """The agent's probe loop, its window since the agent started, on a recorded kernel log: an Xid 79
    of 2026-11-21 and an Xid 48 of 2026-11-28 11:38 (dated as `dmesg --time-format iso` prints)."""
    monkeypatch.setenv(RECORDINGS_ENV, json.dumps({"*": {"kernelLog": str(KERNEL_LOG)}}))

    def faults(started: str) -> list[str]:
        loop = ProbeLoop(MetricsExporter("job", "node-0"), NodeExpectations(), started_at=at(started))
        return [f for f in loop.check_now() if f.startswith("gpu:")]

    since_before_both = faults("2026-11-20T00:00:00")
    assert any("Xid 79" in f for f in since_before_both) and any("Xid 48" in f for f in since_before_both)
    between = faults("2026-11-28T11:00:00")  # started after last week's Xid, before today's
    assert between and not any("Xid 79" in f for f in between) and any("Xid 48" in f for f in between), between
    assert faults("2026-11-28T11:40:00") == []  # started after both: nothing is this run's evidence
