"""The operator end to end: a real `python -m stalwart_operator` (kopf, the official client)
against kmock's Kubernetes API emulation over HTTP, a real etcd, and a small kubelet that runs each
pod's node agent as a real local process. Failures are injected the way Kubernetes shows them: a
pod marked Failed, a Node marked NotReady.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import kubernetes
import pytest
from support.chart import render as render_chart
from support.kubesim import ApiServer, Kubelet, raw
from support.paths import REPO

from stalwart.net import free_port
from stalwart.processes import spawn, stop_process
from stalwart.store import Store, keys
from stalwart.store.credentials import DIAGNOSIS_TOKEN_ENV, new_token
from stalwart.store.etcd_server import EtcdServer
from stalwart.store.records import (
    Assignment,
    CheckpointEntry,
    CheckpointRequest,
    Heartbeat,
    Incident,
    JobPhase,
    JobState,
    OperatorRequest,
    RequestKind,
    ServiceEndpoint,
)
from stalwart_operator import crd, names
from stalwart_operator.kube import USER_AGENT

DATA = REPO / "tests" / "data" / "operator"
NS = "default"
WAIT = 180.0  # bound of every wait; a healthy run needs a few seconds, a starved machine minutes
# Leases are generous: on a loaded test machine a 2 s lease lapses now and then, and the failures
# this module injects are reported through Kubernetes (pod Failed, Node NotReady), not lease expiry.


class World:
    def __init__(
        self,
        api: ApiServer,
        kubelet: Kubelet,
        store: Store,
        operator: subprocess.Popen[bytes],
        log: Path,
        env: dict[str, str],
    ) -> None:
        self.env = env
        self.api = api
        self.kubelet = kubelet
        self.store = store
        self.operator = operator
        self.log = log
        client = api.client()
        self.diagnosis: subprocess.Popen[bytes] | None = None
        self.tmp = log.parent
        self.core = kubernetes.client.CoreV1Api(client)
        self.custom = kubernetes.client.CustomObjectsApi(client)

    # -- reading ---------------------------------------------------------------------------------
    def job(self, name: str) -> dict[str, Any] | None:
        try:
            return raw(
                self.custom.get_namespaced_custom_object(
                    names.GROUP, names.VERSION, NS, names.PLURAL, name, _preload_content=False
                )
            )
        except kubernetes.client.exceptions.ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def status(self, name: str) -> dict[str, Any]:
        return (self.job(name) or {}).get("status") or {}

    def pods(self, job: str) -> dict[str, dict[str, Any]]:
        """The job's pods by Stalwart node name."""
        items = raw(self.core.list_namespaced_pod(NS, _preload_content=False))["items"]
        return {
            p["metadata"]["labels"][names.NODE_LABEL]: p
            for p in items
            if p["metadata"].get("labels", {}).get(names.JOB_LABEL) == job
        }

    def state(self, job: str) -> JobState | None:
        return self.store.get(keys.job_state(names.job_id(NS, job)), JobState)

    def wait(self, what: str, predicate: Callable[[], Any], timeout: float = WAIT) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.operator.poll() is None, f"the operator exited:\n{self.tail()}"
            value = predicate()
            if value:
                return value
            time.sleep(0.2)
        raise AssertionError(
            f"timed out waiting for {what}\n--- operator log ---\n{self.tail()}\n"
            f"--- kubelet errors ---\n{self.kubelet.errors[-5:]}"
        )

    def events(self, job: str) -> list[dict[str, Any]]:
        """The Events about a TrainingJob, oldest first (what `kubectl describe tj` lists)."""
        items = raw(self.core.list_namespaced_event(NS, _preload_content=False))["items"]
        about = [e for e in items if e["involvedObject"]["kind"] == names.KIND and e["involvedObject"]["name"] == job]
        return sorted(about, key=lambda e: (e.get("firstTimestamp") or "", e["metadata"]["name"]))

    def describe_events(self, job: str) -> str:
        """The Events section of `kubectl describe tj JOB`."""
        lines = [f"{'Type':<8} {'Reason':<16} {'From':<18} Message", f"{'----':<8} {'------':<16} {'----':<18} -------"]
        for e in self.events(job):
            lines.append(f"{e['type']:<8} {e['reason']:<16} {e['source']['component']:<18} {e['message']}")
        return "\n".join(lines)

    def cli(self, *args: str, plugin: bool = False) -> subprocess.CompletedProcess[str]:
        """The CLI as an on-call engineer runs it: a kubeconfig, no etcd."""
        env = {k: v for k, v in self.env.items() if k != "STALWART_ETCD"}
        env["STALWART_CONFIG"] = str(self.tmp / "no-such-config.yaml")
        command = (
            [str(Path(sys.executable).with_name("kubectl-stalwart"))]
            if plugin
            else [sys.executable, "-m", "stalwart.cli.main"]
        )
        return subprocess.run([*command, *args], env=env, capture_output=True, text=True, timeout=WAIT + 60)

    def pod_lists(self) -> int:
        """LISTs of pods the operator's own client made (its pod caches' and cleanups'; not kopf's)."""
        assert self.api.emulator is not None
        return sum(
            1
            for agent, group, plural, verb in list(self.api.emulator.calls)
            if agent.startswith(USER_AGENT) and (group, plural, verb) == ("", "pods", "list")
        )

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    # -- acting ----------------------------------------------------------------------------------
    def submit(self, name: str, replicas: int = 2, standbys: int = 1, **spec: Any) -> dict[str, Any]:
        body = {
            "apiVersion": f"{names.GROUP}/{names.VERSION}",
            "kind": names.KIND,
            "metadata": {"name": name, "namespace": NS},
            "spec": {
                "roles": [
                    {
                        "name": "trainer",
                        "replicas": replicas,
                        "processesPerNode": 1,
                        "command": ["python", "worker.py", *spec.pop("args", [])],
                        **({"template": spec.pop("template")} if "template" in spec else {}),
                    }
                ],
                "faultTolerance": {
                    "heartbeatIntervalSeconds": 0.5,
                    "leaseTtlSeconds": 6,
                    "stopGraceSeconds": 1,
                    "preflight": False,
                    "firstStepTimeoutSeconds": 120,
                    # The test worker imports no torch; a warm pool would import it on every node.
                    "warmWorkers": False,
                },
                "standbys": {"count": standbys, "minimum": 0},
                **spec,
            },
        }
        return raw(
            self.custom.create_namespaced_custom_object(
                names.GROUP, names.VERSION, NS, names.PLURAL, body, _preload_content=False
            )
        )

    def delete(self, name: str) -> None:
        try:
            self.custom.delete_namespaced_custom_object(
                names.GROUP, names.VERSION, NS, names.PLURAL, name, _preload_content=False
            )
        except kubernetes.client.exceptions.ApiException as exc:
            if exc.status != 404:
                raise

    @contextmanager
    def training(self, name: str, **spec: Any) -> Iterator[None]:
        """A job for a test (or the one an earlier test left), deleted after it, so the next test
        has the machine to itself."""
        if self.job(name) is None:
            self.submit(name, **spec)
        try:
            yield
        finally:
            self.delete(name)
            self.wait(
                f"{name} deleted",
                lambda: self.job(name) is None and not self.pods(name),
            )

    def running(self, name: str, standby: bool = True, timeout: float = WAIT) -> dict[str, Any]:
        """Wait until the job runs with every slot stepping (and its standby registered), and its
        status mirrors that: ETTR has a window to be measured over only once the first step is past
        (the status leaves it out until then), so it is part of the state waited for."""

        def ready() -> dict[str, Any] | None:
            status = self.status(name)
            slots = sum(c["slots"] for c in status.get("roles") or [])
            if (
                status.get("phase") == "Running"
                and (status.get("currentStep") or 0) > 0
                and status.get("ettr") is not None
                and slots
                and status.get("nodesReady") == f"{slots}/{slots}"
                and not status.get("unhealthyNodes")
                and (not standby or all((r.get("standbys") or {}).get("ready", 0) >= 1 for r in status["roles"]))
            ):
                return status
            return None

        return self.wait(f"{name} running", ready, timeout)  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def world(etcd: EtcdServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("operator")
    api = ApiServer(crd.crd()).start()
    kubelet: Kubelet | None = None
    operator: subprocess.Popen[bytes] | None = None
    store = Store(etcd.endpoint)
    diagnosis_port = free_port()
    diagnosis: subprocess.Popen[bytes] | None = None
    try:
        # The diagnosis service, as the chart deploys it, with its token (the chart's Secret); the
        # operator publishes its URL and its hosted controllers send the token.
        diagnosis_token = new_token()
        with open(tmp / "diagnosis.log", "ab") as out:
            diagnosis = spawn(
                [sys.executable, "-m", "stalwart.diagnosis.service", "--port", str(diagnosis_port)],
                env={**os.environ, DIAGNOSIS_TOKEN_ENV: diagnosis_token},
                stdout=out,
            )
        kubelet = Kubelet(api, [f"gpu-{i}" for i in range(8)], tmp / "pods").start()
        env = {
            **os.environ,
            "KUBECONFIG": str(api.kubeconfig(tmp / "kubeconfig")),
            "STALWART_ETCD": etcd.endpoint,
            "STALWART_OPERATOR_NAME": f"op-{uuid.uuid4().hex[:8]}",
            "STALWART_IDENTITY": "operator-0",
            "STALWART_JOB_DIR": str(DATA),
            "STALWART_POD_WORKDIR": str(tmp / "agents"),
            "STALWART_RENDEZVOUS_PORT": "0",
            "STALWART_AGENT_METRICS_PORT": "0",
            "STALWART_AGENT_METRICS_HOST": "127.0.0.1",
            "STALWART_STATUS_INTERVAL_SECONDS": "0.5",
            # Only the watch's re-lists LIST pods again here (the module's LIST counts are exact).
            "STALWART_POD_RESYNC_SECONDS": "3600",
            "STALWART_PROBE_PORT": str(free_port()),
            "STALWART_PROBE_HOST": "127.0.0.1",
            "STALWART_JOB_METRICS_PORT": str(free_port()),
            "STALWART_JOB_METRICS_HOST": "127.0.0.1",
            "STALWART_ELECTION_TTL_SECONDS": "10",  # a starved operator (load 40 on 2 cores) keeps leading
            "STALWART_DIAGNOSIS_URL": f"http://127.0.0.1:{diagnosis_port}",
            DIAGNOSIS_TOKEN_ENV: diagnosis_token,
        }
        log = tmp / "operator.log"
        with open(log, "ab") as out:
            operator = spawn([sys.executable, "-m", "stalwart_operator"], env=env, stdout=out)
        world = World(api, kubelet, store, operator, log, env)
        world.diagnosis = diagnosis
        world.tmp = tmp
        # A job MultiKueue manages: this operator must leave it alone (checked near the end).
        world.submit("foreign", managedBy="kueue.x-k8s.io/multikueue")
        yield world
    finally:
        if operator is not None:
            stop_process(operator, grace=20.0)
        if diagnosis is not None and diagnosis.poll() is None:
            stop_process(diagnosis, grace=10.0)
        if kubelet is not None:
            kubelet.stop()
        store.close()
        api.stop()


TEMPLATE = {
    "metadata": {"labels": {"team": "llm"}, "annotations": {"example.com/owner": "tests"}},
    "spec": {
        "volumes": [{"name": "scratch", "emptyDir": {}}],
        "containers": [
            {
                "name": "agent",
                "env": [
                    {
                        "name": "AWS_ACCESS_KEY_ID",
                        "valueFrom": {"secretKeyRef": {"name": "s3", "key": "access-key-id"}},
                    },
                    {"name": "NCCL_DEBUG", "value": "WARN"},
                ],
                "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
                "securityContext": {"capabilities": {"add": ["SYS_PTRACE"]}},
            }
        ],
    },
}


def test_a_job_gets_its_service_pods_and_status(world: World) -> None:
    """(The job stays for the next test, which fails one of its pods.) Its role's template takes
    S3 credentials from a Secret: the agent (and so its workers) runs with the Secret's value."""
    world.core.create_namespaced_secret(
        NS,
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s3"}, "stringData": {"access-key-id": "AKIATEST"}},
        _preload_content=False,
    )
    world.submit("alpha", template=TEMPLATE)
    pods = world.wait("3 pods", lambda: len(p := world.pods("alpha")) == 3 and p)
    status = world.running("alpha")
    # The headless Service gives the pods DNS names under the job's name.
    service = raw(world.core.read_namespaced_service(names.service_name("alpha"), NS, _preload_content=False))
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is True
    assert service["spec"]["selector"][names.JOB_LABEL] == "alpha"
    job = world.job("alpha")
    assert job is not None and names.FINALIZER in job["metadata"]["finalizers"]
    for node, pod in pods.items():
        assert pod["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]
        assert pod["spec"]["hostname"] == node and pod["spec"]["subdomain"] == "alpha"
        container = pod["spec"]["containers"][0]
        assert container["command"][-1] == "agent"
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["STALWART_JOB"] == "default.alpha" and env["STALWART_NODE"] == node
        assert pod["metadata"]["labels"]["team"] == "llm" and pod["spec"]["volumes"][-1]["name"] == "scratch"
        assert container["securityContext"]["capabilities"]["add"] == ["SYS_PTRACE"]
        agent_env = world.kubelet.environment(pod["metadata"]["name"])
        assert agent_env["AWS_ACCESS_KEY_ID"] == "AKIATEST" and agent_env["NCCL_DEBUG"] == "WARN"
    # Status: phase, conditions, nodes in rank order, the standby, restarts split by cause.
    assert status["jobId"] == "default.alpha"
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["Created"]["status"] == "True" and conditions["Running"]["status"] == "True"
    assert "Failed" not in conditions and "Succeeded" not in conditions
    # Nodes counted per role and state; only unhealthy ones would be listed (none here).
    assert status["nodesReady"] == "2/2" and status["unhealthyNodes"] == []
    [trainer] = status["roles"]
    assert {k: trainer[k] for k in ("role", "slots", "running", "starting", "lost", "finished")} == {
        "role": "trainer",
        "slots": 2,
        "running": 2,
        "starting": 0,
        "lost": 0,
        "finished": 0,
    }
    assert trainer["standbys"]["ready"] == 1 and trainer["generation"] >= 1 and status["rolesReady"] == "trainer 2/2"
    assert status["standbyCounts"]["ready"] == 1
    assert {c.get("observedGeneration") for c in status["conditions"]} == {job["metadata"]["generation"]}, status
    # Restarts, split by cause (a loaded test machine may lose a lease: infrastructure, never counted).
    assert status["restarts"]["counted"] == 0
    assert status["restarts"]["total"] == status["restarts"]["infrastructure"]
    assert len(status["standbys"]) == 1 and status["ettr"] is not None
    # The pods carry the controller's view: rank labels, standby label.
    state = world.state("alpha")
    assert state is not None
    labels = world.wait(
        "rank labels",
        lambda: (
            all(names.NODE_RANK_LABEL in world.pods("alpha")[n]["metadata"]["labels"] for n in state.slots)
            and world.pods("alpha")
        ),
    )
    assert [labels[n]["metadata"]["labels"][names.NODE_RANK_LABEL] for n in state.slots] == ["0", "1"]
    assert labels[state.standbys[0]]["metadata"]["labels"][names.STANDBY_LABEL] == "true"
    # The controller's node list and the status read the job's pods from the operator's pod cache:
    # one LIST when the job started, none per tick or status refresh (0.5 s here) since. A 410 Gone
    # on kopf's pod watch makes kopf re-list, and the cache LISTs once more after it.
    assert world.pod_lists() == 1, world.pod_lists()
    world.api.break_watches("pods")
    world.wait("the pod cache's LIST after the watch's 410", lambda: world.pod_lists() == 2)
    world.running("alpha")


def _hot_swap(world: World, name: str, fail: Callable[[str, dict[str, Any]], None], cause: str) -> None:
    """Fail the node at rank 1 with `fail(node, pod)`; its standby must take rank 1 over."""
    before = world.running(name)
    state = world.state(name)
    assert state is not None
    victim, standby = state.slots[1], state.standbys[0]
    lists = world.pod_lists()
    pods = world.pods(name)
    victim_pod = pods[victim]
    machine = victim_pod["spec"]["nodeName"]
    # The scheduler spread the job's pods: a machine failure takes only the victim with it.
    assert [p["spec"]["nodeName"] for p in pods.values()].count(machine) == 1
    fail(victim, victim_pod)
    job_id = names.job_id(NS, name)
    # The operator turned the Kubernetes event into one eviction request for the controller.
    requests = world.wait(
        "an eviction request",
        lambda: [
            r
            for r in world.store.get_prefix(keys.requests_prefix(job_id), OperatorRequest)
            if r.node == victim and r.requested_by == "operator"
        ],
    )
    assert requests[0].kind is RequestKind.EVICT and cause in requests[0].id
    # The standby holds the failed node's slot, so its ranks, in a new generation.
    after = world.wait(
        "the standby in rank 1",
        lambda: (
            (s := world.state(name))
            and s.phase is JobPhase.RUNNING
            and s.generation > state.generation
            and s.slots[1] == standby
            and s
        ),
    )
    assignment = world.store.get(keys.generation(job_id, after.generation), Assignment)
    assert assignment is not None
    swapped = assignment.for_node(standby)
    assert swapped is not None and (
        swapped.node_rank,
        swapped.first_rank,
        swapped.role,
    ) == (1, 1, "trainer")
    assert assignment.for_node(state.slots[0]).node_rank == 0  # type: ignore[union-attr]
    assert victim in after.evicted
    # Kubernetes shows it too: the failed pod is gone, the standby pod is labelled rank 1, the
    # status lists it at rank 1, the machine is cordoned, and a new standby is on its way.
    status = world.wait(
        "status after the swap",
        lambda: (
            (s := world.status(name)).get("phase") == "Running"
            and s.get("nodesReady") == "2/2"
            and victim in s.get("evicted", [])
            and (s.get("restarts") or {}).get("infrastructure", 0) >= 1
            and s
        ),
    )
    assert status["lastIncident"]["node"] == victim and status["evictedCount"] >= 1
    assert status["lastIncident"]["runbook"]
    assert status["restarts"]["counted"] == before["restarts"]["counted"]  # infrastructure: not counted
    world.wait("the failed pod deleted", lambda: victim not in world.pods(name))
    world.wait(
        "rank label on the standby",
        lambda: world.pods(name)[standby]["metadata"]["labels"].get(names.NODE_RANK_LABEL) == "1",
    )
    node = world.wait(
        "the machine cordoned",
        lambda: (
            (n := raw(world.core.read_node(machine, _preload_content=False)))
            and any(t["key"] == names.CORDON_TAINT for t in n["spec"].get("taints") or [])
            and n
        ),
    )
    assert node["metadata"]["labels"][names.CORDON_LABEL] == "true"
    new_standby = world.wait(
        "a new standby",
        lambda: (s := world.state(name)) and s.standbys and s.standbys[0] not in (standby, victim) and s.standbys[0],
    )
    pod = world.wait(
        "the new standby's pod scheduled",
        lambda: (p := world.pods(name).get(new_standby)) and p["spec"].get("nodeName") and p,
    )
    assert pod["spec"]["nodeName"] != machine  # the scheduler keeps off the cordoned machine
    # The controller saw the pod fail and go, and its replacement come, from the watch: no LIST.
    assert world.pod_lists() == lists


def test_a_failed_pod_is_replaced_by_the_standby_with_its_ranks(world: World) -> None:
    def fail(node: str, pod: dict[str, Any]) -> None:
        # What the kubelet reports when the container dies; our kubelet also kills the agent.
        world.core.patch_namespaced_pod_status(
            pod["metadata"]["name"],
            NS,
            {"status": {"phase": "Failed", "reason": "Error", "message": "machine fault injected by the test"}},
            _preload_content=False,
        )

    with world.training("alpha"):
        _hot_swap(world, "alpha", fail, "pod-failed")
        # The incident history, as `kubectl describe tj alpha` lists it: the incident (its class,
        # the action, the runbook), the eviction, the hot-swap, the recovery and the phase changes.
        incident = world.status("alpha")["lastIncident"]
        state = world.state("alpha")
        assert state is not None
        victim = incident["node"]

        def history() -> str | None:
            reasons = [e["reason"] for e in world.events("alpha")]
            # (Phase changes are sampled at each status tick: a restart shorter than a tick shows
            # as its incident and recovery only, so "Restarting" is not required here.)
            wanted = (incident["class"], "NodeEvicted", "HotSwap", "Recovered", "Running")
            # The listing is read after the events that satisfied the wait: events only accumulate,
            # so it holds them all (read before, it could miss one that came in between).
            return world.describe_events("alpha") if all(r in reasons for r in wanted) else None

        listing = world.wait("the incident history in the Events", history)
        print(listing)
        assert f"{incident['id']}: {incident['class']} on {victim}" in listing
        assert f"runbook: stalwart runbook show {incident['runbook']}" in listing
        assert f"{victim} evicted for {incident['class']}" in listing
        assert f"takes {victim}'s slot and ranks" in listing and "training resumed" in listing
        events = world.events("alpha")
        assert all(e["involvedObject"]["uid"] == world.job("alpha")["metadata"]["uid"] for e in events)  # type: ignore[index]
        assert [e["reason"] for e in events].count("HotSwap") == 1  # once, however many status ticks
        warning = next(e for e in events if e["reason"] == incident["class"])
        assert warning["type"] == "Warning" and warning["source"]["component"] == "stalwart-operator"
        # The incident, read through the Kubernetes API (the TrainingJob's status), with no etcd.
        listed = world.cli("incidents", "alpha", "-n", NS, "-o", "json", plugin=True)
        assert listed.returncode == 0, listed.stdout + listed.stderr
        [row] = [r for r in json.loads(listed.stdout) if r["id"] == incident["id"]]
        assert (row["job"], row["failure_class"], row["node"]) == ("alpha", incident["class"], victim)
        assert row["recovered"] and row["runbook"] == incident["runbook"]


def test_a_node_not_ready_evicts_its_pods(world: World) -> None:
    def fail(node: str, pod: dict[str, Any]) -> None:
        # The Node stops being Ready (a partition): its agent keeps running, only Kubernetes knows.
        world.core.patch_node_status(
            pod["spec"]["nodeName"],
            {
                "status": {
                    "conditions": [
                        {
                            "type": "Ready",
                            "status": "Unknown",
                            "reason": "NodeStatusUnknown",
                            "message": "Kubelet stopped posting node status.",
                        }
                    ]
                }
            },
            _preload_content=False,
        )

    with world.training("gamma"):
        _hot_swap(world, "gamma", fail, "node-not-ready")


def _role(name: str, replicas: int, who: str) -> dict[str, Any]:
    return {
        "name": name,
        "replicas": replicas,
        "processesPerNode": 1,
        "command": ["python", "worker.py", "--step-seconds", "0.3"],
        "restartScope": "Role",
        "standbys": 1,
        "resources": {"cpu": "1" if name == "actor" else "2"},
        "template": {"spec": {"containers": [{"name": "agent", "env": [{"name": "WHO", "value": who}]}]}},
    }


def test_an_rlhf_job_gets_pods_and_standbys_per_role_and_a_rollout_standby_replaces_a_rollout(world: World) -> None:
    """Two roles, each its own world with one standby made from its own template; the rollout's pod
    fails: the rollout's standby (never the actor's) takes its slot, the rollout role alone restarts
    (the actor's workers keep their pids), and the status shows it per role."""
    name = "rho"

    def fail(pod: dict[str, Any]) -> None:
        world.core.patch_namespaced_pod_status(
            pod["metadata"]["name"],
            NS,
            {"status": {"phase": "Failed", "reason": "Error", "message": "machine fault injected by the test"}},
            _preload_content=False,
        )

    with world.training(name, roles=[_role("actor", 1, "actor"), _role("rollout", 1, "rollout")]):
        before = world.running(name)
        state = world.state(name)
        assert state is not None and state.roles
        [actor], [rollout] = state.role_slots("actor"), state.role_slots("rollout")
        standby_of = {role: node for node, role in state.standby_roles.items()}
        assert sorted(standby_of) == ["actor", "rollout"] and sorted(state.standbys) == sorted(standby_of.values())
        pods = world.pods(name)
        # Every pod, slot or standby, is made from its own role's template.
        for node, role in ((actor, "actor"), (rollout, "rollout"), *((n, r) for r, n in standby_of.items())):
            pod = pods[node]
            assert pod["metadata"]["labels"][names.ROLE_LABEL] == role, node
            assert world.kubelet.environment(pod["metadata"]["name"])["WHO"] == role, node
            cpu = pod["spec"]["containers"][0]["resources"]["requests"]["cpu"]
            assert cpu == ("1" if role == "actor" else "2"), node
        by_role = {r["role"]: r for r in before["roles"]}
        assert before["rolesReady"] == "actor 1/1, rollout 1/1"
        assert by_role["actor"]["standbys"]["ready"] == by_role["rollout"]["standbys"]["ready"] == 1
        assert by_role["rollout"]["restartScope"] == "Role" and by_role["rollout"]["incidents"] == 0

        def actor_pids() -> set[int]:
            beat = world.store.get(keys.node_heartbeat(names.job_id(NS, name), actor), Heartbeat)
            return {w.pid for w in beat.workers} if beat else set()

        pids = actor_pids()
        assert pids
        actor_generation = state.roles["actor"].generation
        fail(pods[rollout])
        after = world.wait(
            "the rollout's standby in the rollout's slot",
            lambda: (
                (s := world.state(name))
                and s.phase is JobPhase.RUNNING
                and s.role_slots("rollout") == [standby_of["rollout"]]
                and s.roles["rollout"].generation > state.roles["rollout"].generation
                and s
            ),
        )
        assert after.role_slots("actor") == [actor] and standby_of["actor"] in after.standbys  # not the actor's
        assert after.standby_roles[standby_of["actor"]] == "actor"
        assert after.roles["actor"].generation == actor_generation and actor_pids() == pids  # the actor kept going
        incident = world.store.get(
            keys.incident(names.job_id(NS, name), after.roles["rollout"].incidents[-1]), Incident
        )
        assert incident is not None and incident.replacements == {rollout: standby_of["rollout"]}
        # The status, per role: the rollout's incident and restart, its new standby on its way; the actor untouched.
        status = world.wait(
            "the status per role after the swap",
            lambda: (
                (st := world.status(name)).get("rolesReady") == "actor 1/1, rollout 1/1"
                and {r["role"]: r for r in st["roles"]}["rollout"]["generation"] >= after.roles["rollout"].generation
                and st
            ),
        )
        roles = {r["role"]: r for r in status["roles"]}
        assert roles["rollout"]["lastIncident"] == incident.id and roles["rollout"]["restarts"]["counted"] == 0
        assert roles["rollout"]["restarts"]["infrastructure"] == 1
        assert (
            roles["rollout"]["incidents"] == 1 and roles["rollout"]["generation"] == after.roles["rollout"].generation
        )
        assert roles["actor"]["incidents"] == 0 and roles["actor"]["generation"] == actor_generation
        assert roles["actor"]["standbys"]["ready"] == 1
        swap = world.wait(
            "the HotSwap Event",
            lambda: [e["message"] for e in world.events(name) if e["reason"] == "HotSwap"],
        )
        assert swap == [
            f"rollout standby {standby_of['rollout']} takes {rollout}'s slot and ranks ({incident.id}); only the "
            "rollout role restarts, the other roles keep their pods and processes"
        ]
        # The rollout's pool is refilled from the rollout's template.
        new = world.wait(
            "a new rollout standby",
            lambda: next((n for n, r in (world.state(name) or after).standby_roles.items() if r == "rollout"), None),
        )
        pod = world.wait("its pod", lambda: world.pods(name).get(new))
        assert pod["metadata"]["labels"][names.ROLE_LABEL] == "rollout"
        assert {e.get("name"): e.get("value") for e in pod["spec"]["containers"][0]["env"]}["WHO"] == "rollout"


@pytest.mark.timeout(900)  # three generations (the start, the shrink, the grow): minutes on a starved machine
def test_an_elastic_job_shrinks_when_no_machine_is_free_and_grows_back(world: World) -> None:
    """minReplicas on Kubernetes: 3 machines of one pod each; a pod fails, its machine is cordoned
    and its replacement stays Pending (Unschedulable): the job goes on at 2 nodes. A machine for
    one more pod appears: the Pending pod runs, and the job grows back to 3 at a checkpoint."""
    from stalwart.spec.model import FailureEvent
    from stalwart.store.records import Incident

    name = "elastic"
    job_id = names.job_id(NS, name)
    nodes = raw(world.core.list_node(_preload_content=False))["items"]
    busy = {p["spec"].get("nodeName") for p in raw(world.core.list_namespaced_pod(NS, _preload_content=False))["items"]}
    clean = [n["metadata"]["name"] for n in nodes if not (n.get("spec") or {}).get("taints")]
    clean = [m for m in clean if m not in busy][:3]
    assert len(clean) == 3, f"the module's earlier tests left too few clean machines: {clean}"
    taints = {n["metadata"]["name"]: list((n.get("spec") or {}).get("taints") or []) for n in nodes}
    full = {"key": "test.stalwart.dev/full", "effect": "NoSchedule"}
    body = {
        "apiVersion": f"{names.GROUP}/{names.VERSION}",
        "kind": names.KIND,
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "roles": [
                {
                    "name": "trainer",
                    "replicas": 3,
                    "minReplicas": 2,
                    "processesPerNode": 1,
                    "command": ["python", "worker.py", "--checkpoint"],
                }
            ],
            "faultTolerance": {
                "heartbeatIntervalSeconds": 0.5,
                "leaseTtlSeconds": 6,
                "stopGraceSeconds": 1,
                "preflight": False,
                "firstStepTimeoutSeconds": 120,
                "warmWorkers": False,
            },
            "standbys": {"count": 0, "minimum": 0},
            "checkpoint": {"intervalSteps": 5},
        },
    }
    world.kubelet.pods_per_machine = 1
    try:
        for machine, had in taints.items():  # the job gets 3 machines: the others are full
            if machine not in clean:
                world.core.patch_node(machine, {"spec": {"taints": [*had, full]}}, _preload_content=False)
        world.custom.create_namespaced_custom_object(
            names.GROUP, names.VERSION, NS, names.PLURAL, body, _preload_content=False
        )
        with world.training(name):
            world.running(name, standby=False)
            state = world.state(name)
            assert state is not None and len(state.slots) == 3
            victim = state.slots[1]
            world.core.patch_namespaced_pod_status(
                names.pod_name(name, victim),
                NS,
                {"status": {"phase": "Failed", "reason": "Error", "message": "machine fault injected by the test"}},
                _preload_content=False,
            )
            shrunk = world.wait(
                "the job running at 2 nodes",
                lambda: (
                    (s := world.state(name))
                    and s.phase is JobPhase.RUNNING
                    and s.roles["trainer"].nodes == 2
                    and s.open_incident is None
                    and s
                ),
            )
            waiting = shrunk.standbys[0]  # the replacement, still asked for: its pod is Pending
            assert world.pods(name)[waiting]["status"]["phase"] == "Pending"
            incidents = world.store.get_prefix(keys.incidents_prefix(job_id), Incident)
            [lost] = [i for i in incidents if i.resize is not None]
            assert (lost.resize.from_replicas, lost.resize.to_replicas) == (3, 2)  # type: ignore[union-attr]
            world.kubelet.pods_per_machine = 2  # a machine for one more pod: the Pending pod runs
            grown = world.wait(
                "the job grown back to 3 nodes",
                lambda: (
                    (s := world.state(name))
                    and s.phase is JobPhase.RUNNING
                    and s.roles["trainer"].nodes == 3
                    and s.generation > shrunk.generation
                    and s
                ),
            )
            assert waiting in grown.slots
            incidents = world.store.get_prefix(keys.incidents_prefix(job_id), Incident)
            [grow] = [i for i in incidents if i.failure_class is FailureEvent.ELASTIC_GROW]
            assert grow.resize is not None and (grow.resize.from_replicas, grow.resize.to_replicas) == (2, 3)
            assignment = world.store.get(keys.generation(job_id, grown.generation), Assignment)
            assert assignment is not None and assignment.world_size == 3
    finally:
        world.kubelet.pods_per_machine = None
        for machine, had in taints.items():
            world.core.patch_node(machine, {"spec": {"taints": had}}, _preload_content=False)


@pytest.mark.timeout(900)  # eight CLI processes (reads, then requests): minutes on a starved machine
def test_on_call_requests_through_the_kubernetes_api(world: World) -> None:
    """(The job stays for the next test, which deletes it.)"""
    world.submit("delta", replicas=1, standbys=0)
    world.running("delta", standby=False)
    [node] = world.pods("delta")
    # Reads through the Kubernetes API (the TrainingJobs' status), as `kubectl stalwart` does: no etcd.
    listed = world.cli("jobs", "-n", NS, "-o", "json", plugin=True)
    assert listed.returncode == 0, listed.stdout + listed.stderr
    [row] = [r for r in json.loads(listed.stdout) if r["job"] == "delta"]
    assert (row["namespace"], row["phase"], row["nodes_up"], row["nodes_total"]) == (NS, "Running", 1, 1)
    assert row["generation"] >= 1 and row["step"] >= 1
    shown = world.cli("status", "delta", "-n", NS, plugin=True)
    assert shown.returncode == 0 and "delta" in shown.stdout and "Kubernetes API" in shown.stdout, shown.stderr
    table = world.cli("jobs", "-n", NS)  # `stalwart` with a kubeconfig and no etcd: the same way
    assert table.returncode == 0 and "delta" in table.stdout and f"namespace {NS}" in table.stdout, table.stderr
    # On-call through the Kubernetes API (a kubeconfig, no etcd): the request is an annotation the
    # operator hands to the controller; the answer comes back in the status, the annotation goes.
    done = world.cli("node", "cordon", node, "--job", "delta", "-n", NS, "--yes", "--reason", "ECC errors rising")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Done" in done.stdout and f"cordon {node}" in done.stdout
    [answer] = [r for r in world.status("delta")["requests"] if r["kind"] == "cordon"]
    assert answer["phase"] == "Done" and answer["requestedBy"].endswith("(through the Kubernetes API)")
    [request] = [
        r
        for r in world.store.get_prefix(keys.requests_prefix(names.job_id(NS, "delta")), OperatorRequest)
        if r.id == answer["id"]
    ]
    assert request.kind is RequestKind.CORDON and request.reason == "ECC errors rising"
    world.wait(
        "the request annotation removed",
        lambda: (
            not any(
                k.startswith("requests.stalwart.dev/")
                for k in (world.job("delta") or {})["metadata"].get("annotations", {})
            )
        ),
    )
    again = world.cli("node", "uncordon", node, "--job", "delta", "-n", NS, "--yes", plugin=True)  # kubectl stalwart
    assert again.returncode == 0 and "Done" in again.stdout, again.stdout + again.stderr
    missing = world.cli("node", "evict", "node-9", "--job", "no-such-job", "-n", NS, "--yes")
    assert missing.returncode != 0 and "no TrainingJob 'no-such-job' in namespace default" in missing.stderr


def test_deletion_leaves_nothing_behind(world: World) -> None:
    """Deletion (the finalizer) leaves nothing behind: pods, Service, etcd keys, agents."""
    if world.job("delta") is None:
        world.submit("delta", replicas=1, standbys=0)
    world.running("delta", standby=False)
    pod_names = [p["metadata"]["name"] for p in world.pods("delta").values()]
    world.custom.delete_namespaced_custom_object(
        names.GROUP, names.VERSION, NS, names.PLURAL, "delta", _preload_content=False
    )
    world.wait("the job gone", lambda: world.job("delta") is None)
    world.wait("its pods gone", lambda: not world.pods("delta"))
    with pytest.raises(kubernetes.client.exceptions.ApiException) as gone:
        world.core.read_namespaced_service(names.service_name("delta"), NS)
    assert gone.value.status == 404
    world.wait("its agents stopped", lambda: not any(world.kubelet.alive(p) for p in pod_names))
    # The finalizer deleted the job's keys; the agents' own keys went with their leases.
    world.wait(
        "its etcd keys gone", lambda: world.store.get_prefix_raw(keys.job_prefix(names.job_id(NS, "delta"))) == []
    )


@pytest.fixture
def s3() -> Iterator[str]:
    """An S3 server (moto's, on loopback) with the bucket `ckpt`."""
    import boto3
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    boto3.client(
        "s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="k", aws_secret_access_key="s"
    ).create_bucket(Bucket="ckpt")
    try:
        yield endpoint
    finally:
        server.stop()


@pytest.mark.timeout(900)  # pre-flight twice, two generations, a suspension: minutes on a starved machine
def test_preflight_on_the_cluster_s3_checkpoints_and_suspend_resume(world: World, s3: str) -> None:
    """One job, three acceptance points of running on Kubernetes:

    - pre-flight runs in the job's own agent pods: the machine under kappa-node-0 computes wrong
      (silent data corruption, injected into that pod's processes), the collective and compute
      checks find it, and node-0 is evicted (its machine cordoned) before training starts;
    - spec.checkpoint.uri `s3://` goes to the agents untouched and the workers write to the S3
      server, with credentials from a Secret (valueFrom);
    - suspend (`stalwart suspend` through the Kubernetes API) is the controller's Suspended stage:
      pods stopped, no incident, no lost node, no machine cordoned; resume starts from the newest
      checkpoint in S3."""
    import boto3

    from stalwart.checkpoint import latest

    name, job_id = "kappa", names.job_id(NS, "kappa")
    world.core.create_namespaced_secret(
        NS,
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "kappa-s3"},
            "stringData": {"access-key-id": "AKIAKAPPA", "secret-access-key": "kappa-secret"},
        },
        _preload_content=False,
    )
    world.kubelet.fault_env[f"{name}-node-0"] = {"STALWART_FAULT_CORRUPT_COMPUTE": "1"}
    resumed_to = world.tmp / "kappa-resumed"
    secret = {"name": "kappa-s3"}
    template = {
        "spec": {
            "containers": [
                {
                    "name": "agent",
                    "env": [
                        {
                            "name": "AWS_ACCESS_KEY_ID",
                            "valueFrom": {"secretKeyRef": {**secret, "key": "access-key-id"}},
                        },
                        {
                            "name": "AWS_SECRET_ACCESS_KEY",
                            "valueFrom": {"secretKeyRef": {**secret, "key": "secret-access-key"}},
                        },
                        {"name": "AWS_DEFAULT_REGION", "value": "us-east-1"},
                        {"name": "AWS_ENDPOINT_URL", "value": s3},
                    ],
                }
            ]
        }
    }
    with world.training(
        name,
        replicas=1,
        standbys=1,
        args=["--checkpoint", "--step-seconds", "0.1", "--resumed-to", str(resumed_to)],
        template=template,
        checkpoint={"uri": "s3://ckpt/kappa", "intervalSteps": 5},
        faultTolerance={
            "heartbeatIntervalSeconds": 0.5,
            "leaseTtlSeconds": 6,
            "stopGraceSeconds": 1,
            "preflight": True,
            "firstStepTimeoutSeconds": 120,
            "warmWorkers": False,
        },
    ):
        bad_machine = world.wait(
            "node-0's pod scheduled", lambda: (p := world.pods(name).get("node-0")) and p["spec"].get("nodeName")
        )
        # Pre-flight rounds (one more when the standby registers late) precede generation 1.
        status = world.running(name, standby=False, timeout=3 * WAIT)
        # Pre-flight: node-0 failed the compute check before any training, and was evicted for it.
        [incident] = world.store.get_prefix(keys.incidents_prefix(job_id), Incident)
        assert incident.failure_class.value == "PreflightFailed" and incident.node == "node-0", incident
        assert incident.generation == 0 and not incident.counted
        assert any("compute result differs" in e for e in incident.evidence), incident.evidence
        state = world.state(name)
        assert state is not None and "node-0" in state.evicted and "node-0" not in state.slots
        assert state.generation == 1  # training started once, after the eviction
        machine = world.wait(
            "the bad machine cordoned",
            lambda: (
                (n := raw(world.core.read_node(bad_machine, _preload_content=False)))
                and n["metadata"].get("labels", {}).get(names.CORDON_LABEL) == "true"
                and n["metadata"]["name"]
            ),
        )
        assert status["lastIncident"]["class"] == "PreflightFailed"
        # S3: checkpoints from the workers, with the Secret's credentials, in the S3 server.
        client = boto3.client(
            "s3",
            endpoint_url=s3,
            region_name="us-east-1",
            aws_access_key_id="AKIAKAPPA",
            aws_secret_access_key="kappa-secret",
        )

        def committed() -> list[str]:
            listed = client.list_objects_v2(Bucket="ckpt", Prefix="kappa/").get("Contents", [])
            return [o["Key"] for o in listed]

        world.wait("a checkpoint in S3", lambda: any(k.endswith(".json") for k in committed()))
        assert all(k.startswith("kappa/step-") for k in committed())
        # Suspend: the controller stops the workers, then the pods; nothing is an incident.
        suspended = world.cli("suspend", name, "-n", NS)
        assert suspended.returncode == 0 and "Suspended" in suspended.stdout, suspended.stdout + suspended.stderr
        assert not world.pods(name)  # the Suspended condition waits for every pod to be gone
        status = world.status(name)
        assert {c["type"]: c["status"] for c in status["conditions"]}["Suspended"] == "True"
        state = world.state(name)
        assert state is not None and state.stage.value == "Suspended" and state.suspensions
        env = {"AWS_ACCESS_KEY_ID": "AKIAKAPPA", "AWS_SECRET_ACCESS_KEY": "kappa-secret", "AWS_ENDPOINT_URL": s3}
        with _environ(env):
            newest = latest("s3://ckpt/kappa")
        assert newest is not None and newest >= 5
        # Resume: the same slots, a new generation from the newest checkpoint; no incident recorded.
        resumed = world.cli("resume", name, "-n", NS)
        assert resumed.returncode == 0, resumed.stdout + resumed.stderr
        status = world.running(name, standby=False, timeout=2 * WAIT)  # pre-flight again, then generation 2
        after = world.state(name)
        assert after is not None and after.generation > state.generation and after.slots == state.slots
        marker = Path(f"{resumed_to}.g{after.generation}")  # written by the new generation's worker
        assert world.wait("the resumed worker's start", lambda: marker.exists() and marker.read_text()) == str(newest)
        assert [i.id for i in world.store.get_prefix(keys.incidents_prefix(job_id), Incident)] == [incident.id]
        assert after.restarts == state.restarts and after.evicted == state.evicted
        assert {c["type"]: c["status"] for c in status["conditions"]}["Suspended"] == "False"
        reasons = [e["reason"] for e in world.events(name)]
        assert "Suspended" in reasons and "Resumed" in reasons
        # Only the bad machine is cordoned: the ones the suspension emptied are not blamed.
        cordoned = [
            n["metadata"]["name"]
            for n in raw(world.core.list_node(_preload_content=False))["items"]
            if (n["metadata"].get("annotations") or {}).get(names.CORDON_REASON_ANNOTATION, "").startswith(job_id + "/")
        ]
        assert cordoned == [machine]


