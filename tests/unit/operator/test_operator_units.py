"""The operator's parts on their own: settings, Kubernetes events as eviction requests, the
election between replicas, and KubernetesCluster's pods and cordons against the emulated API."""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Iterator

import kubernetes
import pytest
from support.kubesim import ApiServer, job_cluster, raw

from stalwart.spec import SpecError, parse_job
from stalwart.store import Store, keys
from stalwart.store.records import JobPhase, JobState, OperatorRequest, RequestKind
from stalwart_operator import crd, names
from stalwart_operator.config import OperatorConfig
from stalwart_operator.election import OperatorLeadership
from stalwart_operator.events import (
    cordon_reason,
    machine_cordoned,
    node_not_ready,
    pod_disruption,
    request_eviction,
)


def test_config_from_the_environment() -> None:
    config = OperatorConfig.from_env(
        {"STALWART_ETCD": "etcd:2379", "STALWART_NAMESPACES": "a, b", "STALWART_RENDEZVOUS_PORT": "29501"}
    )
    assert config.etcd == "etcd:2379" and config.namespaces == ["a", "b"] and config.rendezvous_port == 29501
    assert OperatorConfig.from_env({"STALWART_ETCD": "e:1", "STALWART_ALLOWED_PATHS": "/data:/ckpt"}).allowed_paths == [
        "/data",
        "/ckpt",
    ]
    with pytest.raises(ValueError, match="STALWART_ETCD"):
        OperatorConfig.from_env({})


