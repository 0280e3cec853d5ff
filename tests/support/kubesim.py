"""A Kubernetes API (kmock's KubernetesEmulator over real HTTP) and a small kubelet, for the
operator tests. Nothing here stands in for the operator: it talks to this API exactly as to a
real one, with the official client and kopf.

- `ApiServer`: the emulator on a loopback port, in its own thread and event loop, serving the
  resources the operator uses, plus what a real API server adds on create and update (uid,
  resourceVersion, creationTimestamp, generation): kopf's patches test the resourceVersion.
- `Kubelet`: schedules pods onto fake Nodes (Ready, untainted or tolerated, matching selector and
  affinity), runs each pod's container as a real local process (the node agent, with the pod's
  env, `$(VAR)`-expanded args and downward-API fields), and reports the pod's phase. A pod the test
  marks Failed has its processes killed, as when a machine dies. `fault_env` gives the processes of
  a named pod more variables: the faults of the machine under it (e.g. corrupt compute).
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

import jsonpatch
import kmock
import kubernetes
from kmock._internal import apps, enums

from stalwart.processes import kill_session, spawn, wait_for
from stalwart.spec import TrainingJob
from stalwart.store.client import Store
from stalwart_operator import names
from stalwart_operator.cluster import KubernetesCluster
from stalwart_operator.config import OperatorConfig

RESOURCES: dict[str, kmock.ResourceInfo] = {
    "v1/namespaces": kmock.ResourceInfo(kind="Namespace", namespaced=False, verbs={"get", "list", "watch"}),
    "v1/pods": kmock.ResourceInfo(
        kind="Pod", namespaced=True, verbs={"get", "list", "watch", "create", "delete", "patch"}
    ),
    "v1/services": kmock.ResourceInfo(
        kind="Service", namespaced=True, verbs={"get", "list", "watch", "create", "delete", "patch"}
    ),
    "v1/nodes": kmock.ResourceInfo(kind="Node", namespaced=False, verbs={"get", "list", "watch", "patch"}),
    "v1/events": kmock.ResourceInfo(kind="Event", namespaced=True, verbs={"create", "list", "watch"}),
    "v1/secrets": kmock.ResourceInfo(kind="Secret", namespaced=True, verbs={"get", "list", "create", "delete"}),
    "apiextensions.k8s.io/v1/customresourcedefinitions": kmock.ResourceInfo(
        kind="CustomResourceDefinition", namespaced=False, verbs={"get", "list", "watch"}
    ),
    "stalwart.dev/v1alpha1/trainingjobs": kmock.ResourceInfo(
        kind="TrainingJob",
        singular="trainingjob",
        namespaced=True,
        shortnames={"tj"},
        subresources={"status"},
        verbs={"get", "list", "watch", "create", "delete", "patch", "update"},
    ),
}


def _now() -> str:
    return dt.datetime.now(tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Emulator(kmock.KubernetesEmulator):
    """The emulator plus the fields a real API server sets on every write."""

    _versions = itertools.count(1)
    # kmock keeps every request it served and, to pick a reaction for the next one, walks that whole
    # history through its filters: the cost of a request grows with the count before it. The
    # operator module's few thousand requests made the emulator's thread most of the module's CPU.
    # The tests read `calls`, never the history, so only the newest requests
    # stay: the one being matched was appended just before it is matched, so it is always among
    # them. Each reaction tried walks all that stay: 8, not 64, took the operator module from 190
    # to 149 CPU-seconds.
    HISTORY = 8

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        # (user agent, API group, resource[/subresource], verb) of every request, for RBAC checks.
        self.calls: list[tuple[str, str, str, str]] = []

    async def _handle(self, request):  # type: ignore[no-untyped-def]
        if len(self._requests) > 2 * self.HISTORY:
            del self._requests[: -self.HISTORY]
        if request.resource is not None and request.resource.plural:
            agent = next((v for k, v in request.headers.items() if k.lower() == "user-agent"), "")
            verb = {
                enums.action.WATCH: "watch",
                enums.action.LIST: "list",
                enums.action.FETCH: "get",
                enums.action.CREATE: "create",
                enums.action.UPDATE: "patch",
                enums.action.DELETE: "delete",
            }.get(request.action, str(request.method).lower())
            plural = request.resource.plural + (f"/{request.subresource}" if request.subresource else "")
            self.calls.append((agent, request.resource.group or "", plural, verb))
        if request.resource is not None and request.subresource not in ("binding",):
            version = str(next(self._versions))
            data = request.data
            if request.action == enums.action.CREATE and isinstance(data, dict):
                meta = data.setdefault("metadata", {})
                meta.setdefault("uid", str(uuid.uuid4()))
                meta.setdefault("creationTimestamp", _now())
                meta.setdefault("generation", 1)
                meta["resourceVersion"] = version
                if request.namespace and not meta.get("namespace"):
                    meta["namespace"] = request.namespace
            elif request.action == enums.action.UPDATE and request.name is not None:
                spec_changed = False
                if isinstance(data, dict):
                    data.setdefault("metadata", {})
                    if data["metadata"] is not None:
                        data["metadata"]["resourceVersion"] = version
                    spec_changed = "spec" in data and request.subresource is None
                elif isinstance(data, list):
                    data.append(
                        {
                            "op": "add",
                            "path": "/metadata/resourceVersion",
                            "value": version,
                        }
                    )
                    spec_changed = any(str(op.get("path", "")).startswith("/spec") for op in data)
                key = (request.resource, request.namespace, request.name)
                if spec_changed and key in self.objects and not self.objects[key].deleted:
                    generation = int(self.objects[key].get("metadata", {}).get("generation", 1)) + 1
                    if isinstance(data, dict):
                        data["metadata"]["generation"] = generation
                    else:
                        data.append(
                            {
                                "op": "add",
                                "path": "/metadata/generation",
                                "value": generation,
                            }
                        )
        try:
            return await super()._handle(request)
        except jsonpatch.JsonPatchTestFailed as exc:
            # A real API server refuses a JSON patch whose `test` fails with 422, not a 500.
            raise kmock.KubernetesError(status=422, reason="Invalid", message=str(exc)) from None


class ApiServer:
    """The emulated API server on 127.0.0.1, started and stopped by the test."""

    def __init__(self, crd: dict[str, Any]) -> None:
        self._crd = crd
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.url = ""
        self.emulator: Emulator | None = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._serve()), name="kube-api", daemon=True)

    async def _serve(self) -> None:
        async with Emulator() as emulator, apps.Server(emulator) as server:
            for resource, info in RESOURCES.items():
                emulator.resources[resource] = info
            emulator.objects["v1/namespaces", None, "default"] = {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": "default", "uid": str(uuid.uuid4())},
            }
            emulator.objects[
                "apiextensions.k8s.io/v1/customresourcedefinitions", None, self._crd["metadata"]["name"]
            ] = self._crd
            self.emulator = emulator
            self.url = str(server.url).rstrip("/")
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            self._ready.set()
            await self._stop.wait()

    def start(self) -> ApiServer:
        self._thread.start()
        if not self._ready.wait(timeout=30):
            raise RuntimeError("the emulated API server did not start")
        return self

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=10)

    def break_watches(self, plural: str, code: int = 410) -> None:
        """Every open watch of `plural` gets an ERROR event: 410 Gone is what a real API server
        sends a watch whose resourceVersion etcd has compacted away; the watcher must LIST again."""
        assert self.emulator is not None and self._loop is not None
        event = {
            "type": "ERROR",
            "object": {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code, "reason": "Expired"},
        }
        buses = [bus for resource, bus in list(self.emulator._buses.items()) if resource.plural == plural]
        for bus in buses:
            asyncio.run_coroutine_threadsafe(bus.put(event), self._loop).result(timeout=30)

    def client(self) -> kubernetes.client.ApiClient:
        config = kubernetes.client.Configuration()
        config.host = self.url
        return kubernetes.client.ApiClient(config)

    def kubeconfig(self, path: Path) -> Path:
        path.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "current-context": "emulator",
                    "clusters": [{"name": "emulator", "cluster": {"server": self.url}}],
                    "users": [{"name": "tester", "user": {"token": "not-checked"}}],
                    "contexts": [{"name": "emulator", "context": {"cluster": "emulator", "user": "tester"}}],
                }
            )
        )
        return path


def raw(response: Any) -> Any:
    return json.loads(response.data)


_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


class Kubelet:
    """Schedules and runs pods on `machines` (Kubernetes Nodes it registers and keeps Ready)."""

    def __init__(self, api: ApiServer, machines: list[str], logs: Path, interval: float = 0.2) -> None:
        self.core = kubernetes.client.CoreV1Api(api.client())
        self.machines = machines
        self.logs = logs
        self.interval = interval
        self.procs: dict[str, subprocess.Popen[bytes]] = {}  # pod uid -> agent process
        self.started: dict[str, str] = {}  # pod uid -> pod name, for every pod ever started
        self.fault_env: dict[str, dict[str, str]] = {}  # pod name -> variables its machine injects
        # Pods a machine takes at most (None: any number); a pod no machine takes is marked
        # Unschedulable, as kube-scheduler marks it.
        self.pods_per_machine: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="kubelet", daemon=True)
        self.errors: list[str] = []

    def start(self) -> Kubelet:
        self.logs.mkdir(parents=True, exist_ok=True)
        for machine in self.machines:
            self.core.create_node(
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {"name": machine, "labels": {"kubernetes.io/hostname": machine}},
                    "spec": {},
                    "status": {
                        "conditions": [
                            {"type": "Ready", "status": "True", "reason": "KubeletReady", "lastTransitionTime": _now()}
                        ]
                    },
                },
                _preload_content=False,
            )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        for uid in list(self.procs):
            self._terminate(uid, grace=5.0)

    # -- the loop --------------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self._sync()
            except Exception as exc:
                self.errors.append(repr(exc))

    def _sync(self) -> None:
        pods = raw(self.core.list_pod_for_all_namespaces(_preload_content=False))["items"]
        nodes = {n["metadata"]["name"]: n for n in raw(self.core.list_node(_preload_content=False))["items"]}
        load = dict.fromkeys(nodes, 0)  # running or pending pods per machine
        for pod in pods:
            machine = (pod.get("spec") or {}).get("nodeName")
            if machine in load and (pod.get("status") or {}).get("phase") in (
                None,
                "Pending",
                "Running",
            ):
                load[machine] += 1
        live = set()
        for pod in pods:
            meta, spec, status = (
                pod["metadata"],
                pod.get("spec") or {},
                pod.get("status") or {},
            )
            uid = meta["uid"]
            live.add(uid)
            if meta.get("deletionTimestamp"):
                self._terminate(uid, grace=float(spec.get("terminationGracePeriodSeconds", 5)))
                continue
            if not spec.get("nodeName"):
                machine = self._schedule(pod, nodes, load)
                if machine:
                    self.core.patch_namespaced_pod(
                        meta["name"], meta["namespace"], {"spec": {"nodeName": machine}}, _preload_content=False
                    )
                    load[machine] += 1
                elif not any(c.get("reason") == "Unschedulable" for c in status.get("conditions") or []):
                    self._unschedulable(pod, len(nodes))
                continue
            phase = status.get("phase", "Pending")
            proc = self.procs.get(uid)
            if phase == "Pending" and uid not in self.started:
                self._run(pod)
            elif phase == "Failed" and proc is not None and proc.poll() is None:
                kill_session(proc.pid)  # the machine died: the agent and its workers at once
                proc.wait(timeout=10)
                self.procs.pop(uid, None)
            elif phase == "Running" and proc is not None and proc.poll() is not None:
                code = proc.returncode
                self._report(pod, "Succeeded" if code == 0 else "Failed", exit_code=code)
                self.procs.pop(uid, None)
        for uid in [u for u in self.procs if u not in live]:  # deleted outright
            self._terminate(uid, grace=5.0)

    def _unschedulable(self, pod: dict[str, Any], machines: int) -> None:
        condition = {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": f"0/{machines} nodes are available: no machine free for the pod.",
            "lastTransitionTime": _now(),
        }
        meta = pod["metadata"]
        self.core.patch_namespaced_pod_status(
            meta["name"],
            meta["namespace"],
            {"status": {"phase": "Pending", "conditions": [condition]}},
            _preload_content=False,
        )

    def _schedule(self, pod: dict[str, Any], nodes: dict[str, Any], load: dict[str, int]) -> str | None:
        """The least loaded Ready node the pod may go to (taints, nodeSelector, affinity)."""
        spec = pod.get("spec") or {}
        tolerations = spec.get("tolerations") or []
        candidates = []
        for name, node in nodes.items():
            labels = node["metadata"].get("labels") or {}
            ready = any(
                c.get("type") == "Ready" and c.get("status") == "True"
                for c in (node.get("status") or {}).get("conditions") or []
            )
            taints = [t for t in (node.get("spec") or {}).get("taints") or [] if t.get("effect") == "NoSchedule"]
            untolerated = [
                t
                for t in taints
                if not any(
                    tol.get("operator") == "Exists" and tol.get("key") in (None, t["key"]) or tol.get("key") == t["key"]
                    for tol in tolerations
                )
            ]
            selector = spec.get("nodeSelector") or {}
            if not ready or untolerated or any(labels.get(k) != v for k, v in selector.items()):
                continue
            if not self._affinity_ok(spec, labels):
                continue
            if self.pods_per_machine is not None and load[name] >= self.pods_per_machine:
                continue
            candidates.append((load[name], name))
        return min(candidates)[1] if candidates else None

    @staticmethod
    def _affinity_ok(spec: dict[str, Any], labels: dict[str, str]) -> bool:
        required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution"
        ) or {}
        terms = required.get("nodeSelectorTerms") or []
        if not terms:
            return True
        for term in terms:
            ok = True
            for expr in term.get("matchExpressions") or []:
                op, key, values = (
                    expr["operator"],
                    expr["key"],
                    expr.get("values") or [],
                )
                ok &= {
                    "DoesNotExist": key not in labels,
                    "Exists": key in labels,
                    "In": labels.get(key) in values,
                    "NotIn": labels.get(key) not in values,
                }[op]
            if ok:
                return True
        return False

    def _run(self, pod: dict[str, Any]) -> None:
        """Start the pod's one container as a local process, as a container runtime would."""
        meta, spec = pod["metadata"], pod["spec"]
        [container] = spec["containers"]
        fields = {
            "metadata.name": meta["name"],
            "metadata.namespace": meta["namespace"],
            "spec.nodeName": spec["nodeName"],
            "status.podIP": "127.0.0.1",
        }
        env = dict(os.environ)  # PATH, and the test session's tag (no orphans)
        for source in container.get("envFrom") or []:
            if "secretRef" in source:
                env.update(self._secret(meta["namespace"], source["secretRef"]["name"]))
        for item in container.get("env") or []:
            if "value" in item:
                env[item["name"]] = _VAR.sub(lambda m: env.get(m.group(1), m.group(0)), item["value"])
            elif "secretKeyRef" in item["valueFrom"]:
                ref = item["valueFrom"]["secretKeyRef"]
                env[item["name"]] = self._secret(meta["namespace"], ref["name"])[ref["key"]]
            else:
                env[item["name"]] = fields[item["valueFrom"]["fieldRef"]["fieldPath"]]
        env.update(self.fault_env.get(meta["name"], {}))
        argv = [
            _VAR.sub(lambda m: env.get(m.group(1), m.group(0)), a)
            for a in [*container["command"], *container.get("args", [])]
        ]
        if argv[0] in ("python", "python3"):
            argv[0] = sys.executable  # the image's interpreter is this one
        with open(self.logs / f"{meta['name']}-{meta['uid'][:8]}.log", "ab") as log:
            proc = spawn(
                argv,
                env=env,
                cwd=container.get("workingDir"),
                stdout=log,
                new_session=True,
            )
        self.procs[meta["uid"]] = proc
        self.started[meta["uid"]] = meta["name"]
        self._report(pod, "Running")

    def _secret(self, namespace: str, name: str) -> dict[str, str]:
        """A Secret's values, as the kubelet hands them to a container (stringData as a real API
        server would have stored it, base64 data decoded)."""
        secret = raw(self.core.read_namespaced_secret(name, namespace, _preload_content=False))
        values = {k: base64.b64decode(v).decode() for k, v in (secret.get("data") or {}).items()}
        return {**values, **(secret.get("stringData") or {})}

    def environment(self, pod_name: str) -> dict[str, str]:
        """The environment the pod's container runs with (its process's, from /proc)."""
        uid = next(u for u, n in self.started.items() if n == pod_name and u in self.procs)
        text = Path(f"/proc/{self.procs[uid].pid}/environ").read_bytes().decode(errors="replace")
        return dict(item.split("=", 1) for item in text.split("\0") if "=" in item)

    def _report(self, pod: dict[str, Any], phase: str, exit_code: int | None = None) -> None:
        meta = pod["metadata"]
        state = (
            {"running": {"startedAt": _now()}}
            if phase == "Running"
            else {
                "terminated": {
                    "exitCode": exit_code,
                    "reason": "Completed" if exit_code == 0 else "Error",
                    "finishedAt": _now(),
                }
            }
        )
        status = {
            "phase": phase,
            "podIP": "127.0.0.1",
            "hostIP": "127.0.0.1",
            "startTime": _now(),
            "containerStatuses": [
                {
                    "name": "agent",
                    "ready": phase == "Running",
                    "restartCount": 0,
                    "image": "",
                    "imageID": "",
                    "state": state,
                }
            ],
            "conditions": [{"type": "Ready", "status": "True" if phase == "Running" else "False"}],
        }
        try:
            self.core.patch_namespaced_pod_status(
                meta["name"], meta["namespace"], {"status": status}, _preload_content=False
            )
        except kubernetes.client.exceptions.ApiException as exc:
            if exc.status != 404:
                raise

    def _terminate(self, uid: str, grace: float) -> None:
        proc = self.procs.pop(uid, None)
        if proc is None:
            return
        if proc.poll() is not None:
            return  # exited by itself; its workers died with it (PR_SET_PDEATHSIG)
        try:
            os.kill(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        wait_for(lambda: proc.poll() is not None, grace)
        if proc.poll() is None:
            # Still ours (not reaped), so the pid cannot have been reused: kill its whole session.
            kill_session(proc.pid)
            proc.wait(timeout=10)

    def alive(self, pod_name: str) -> bool:
        uid = next(
            (u for u, n in self.started.items() if n == pod_name and u in self.procs),
            None,
        )
        return uid is not None and self.procs[uid].poll() is None


def job_cluster(api: ApiServer, store: Store, job: TrainingJob, owner_uid: str) -> KubernetesCluster:
    """The operator's KubernetesCluster for `job` in namespace default, against the emulator (no
    kopf: a test feeds the pod events it wants the cache to see)."""
    return KubernetesCluster(
        job=job,
        namespace="default",
        job_id=names.job_id("default", job.name),
        owner_uid=owner_uid,
        config=OperatorConfig(etcd=store.endpoint),
        api=api.client(),
        store=store,
    )
