"""The NVLink probe on recorded `nvidia-smi nvlink -s` outputs, and honest absence without a GPU."""

from __future__ import annotations

import shutil

from support.paths import REPO

from stalwart.health.nvlink import NvlinkProbe, evaluate_nvlink, parse_nvlink_status
from stalwart.health.probes import default_probes
from stalwart.health.records import ProbeStatus

NVLINK = REPO / "tests" / "data" / "health" / "nvlink"
BRIDGED = (NVLINK / "rtx-a6000-bridged-pair-and-one.txt").read_text()


def test_the_status_lines_are_parsed_per_gpu_and_link() -> None:
    gpus = parse_nvlink_status(BRIDGED)
    assert [(g.index, g.name, len(g.active)) for g in gpus] == [
        (0, "NVIDIA RTX A6000", 4),
        (1, "NVIDIA RTX A6000", 4),
        (2, "NVIDIA RTX A6000", 0),
    ]
    assert gpus[0].uuid == "GPU-5baec991-de63-c196-1766-04c38407e133" and gpus[0].links[3] == 14.062
    assert gpus[2].links == {}  # "Unable to retrieve NVLink information as all links are inActive"


def test_a_bridged_pair_is_healthy_and_the_unbridged_gpu_is_noted() -> None:
    result = evaluate_nvlink(parse_nvlink_status(BRIDGED))
    assert result.status is ProbeStatus.OK and not result.machine_fault
    assert [(f.code, f.subject) for f in result.findings] == [("nvlink_none", "gpu2")]
    assert result.readings["nvlinks_per_gpu"] == 4 and result.readings["gpu1_nvlinks_active"] == 4


def test_a_link_that_did_not_train_degrades_the_node() -> None:
    lines = BRIDGED.splitlines()
    lines[8] = "\t Link 2: <inactive>"  # GPU 1's link 2
    result = evaluate_nvlink(parse_nvlink_status("\n".join(lines)))
    assert result.status is ProbeStatus.DEGRADED and not result.machine_fault
    [down] = [f for f in result.findings if f.code == "nvlink_link_inactive"]
    assert down.subject == "gpu1" and down.message == "gpu1: 3 of 4 NVLinks active (inactive: 2)"


def test_a_link_slower_than_its_peers_degrades_the_node() -> None:
    result = evaluate_nvlink(
        parse_nvlink_status(BRIDGED.replace("\t Link 3: 14.062 GB/s\nGPU 2", "\t Link 3: 7.031 GB/s\nGPU 2"))
    )
    [slow] = [f for f in result.findings if f.code == "nvlink_link_slow"]
    assert slow.subject == "gpu1" and "7.031" in slow.message and result.status is ProbeStatus.DEGRADED


def test_pcie_cards_without_a_bridge_say_not_available() -> None:
    result = NvlinkProbe(reader=lambda: (NVLINK / "a100-pcie-no-nvlink.txt").read_text()).run()
    assert result.status is ProbeStatus.NOT_AVAILABLE and "no GPU of this node has an active NVLink" in (
        result.reason or ""
    )


def test_without_nvidia_smi_the_probe_says_not_available() -> None:
    result = NvlinkProbe().run()
    if shutil.which("nvidia-smi") is not None:  # a GPU machine: a real reading, judged
        assert result.status is not ProbeStatus.FAILED or result.machine_fault is False
        return
    assert result.status is ProbeStatus.NOT_AVAILABLE and result.reason == "nvidia-smi is not installed"
    assert NvlinkProbe(
        reader=lambda: "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
    ).run().reason == (
        "nvidia-smi nvlink -s: NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
    )


def test_the_agents_probe_set_includes_it() -> None:
    assert [p.name for p in default_probes()] == ["gpu", "nvlink", "host", "network"]