def test_kueue_admits_suspends_and_resumes_a_job_through_its_label(world: World, s3: str) -> None:
    """Kueue's suspend-based admission, driven the way Kueue drives a Job: the job carries only the
    `kueue.x-k8s.io/queue-name` label and is created suspended (no pod, no generation); unsetting
    spec.suspend (admission) starts it; setting it again (preemption) makes the platform ask every
    rank for a checkpoint at a step just ahead (the controller's CheckpointRequest, through the agents
    to the worker SDK), wait for its commit, then stop the workers and the pods; admitted again, it
    resumes from that checkpoint. Periodic checkpoints are out of reach (every 10,000 steps) and the
    test worker has no SIGTERM handler (a 1 s stop grace): the checkpoint it resumes from is the one
    the platform asked for, at the step the controller named."""
    from stalwart.checkpoint import latest

    name, job_id = "mu", names.job_id(NS, "mu")
    resumed_to = world.tmp / "mu-resumed"
    s3_env = {"AWS_ACCESS_KEY_ID": "AKIAMU", "AWS_SECRET_ACCESS_KEY": "mu-secret", "AWS_ENDPOINT_URL": s3}
    container_env = [{"name": k, "value": v} for k, v in {**s3_env, "AWS_DEFAULT_REGION": "us-east-1"}.items()]
    body = {
        "apiVersion": f"{names.GROUP}/{names.VERSION}",
        "kind": names.KIND,
        "metadata": {"name": name, "namespace": NS, "labels": {names.KUEUE_QUEUE_LABEL: "team-a"}},
        "spec": {
            "roles": [
                {
                    "name": "trainer",
                    "replicas": 1,
                    "command": ["python", "worker.py", "--checkpoint", "--step-seconds", "0.1"]
                    + ["--resumed-to", str(resumed_to)],
                    "template": {"spec": {"containers": [{"name": "agent", "env": container_env}]}},
                }
            ],
            "checkpoint": {"uri": "s3://ckpt/mu", "intervalSteps": 10_000},
            "faultTolerance": {
                "heartbeatIntervalSeconds": 0.5,
                "leaseTtlSeconds": 6,
                "stopGraceSeconds": 1,  # a stopped worker saves nothing: the save comes before the stop
                "preflight": False,
                "firstStepTimeoutSeconds": 120,
                "warmWorkers": False,
            },
            "standbys": {"count": 0, "minimum": 0},
        },
    }

    def set_suspend(value: bool) -> None:  # what Kueue's job reconciler does
        world.custom.patch_namespaced_custom_object(
            names.GROUP, names.VERSION, NS, names.PLURAL, name, {"spec": {"suspend": value}}
        )

    world.custom.create_namespaced_custom_object(names.GROUP, names.VERSION, NS, names.PLURAL, body)
    try:
        # Created suspended, as Kueue's webhook does for a Job: it waits for admission.
        world.wait("suspended on creation", lambda: (world.job(name) or {}).get("spec", {}).get("suspend") is True)
        world.wait("its status Suspended", lambda: world.status(name).get("phase") == "Suspended")
        state = world.state(name)
        assert not world.pods(name) and (state is None or state.generation == 0)
        # Admitted: Kueue unsets spec.suspend and the job runs.
        set_suspend(False)
        world.running(name, standby=False, timeout=2 * WAIT)
        world.wait("a few steps", lambda: (world.status(name).get("currentStep") or 0) >= 5)
        with _environ(s3_env):
            assert latest("s3://ckpt/mu") is None  # no periodic checkpoint yet
        # Preempted: Kueue sets spec.suspend again; the platform asks for a checkpoint, the workers
        # save it while they still run, then every pod stops.
        set_suspend(True)
        asked = world.wait(
            "the checkpoint asked of the workers",
            lambda: (s := world.state(name)) and s.suspensions and s.suspensions[-1].save_step,
        )
        world.wait(
            "suspended after preemption",
            lambda: (
                {c["type"]: c["status"] for c in world.status(name).get("conditions", [])}.get("Suspended") == "True"
            ),
            2 * WAIT,
        )
        assert not world.pods(name)
        preempted = world.state(name)
        assert preempted is not None and preempted.stage.value == "Suspended" and preempted.generation == 1
        with _environ(s3_env):
            saved = latest("s3://ckpt/mu")
        # The checkpoint is the one the controller asked for, at the step it named, committed before the
        # workers were stopped (the controller recorded it in the suspension before it stopped them).
        assert saved == asked and preempted.suspensions[-1].saved_step == asked and asked > 5
        assert world.store.get(keys.checkpoint_request(job_id), CheckpointRequest) is None  # done with
        [catalogued] = world.store.get_prefix(keys.checkpoints_prefix(job_id), CheckpointEntry)
        assert catalogued.step == asked and catalogued.generation == 1
        said = world.wait(
            "the CheckpointedBeforeSuspend Event",
            lambda: [e["message"] for e in world.events(name) if e["reason"] == "CheckpointedBeforeSuspend"],
        )
        assert f"step {asked}" in said[0]
        # Admitted again: a new generation, from the preemption's checkpoint; no incident.
        set_suspend(False)
        world.running(name, standby=False, timeout=2 * WAIT)
        after = world.state(name)
        assert after is not None and after.generation == 2 and after.restarts == preempted.restarts
        marker = Path(f"{resumed_to}.g2")
        assert world.wait("the resumed worker's start", lambda: marker.exists() and marker.read_text()) == str(saved)
        assert world.store.get_prefix(keys.incidents_prefix(job_id), Incident) == []
    finally:
        world.delete(name)
        world.wait(f"{name} deleted", lambda: world.job(name) is None and not world.pods(name))


