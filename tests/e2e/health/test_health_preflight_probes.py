"""A node's share of a pre-flight runs its probes: a required NIC down in its (recorded) sysfs tree
refuses it, while its collectives pass. Real etcd, the agents' CheckDuty, real check ranks (gloo on
loopback), the requester's judging as on a cluster (stalwart.cluster.agent_checks)."""

from __future__ import annotations

import shutil
import threading
import uuid
from pathlib import Path

from support.paths import REPO
from support.ranks import HOST_READY_SECONDS, forked_check_rank, shared_host, torchrun_base_env

from stalwart.agents.check_duty import CheckDuty
from stalwart.agents.metrics import MetricsExporter
from stalwart.agents.probe_loop import ProbeLoop
from stalwart.cluster.agent_checks import checks_through_agents
from stalwart.health.node_expectations import NodeExpectations
from stalwart.logs import get_logger
from stalwart.store import Store, keys
from stalwart.store.records import NodeRegistration

SYSFS = REPO / "tests" / "data" / "health" / "sysfs"
TIMEOUT = 120.0  # bounds a broken run; not what a passing one takes


def warm_rank_host(tmp_path: Path) -> None:
    """The test's rank host imports torch once (minutes on a loaded machine): before the check's
    clock starts, as an agent's fork server has before any check is asked of it."""
    shared_host().start_module("this", torchrun_base_env(), tmp_path / "warm.log").wait(timeout=HOST_READY_SECONDS)


def test_a_node_whose_required_nic_is_down_is_refused_at_pre_flight(store: Store, tmp_path: Path) -> None:
    warm_rank_host(tmp_path)
    job = f"ml.preflight-{uuid.uuid4().hex[:6]}"
    log = get_logger("test", job=job)
    expected = NodeExpectations(required_nics=["ib0"])
    # node-0: the healthy tree with an ib0 that is up (eth0's files); node-1: the recorded down port.
    healthy = tmp_path / "sysfs-healthy"
    shutil.copytree(SYSFS / "healthy", healthy)
    shutil.copytree(healthy / "class" / "net" / "eth0", healthy / "class" / "net" / "ib0")
    trees = {"node-0": healthy, "node-1": SYSFS / "ib-port-down"}
    duties = []
    for node, tree in trees.items():
        store.put(
            keys.node_registration(job, node),
            NodeRegistration(node=node, job=job, host="h", agent_pid=1, registered_at=0, lease_id=0),
        )
        probes = ProbeLoop(MetricsExporter(job, node), expected, interval=60, sysfs_root=str(tree))
        duty = CheckDuty(
            store, job, node, "127.0.0.1", tmp_path / node, log, forked_check_rank, machine_check=probes.check_now
        )
        duty.watch()
        duties.append(duty)
    stop = threading.Event()

    def agents() -> None:  # the agents' loops
        while not stop.wait(0.05):
            for duty in duties:
                duty.serve()

    loop = threading.Thread(target=agents, daemon=True)
    loop.start()
    try:
        verdicts = checks_through_agents(store, job, ["node-0", "node-1"], 2, log, timeout=TIMEOUT, backend="gloo")
    finally:
        stop.set()
        loop.join(timeout=5)
    by_node = {v.node: v for v in verdicts}
    assert by_node["node-0"].passed, by_node["node-0"].reasons
    assert not by_node["node-1"].passed
    assert "machine fault: network: ib0 is down" in by_node["node-1"].reasons
    # Its collectives ran and passed: the probes alone refused it.
    assert not any("rank" in r for r in by_node["node-1"].reasons), by_node["node-1"].reasons
    assert store.get_prefix_raw(keys.checks_prefix(job)) == []
