"""KubernetesCluster's word on capacity, against the emulated API server: a pod the scheduler could
not place (Pending, PodScheduled False, reason Unschedulable) is a node no machine can take, and the
cluster then says no machine is free, which lets a role with minReplicas shrink (core/elastic.py);
once the pod is placed, the cluster knows no limit again."""

from __future__ import annotations

from collections.abc import Iterator

import kubernetes
import pytest
from support.kubesim import ApiServer, job_cluster, raw

from stalwart.spec import parse_job
from stalwart.store import Store, keys
from stalwart_operator import crd, names

UNSCHEDULABLE = {
    "type": "PodScheduled",
    "status": "False",
    "reason": "Unschedulable",
    "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
}


@pytest.fixture(scope="module")
def api() -> Iterator[ApiServer]:
    server = ApiServer(crd.crd()).start()
    yield server
    server.stop()


def test_an_unschedulable_pod_means_no_machine_is_free(api: ApiServer, store: Store) -> None:
    job = parse_job(
        {
            "apiVersion": "stalwart.dev/v1alpha1",
            "kind": "TrainingJob",
            "metadata": {"name": "el"},
            "spec": {"roles": [{"name": "trainer", "replicas": 3, "minReplicas": 2, "command": ["python", "t.py"]}]},
        }
    )
    job_id = names.job_id("default", "el")
    store.delete_prefix(keys.job_prefix(job_id))
    core = kubernetes.client.CoreV1Api(api.client())
    cluster = job_cluster(api, store, job, "uid-el")
    try:
        for node in ("node-0", "node-2", "node-3"):
            cluster.start_node(node)
        assert cluster.free_machines() is None  # Pending, not yet judged by the scheduler
        pending = raw(
            core.patch_namespaced_pod_status(
                names.pod_name("el", "node-3"),
                "default",
                {"status": {"phase": "Pending", "conditions": [UNSCHEDULABLE]}},
                _preload_content=False,
            )
        )
        cluster.pod_event("MODIFIED", pending)
        nodes = {n.name: n for n in cluster.list_nodes()}
        assert nodes["node-3"].unschedulable and nodes["node-3"].alive  # a Pending pod still holds its slot
        assert not nodes["node-0"].unschedulable
        assert cluster.free_machines() == 0
        placed = raw(
            core.patch_namespaced_pod_status(
                names.pod_name("el", "node-3"),
                "default",
                {"status": {"phase": "Running", "conditions": [{"type": "PodScheduled", "status": "True"}]}},
                _preload_content=False,
            )
        )
        cluster.pod_event("MODIFIED", placed)
        assert not any(n.unschedulable for n in cluster.list_nodes())
        assert cluster.free_machines() is None
    finally:
        for node in ("node-0", "node-2", "node-3"):
            cluster.stop_node(node)
        cluster.close()
        store.delete_prefix(keys.job_prefix(job_id))