def test_pod_and_node_conditions_that_mean_a_lost_node() -> None:
    assert pod_disruption({"status": {"phase": "Running"}}) is None
    failed = pod_disruption(
        {
            "status": {
                "phase": "Failed",
                "containerStatuses": [
                    {"name": "agent", "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}
                ],
            }
        }
    )
    assert failed is not None and failed.cause == "pod-failed" and "OOMKilled (exit code 137)" in failed.reason
    evicted = pod_disruption({"status": {"phase": "Failed", "reason": "Evicted", "message": "low on memory"}})
    assert evicted is not None and evicted.cause == "pod-evicted" and "low on memory" in evicted.reason
    preempted = pod_disruption(
        {
            "status": {
                "phase": "Running",
                "conditions": [{"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}],
            }
        }
    )
    assert preempted is not None and preempted.cause == "pod-disrupted"
    ready = {
        "metadata": {"name": "gpu-1"},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }
    assert node_not_ready(ready) is None
    gone = node_not_ready(
        {
            "metadata": {"name": "gpu-1"},
            "status": {"conditions": [{"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown"}]},
        }
    )
    assert gone is not None and "gpu-1 is NotReady (NodeStatusUnknown)" in gone.reason


def test_one_eviction_request_per_pod_incident(store: Store) -> None:
    job_id = "units.evict"
    store.delete_prefix(keys.job_prefix(job_id))
    disruption = pod_disruption({"status": {"phase": "Failed", "reason": "Evicted"}})
    assert disruption is not None
    assert not request_eviction(store, job_id, "node-1", disruption, "uid-1")  # no job state yet: nothing to ask
    now = time.time()
    store.put(
        keys.job_state(job_id),
        JobState(
            job=job_id,
            phase=JobPhase.RUNNING,
            slots=["node-0", "node-1"],
            standbys=["node-2"],
            created_at=now,
            updated_at=now,
        ),
    )
    assert request_eviction(store, job_id, "node-1", disruption, "uid-1")
    assert not request_eviction(store, job_id, "node-1", disruption, "uid-1")  # a replayed watch event
    assert not request_eviction(store, job_id, "node-7", disruption, "uid-7")  # not (or no longer) in the job
    [request] = store.get_prefix(keys.requests_prefix(job_id), OperatorRequest)
    assert request.kind is RequestKind.EVICT and request.node == "node-1" and request.requested_by == "operator"
    assert "evicted" in request.reason
    # A machine Stalwart cordoned (another node of some job was evicted there): its standbys leave
    # the pool, its running slots are left to their own job's checks.
    machine = {
        "metadata": {
            "name": "gpu-4",
            "labels": {names.CORDON_LABEL: "true"},
            "annotations": {names.CORDON_REASON_ANNOTATION: "ml.other/node-3: MachineFault: Xid 79"},
        }
    }
    reason = cordon_reason(machine)
    assert reason == "ml.other/node-3: MachineFault: Xid 79" and cordon_reason({"metadata": {"name": "gpu-5"}}) is None
    cordoned = machine_cordoned("gpu-4", reason)
    assert not request_eviction(store, job_id, "node-0", cordoned, "uid-0", standbys_only=True)
    assert request_eviction(store, job_id, "node-2", cordoned, "uid-2", standbys_only=True)
    standby = next(r for r in store.get_prefix(keys.requests_prefix(job_id), OperatorRequest) if r.node == "node-2")
    assert "machine gpu-4 is cordoned by Stalwart (ml.other/node-3: MachineFault" in standby.reason
    store.delete_prefix(keys.job_prefix(job_id))


def test_one_operator_replica_leads(store: Store) -> None:
    name = f"units-{time.monotonic_ns()}"
    # A long lease: its keepalive thread starved for a second must not hand the lead over before
    # release() does (which revokes the lease, so the takeover waits for no expiry).
    first = OperatorLeadership(store, name, "replica-a", ttl=10)
    second = OperatorLeadership(store, name, "replica-b", ttl=2)
    never = threading.Event()
    assert first.acquire_until(never)
    assert first.holder() == "replica-a"
    stop = threading.Event()
    got: list[bool] = []
    waiter = threading.Thread(target=lambda: got.append(second.acquire_until(stop, interval=0.1)))
    waiter.start()
    time.sleep(0.5)
    assert not got  # still standing by
    first.release()  # the leader goes: the standby takes over
    waiter.join(timeout=15)
    assert got == [True] and second.holder() == "replica-b"
    second.release()
    stopped = threading.Event()
    stopped.set()
    third = OperatorLeadership(store, name, "replica-c", ttl=2)
    assert first.acquire_until(never)
    assert not third.acquire_until(stopped)  # told to stop while waiting
    first.release()


@pytest.fixture(scope="module")
def api() -> Iterator[ApiServer]:
    server = ApiServer(crd.crd()).start()
    yield server
    server.stop()


def test_kubernetes_cluster_pods_and_cordons(api: ApiServer, store: Store) -> None:
    job = parse_job(
        {
            "apiVersion": "stalwart.dev/v1alpha1",
            "kind": "TrainingJob",
            "metadata": {"name": "kc"},
            "spec": {
                "roles": [{"name": "trainer", "replicas": 2, "command": ["python", "t.py"]}],
                "cleanPodPolicy": "None",
            },
        }
    )
    job_id = names.job_id("default", "kc")
    store.delete_prefix(keys.job_prefix(job_id))
    client = api.client()
    core = kubernetes.client.CoreV1Api(client)
    core.create_node(
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-9"}, "spec": {}}, _preload_content=False
    )
    cluster = job_cluster(api, store, job, "uid-kc")
    cluster.start_node("node-0")
    cluster.start_node("node-0")  # idempotent
    cluster.start_node("node-5")  # not a slot: a standby, from the standby template
    infos = {n.name: n for n in cluster.list_nodes()}
    assert set(infos) == {"node-0", "node-5"} and all(n.alive for n in infos.values())
    core.patch_namespaced_pod("kc-node-0", "default", {"spec": {"nodeName": "gpu-9"}}, _preload_content=False)
    core.patch_namespaced_pod_status(
        "kc-node-0", "default", {"status": {"phase": "Running", "podIP": "10.1.2.3"}}, _preload_content=False
    )
    assert cluster.rendezvous("node-0") == ("10.1.2.3", 29500)
    assert cluster.rendezvous("node-5")[0] == "node-5.kc.default.svc"  # no IP yet: its DNS name
    # The pod watch's event (the operator's kopf handler feeds the cache): it ran on gpu-9.
    cluster.pod_event("MODIFIED", raw(core.read_namespaced_pod("kc-node-0", "default", _preload_content=False)))
    # Cordon after the pod is gone (the controller stops a node, then cordons it): the machine is known.
    cluster.stop_node("node-0")
    assert {n.name for n in cluster.list_nodes()} == {"node-5"}
    cluster.cordon("node-0", "Xid 79")
    node = raw(core.read_node("gpu-9", _preload_content=False))
    assert {"key": names.CORDON_TAINT, "value": "true", "effect": "NoSchedule"} in node["spec"]["taints"]
    assert node["metadata"]["labels"][names.CORDON_LABEL] == "true"
    assert "Xid 79" in node["metadata"]["annotations"][names.CORDON_REASON_ANNOTATION]
    cluster.uncordon("node-0")
    node = raw(core.read_node("gpu-9", _preload_content=False))
    assert not node["spec"].get("taints") and names.CORDON_LABEL not in node["metadata"].get("labels", {})
    # A finished job keeps its pods when cleanPodPolicy is None.
    now = time.time()
    store.put(
        keys.job_state(job_id),
        JobState(job=job_id, phase=JobPhase.SUCCEEDED, slots=["node-5"], created_at=now, updated_at=now),
    )
    cluster.stop_node("node-5")
    assert {n.name for n in cluster.list_nodes()} == {"node-5"}
    core.delete_namespaced_pod("kc-node-5", "default", _preload_content=False)
    store.delete_prefix(keys.job_prefix(job_id))
    assert json.loads(json.dumps(cluster.pod_manifest("node-1")))["metadata"]["labels"][names.ROLE_LABEL] == "trainer"
    cluster.close()


def test_the_job_token_lives_in_etcd_and_in_a_secret_the_operator_never_reads(api: ApiServer, store: Store) -> None:
    from stalwart.store.credentials import job_token
    from stalwart_operator.runtime import Runtime

    body = {
        "apiVersion": "stalwart.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": "tok", "namespace": "default", "uid": "uid-tok"},
        "spec": {"roles": [{"name": "trainer", "command": ["python", "t.py"]}]},
    }
    job_id = names.job_id("default", "tok")
    store.delete_prefix(keys.job_prefix(job_id))
    client = api.client()
    core = kubernetes.client.CoreV1Api(client)
    rt = Runtime(OperatorConfig(etcd=store.endpoint, job_dir="/workspace"), store, client)
    job = rt.parse(body)

    def secret_token() -> str:
        secret = raw(core.read_namespaced_secret("tok-stalwart-token", "default", _preload_content=False))
        return base64.b64decode(secret["data"]["token"]).decode()

    rt.ensure_token(job, "default", "uid-tok")
    token = job_token(store, job_id)
    assert token and len(token) >= 40 and secret_token() == token
    rt.ensure_token(job, "default", "uid-tok")  # a resumed operator: the same token, not a new one
    assert job_token(store, job_id) == token == secret_token()
    core.patch_namespaced_secret(  # a Secret left by an earlier job of the same name
        "tok-stalwart-token", "default", {"data": {"token": base64.b64encode(b"stale").decode()}}
    )
    rt.ensure_token(job, "default", "uid-tok")
    assert secret_token() == token
    rt.cleanup(job, "tok", "default", "uid-tok")
    assert job_token(store, job_id) is None
    with pytest.raises(kubernetes.client.exceptions.ApiException):
        core.read_namespaced_secret("tok-stalwart-token", "default")
    # The custom resource's paths are confined to the image's job folder (and the allowed ones).
    escaping = {**body, "spec": {"roles": [{"name": "t", "command": ["x"], "workingDir": "../../etc"}]}}
    with pytest.raises(SpecError, match=r"spec.roles\[0\].workingDir: '../../etc' resolves to '/etc'"):
        rt.parse(escaping)
    allowed = Runtime(OperatorConfig(etcd=store.endpoint, allowed_paths=["/etc"]), store, client)
    assert allowed.parse(escaping).spec.roles[0].working_dir == "../../etc"
    rt.close()


RLHF_ROLES = [
    {
        "name": "actor",
        "replicas": 1,
        "image": "registry.example.com/actor:1",
        "resources": {"gpus": 1, "memory": "32Gi"},
        "command": ["python", "actor.py"],
        "restartScope": "Role",
        "standbys": 1,
        "template": {"spec": {"containers": [{"name": "agent", "env": [{"name": "WHO", "value": "actor"}]}]}},
    },
    {
        "name": "rollout",
        "replicas": 2,
        "image": "registry.example.com/rollout:1",
        "resources": {"cpu": "6"},
        "command": ["python", "rollout.py"],
        "restartScope": "Role",
        "standbys": 1,
        "template": {"spec": {"containers": [{"name": "agent", "env": [{"name": "WHO", "value": "rollout"}]}]}},
    },
    # The largest role: before standbys had roles, every standby was made from its template.
    {"name": "reward", "replicas": 3, "command": ["python", "reward.py"], "restartScope": "Role", "standbys": 0},
]


def test_standby_pods_are_made_from_their_own_roles_template(api: ApiServer, store: Store) -> None:
    """Each standby's pod is its role's (image, resources, template), whether the controller names the
    role (StartNode) or the pod is made again from the controller's state; the Kueue group counts
    every role's standbys."""
    from stalwart.controller.core.ranks import role_states

    job = parse_job(
        {
            "apiVersion": "stalwart.dev/v1alpha1",
            "kind": "TrainingJob",
            "metadata": {"name": "rl"},
            "spec": {"roles": RLHF_ROLES, "scheduling": {"queue": "team-a"}},
        }
    )
    job_id = names.job_id("default", "rl")
    store.delete_prefix(keys.job_prefix(job_id))
    cluster = job_cluster(api, store, job, "uid-rl")

    def made(node: str, role: str | None = None) -> tuple[str, str, str | None, dict[str, str], str]:
        pod = cluster.pod_manifest(node, role)
        [container] = pod["spec"]["containers"]
        env = {e["name"]: e.get("value") for e in container["env"]}
        return (
            pod["metadata"]["labels"][names.ROLE_LABEL],
            container["image"],
            env.get("WHO"),
            container["resources"],
            pod["metadata"]["annotations"][names.KUEUE_GROUP_COUNT_ANNOTATION],
        )

    actor = ("actor", "registry.example.com/actor:1", "actor", {"limits": {"nvidia.com/gpu": "1", "memory": "32Gi"}})
    rollout = ("rollout", "registry.example.com/rollout:1", "rollout", {"requests": {"cpu": "6"}})
    # Before the controller wrote its state: the first nodes are the slots in spec order.
    assert made("node-1")[:3] == rollout[:3] and made("node-0")[:3] == actor[:3]
    # The controller names the role of the node it starts (its slot's, or the pool it waits in).
    assert made("node-6", "actor")[:3] == actor[:3] and made("node-7", "rollout")[:3] == rollout[:3]
    assert made("node-7", "rollout")[4] == str(6 + 2)  # 6 slots, an actor and a rollout standby
    now = time.time()
    state = JobState(
        job=job_id,
        phase=JobPhase.RUNNING,
        slots=[f"node-{i}" for i in range(6)],
        roles=role_states(job.spec),
        standbys=["node-6", "node-7"],
        standby_roles={"node-6": "actor", "node-7": "rollout"},
        created_at=now,
        updated_at=now,
    )
    store.put(keys.job_state(job_id), state)
    try:
        # Made again from the state (no role named): each standby from its own pool's role.
        for node, want in (("node-6", actor), ("node-7", rollout)):
            role, image, who, resources, _ = made(node)
            assert (role, image, who) == want[:3]
            assert all(resources.get(k, {}).items() >= v.items() for k, v in want[3].items()), resources
        assert made("node-5")[0] == "reward" and made("node-5")[2] is None
        # A rollout standby that took a rollout slot keeps its role.
        state.slots[2], state.standbys = "node-7", ["node-6"]
        state.standby_roles = {"node-6": "actor"}
        store.put(keys.job_state(job_id), state)
        assert made("node-7")[:3] == rollout[:3]
    finally:
        store.delete_prefix(keys.job_prefix(job_id))
