"""The spec's node expectations reach the probes, and a node that misses one is refused at pre-flight:
one GPU missing in a recorded `nvidia-smi -q`, a required NIC down in a recorded sysfs tree."""

from __future__ import annotations

from support.paths import REPO

from stalwart.agents.metrics import MetricsExporter
from stalwart.agents.probe_loop import ProbeLoop, machine_fault_lines
from stalwart.controller.core.work import check_procs
from stalwart.health.collective_records import RankReport
from stalwart.health.distributed_check import CheckRequest, NodeCheckReport, judge_shares, node_ranks
from stalwart.health.gpu_nvml import NvmlUnavailable
from stalwart.health.gpu_probe import GpuProbe
from stalwart.health.network import evaluate_network, read_net_sysfs
from stalwart.health.node_expectations import NodeExpectations, node_expectations
from stalwart.health.nvidia_smi import parse_nvidia_smi_q
from stalwart.spec import TrainingJobSpec

DATA = REPO / "tests" / "data" / "health"


def spec(*roles: dict[str, object]) -> TrainingJobSpec:
    return TrainingJobSpec.model_validate({"roles": [{"command": ["python", "train.py"], **r} for r in roles]})


def passing_share(request: CheckRequest, node: str, **extra: object) -> NodeCheckReport:
    ranks = [
        RankReport(
            rank=r,
            node=request.nodes.index(node),
            local_rank=r % request.procs_per_node,
            phase="done",
            progress=8,
            finished=True,
            compute_digest="same",
        )
        for r in node_ranks(request, node)
    ]
    return NodeCheckReport(request_id=request.id, node=node, ranks=ranks, **extra)  # type: ignore[arg-type]


def request(nodes: list[str], procs: int) -> CheckRequest:
    return CheckRequest(
        id="chk-1", nodes=nodes, procs_per_node=procs, timeout=60, collective_timeout=10, requested_at=0
    )


def test_the_spec_fields_in_camel_case_become_the_nodes_expectations() -> None:
    job = spec(
        {
            "name": "trainer",
            "processesPerNode": 8,
            "health": {
                "expectedGpus": 8,
                "requiredNics": ["ib0", "eth0"],
                "watchedDisks": ["/", "/ckpt"],
                "writablePaths": ["/ckpt"],
                "kernelLogWindowMinutes": 30,
                "minBusBandwidthGbps": 100,
            },
        }
    )
    assert node_expectations(job) == NodeExpectations(
        expected_gpus=8,
        required_nics=["ib0", "eth0"],
        watched_disks=["/", "/ckpt"],
        writable_paths=["/ckpt"],
        kernel_log_window_minutes=30,
        min_bus_bandwidth_gbps=100.0,
    )
    assert node_expectations(spec({"name": "trainer"})) == NodeExpectations()  # defaults: nothing demanded


def test_a_node_that_may_serve_any_role_is_held_to_what_every_role_demands() -> None:
    job = spec(
        {"name": "trainer", "health": {"expectedGpus": 8, "requiredNics": ["ib0", "eth0"], "minBusBandwidthGbps": 100}},
        {"name": "reward", "health": {"expectedGpus": 4, "requiredNics": ["eth0"], "minBusBandwidthGbps": 40}},
    )
    expected = node_expectations(job)
    assert expected.expected_gpus == 4 and expected.required_nics == ["eth0"]
    assert expected.min_bus_bandwidth_gbps == 40.0 and expected.watched_disks == ["/"]


def test_a_node_with_four_workers_has_all_four_checked() -> None:
    job = spec({"name": "trainer", "replicas": 2, "processesPerNode": 4})
    assert check_procs(job) == 4
    req = request(["node-0", "node-1"], check_procs(job))
    assert node_ranks(req, "node-0") == [0, 1, 2, 3] and node_ranks(req, "node-1") == [4, 5, 6, 7]
    report, notes = judge_shares(req, {n: passing_share(req, n) for n in req.nodes})
    assert report.passed and notes == {}
    assert [v.ranks for v in report.nodes] == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_a_node_whose_recorded_nvidia_smi_shows_a_gpu_missing_is_refused() -> None:
    recorded = (DATA / "nvidia-smi" / "a100-sxm4-40gb-two-of-eight.txt").read_text()  # two GPU sections
    assert len(parse_nvidia_smi_q(recorded).gpus) == 2
    expected = node_expectations(spec({"name": "trainer", "processesPerNode": 3, "health": {"expectedGpus": 3}}))
    probe = GpuProbe(
        expected_count=expected.expected_gpus,
        kernel_log_reader=lambda: [],
        nvml_reader=lambda: NvmlUnavailable(reason="NVML not readable here"),  # the nvidia-smi fallback
        nvidia_smi_reader=lambda: recorded,
    )
    faults = machine_fault_lines([probe.run()])
    assert faults == ["gpu: 2 GPUs visible, 3 expected"]
    req = request(["node-0", "node-1"], 2)
    shares = {"node-0": passing_share(req, "node-0"), "node-1": passing_share(req, "node-1", machine_faults=faults)}
    report, notes = judge_shares(req, shares)
    # Its collectives passed; the probes' word alone refuses it (checks_through_agents fails a noted node).
    assert all(v.passed for v in report.nodes)
    assert notes == {"node-1": ["machine fault: gpu: 2 GPUs visible, 3 expected"]}


def test_a_node_whose_required_nic_is_down_is_refused() -> None:
    tree = DATA / "sysfs" / "ib-port-down"  # ib0 (IPoIB of the down port) is down
    loop = ProbeLoop(
        MetricsExporter("job-a", "node-1"), NodeExpectations(required_nics=["ib0"]), interval=60, sysfs_root=str(tree)
    )
    faults = loop.check_now()  # what the agent's share of a pre-flight runs before its ranks
    assert "network: ib0 is down" in faults
    assert any(f.startswith("network: mlx4_0 port 1 is down") for f in faults)
    healthy = ProbeLoop(
        MetricsExporter("job-a", "node-0"),
        NodeExpectations(required_nics=["eth0"]),
        interval=60,
        sysfs_root=str(DATA / "sysfs" / "healthy"),
    )
    assert not any(f.startswith("network:") for f in healthy.check_now())


def test_a_required_nic_that_does_not_exist_is_named() -> None:
    result = evaluate_network(read_net_sysfs(DATA / "sysfs" / "healthy"), required_nics=["ib7", "eth0"])
    [missing] = [f for f in result.findings if f.code == "nic_missing"]
    assert missing.subject == "ib7" and missing.message == "ib7 does not exist" and missing.machine_fault


def test_an_assigned_node_is_held_to_its_own_roles_settings() -> None:
    job = spec(
        {"name": "trainer", "health": {"expectedGpus": 8, "requiredNics": ["ib0", "eth0"]}},
        {"name": "reward", "health": {"expectedGpus": 4, "requiredNics": ["eth0"]}},
    )
    assert node_expectations(job, "trainer").expected_gpus == 8
    assert node_expectations(job, "reward").required_nics == ["eth0"]
    assert node_expectations(job, "critic") == node_expectations(job)  # not a role of this job: the common ones
    loop = ProbeLoop(
        MetricsExporter("job-a", "node-1"),
        node_expectations(job),
        interval=60,
        sysfs_root=str(DATA / "sysfs" / "ib-port-down"),
    )
    assert "network: ib0 is down" not in loop.check_now()  # before its assignment: ib0 is not every role's
    loop.expect(node_expectations(job, "trainer"))
    assert "network: ib0 is down" in loop.check_now()