@contextmanager
def _environ(values: dict[str, str]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def test_a_finished_job_cleans_its_pods_and_expires(world: World) -> None:
    """Completion: Succeeded with its condition, pods deleted (cleanPodPolicy All), and the job
    itself deleted ttlSecondsAfterFinished later."""
    world.submit(
        "epsilon",
        replicas=1,
        standbys=0,
        args=["--steps", "10", "--step-seconds", "0.1"],
        ttlSecondsAfterFinished=2,
    )
    status = world.wait(
        "Succeeded",
        lambda: (s := world.status("epsilon")).get("phase") == "Succeeded" and s,
    )
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["Succeeded"]["status"] == "True" and conditions["Running"]["status"] == "False"
    # `kubectl wait --for=condition=Complete` fires on a condition of type Complete with status True.
    assert conditions["Complete"]["status"] == "True" and conditions["Complete"]["reason"] == "Succeeded"
    assert status["currentStep"] == 10 and status["completionTime"]
    world.wait("the job deleted after its TTL", lambda: world.job("epsilon") is None)
    world.wait("its pods gone", lambda: not world.pods("epsilon"))
    world.wait(
        "its etcd keys gone", lambda: world.store.get_prefix_raw(keys.job_prefix(names.job_id(NS, "epsilon"))) == []
    )


def _diagnoses(url: str) -> float:
    """The verdicts the diagnosis service returned for crashes (its Prometheus counter)."""
    text = httpx.get(f"{url}/metrics", timeout=5).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("stalwart_diagnosis_requests_total{") and 'kind="crash"' in line
    )


