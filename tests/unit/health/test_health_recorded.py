"""Recorded outputs stand for a named node's machine (STALWART_PROBE_RECORDINGS): the agent's probes
judge a recorded `nvidia-smi -q` with a GPU missing, or a sysfs tree with a required NIC down, as
they would the machine; another node, and bad settings, are handled as they should be."""

from __future__ import annotations

import json

import pytest
from support.paths import REPO

from stalwart.agents.metrics import MetricsExporter
from stalwart.agents.probe_loop import ProbeLoop
from stalwart.health.node_expectations import NodeExpectations
from stalwart.health.recorded import RECORDINGS_ENV, RecordedOutputs, recorded_outputs

DATA = REPO / "tests" / "data" / "health"
ONE_H100 = DATA / "nvidia-smi" / "h100-80gb-hbm3-driver-580.txt"  # one GPU
PORT_DOWN = DATA / "sysfs" / "ib-port-down"


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