@pytest.mark.timeout(600)  # two crashes and restarts: on a starved machine, more than the default
def test_the_hosted_controllers_use_the_diagnosis_service_and_fall_back(world: World) -> None:
    """The operator publishes STALWART_DIAGNOSIS_URL; a hosted controller asks that service about a
    crash while it is up, and diagnoses in process once it is down. (The job stays for the next
    test: the leader's job metrics show it.)"""
    url = world.env["STALWART_DIAGNOSIS_URL"]
    endpoint = world.wait(
        "the diagnosis URL published", lambda: world.store.get(keys.service("diagnosis"), ServiceEndpoint)
    )
    assert endpoint.url == url
    trigger = world.tmp / "crash"
    job_id = names.job_id(NS, "zeta")

    def crash_and_wait(count: int) -> Incident:
        state = world.state("zeta")
        assert state is not None
        Path(f"{trigger}.g{state.generation}").touch()
        return world.wait(  # type: ignore[no-any-return]
            f"incident {count} with a verdict",
            lambda: (
                len(incidents := world.store.get_prefix(keys.incidents_prefix(job_id), Incident)) >= count
                and (newest := max(incidents, key=lambda i: i.detected_at)).verdict
                and newest
            ),
        )

    world.submit("zeta", replicas=2, standbys=0, args=["--crash-when", str(trigger)])
    world.running("zeta", standby=False)
    before = _diagnoses(url)
    first = crash_and_wait(1)
    assert first.failure_class.value in ("WorkerCrash", "UserCodeError") and first.verdict
    assert _diagnoses(url) > before  # the service gave the verdict
    assert world.diagnosis is not None
    stop_process(world.diagnosis, grace=10.0)
    world.running("zeta", standby=False)
    second = crash_and_wait(2)
    assert second.verdict  # diagnosed in the controller's process instead
    assert "diagnosis service unavailable; diagnosing in process" in world.log.read_text()


def test_a_second_operator_replica_stands_by(world: World) -> None:
    """Two replicas: the second waits for leadership (alive, not ready) and starts no kopf."""
    probe = free_port()
    env = {
        **world.env,
        "STALWART_IDENTITY": "operator-1",
        "STALWART_PROBE_PORT": str(probe),
        "STALWART_JOB_METRICS_PORT": str(free_port()),
    }
    with open(world.log.with_name("operator-1.log"), "ab") as out:
        second = spawn([sys.executable, "-m", "stalwart_operator"], env=env, stdout=out)
    http = httpx.Client(timeout=2)  # one client: each `httpx.get` builds a TLS context
    try:

        def get(port: str | int, path: str) -> int:
            try:
                return http.get(f"http://127.0.0.1:{port}{path}").status_code
            except httpx.HTTPError:
                return 0

        # Its probes answer from its start; it says it stands by after its first try at the lease.
        standby_log = world.log.with_name("operator-1.log")
        world.wait(
            "the standby's probes and its first election attempt",
            lambda: get(probe, "/healthz") == 200 and "standing by" in standby_log.read_text(),
        )
        assert get(probe, "/readyz") == 503
        assert get(world.env["STALWART_PROBE_PORT"], "/readyz") == 200
        # The job metrics come from the leader only; the standby answers with its own liveness.
        standby = http.get(f"http://127.0.0.1:{env['STALWART_JOB_METRICS_PORT']}/metrics", timeout=5).text
        assert "stalwart_job_exporter_leader 0.0" in standby and "stalwart_job_phase" not in standby
        leader = http.get(f"http://127.0.0.1:{world.env['STALWART_JOB_METRICS_PORT']}/metrics", timeout=5).text
        assert "stalwart_job_exporter_leader 1.0" in leader and 'training_job="default.' in leader
    finally:
        http.close()
        assert stop_process(second, grace=10.0) == 0


def test_a_job_managed_elsewhere_is_left_alone(world: World) -> None:
    """spec.managedBy names another controller (MultiKueue): after every other test's
    reconciliation, that job has no finalizer, no pods, no etcd keys and no status from us."""
    job = world.job("foreign")
    assert job is not None
    assert names.FINALIZER not in (job["metadata"].get("finalizers") or [])
    assert not world.pods("foreign") and "status" not in job
    assert world.store.get_prefix_raw(keys.job_prefix(names.job_id(NS, "foreign"))) == []
    assert not world.events("foreign")
    for name in ("foreign", "zeta"):
        world.delete(name)
        world.wait(f"{name} deleted", lambda n=name: world.job(n) is None and not world.pods(n))


def test_the_operator_used_only_what_its_cluster_role_grants(world: World) -> None:
    """Every API call the operator made in this module (kopf's and its own client's) is allowed
    by the RBAC the Helm chart installs (charts/stalwart), in both modes: cluster-wide (one
    ClusterRole) and narrowed to the served namespaces (operator.namespaces: a Role per namespace
    plus the cluster-scoped reads). The emulator records no namespace, so the narrowed mode is checked
    as the ClusterRole's rules plus the Role of the namespace the jobs run in."""

    def granted(docs: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
        roles = [  # the operator's own (the chart's aggregated user roles are bound to no service account)
            d
            for d in docs
            if (d["kind"] == "ClusterRole" and d["metadata"]["name"] == "stalwart-operator")
            or (d["kind"] == "Role" and d["metadata"]["namespace"] == NS)
        ]
        return {
            (g, r, v)
            for role in roles
            for rule in role["rules"]
            for g in rule["apiGroups"]
            for r in rule["resources"]
            for v in rule["verbs"]
        }

    assert world.api.emulator is not None
    used = {
        (group, resource, verb)
        for agent, group, resource, verb in world.api.emulator.calls
        if agent.startswith(("kopf/", USER_AGENT))
    }
    assert ("", "pods", "create") in used and (
        "stalwart.dev",
        "trainingjobs/status",
        "patch",
    ) in used
    assert used - granted(render_chart()) == set()
    narrowed = render_chart({"operator": {"namespaces": [NS, "other"]}})
    assert [d for d in narrowed if d["kind"] == "Role" and d["metadata"]["namespace"] == NS]
    assert used - granted(narrowed) == set()
