"""KubernetesCluster: the controller's Cluster interface, carried out with pods.

A Stalwart node is a pod whose entry process is the node agent; starting a node creates its pod,
stopping it deletes the pod, and cordoning it taints the Kubernetes Node the pod ran on. The
controller decides which nodes are slots and which are standbys; this class only makes pods.
It reads them from the job's pod cache (pod_cache.py: one LIST, then the operator's pod watch), so
the controller's node list and the status mirror cost the API server nothing per tick.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from kubernetes import client as k8s

from stalwart.cluster.agent_checks import checks_through_agents
from stalwart.cluster.base import Cluster, NodeInfo, PreflightVerdict
from stalwart.controller.core.ranks import slot_roles
from stalwart.controller.core.standbys import role_standbys
from stalwart.controller.core.world import node_role
from stalwart.logs import get_logger
from stalwart.net import free_port
from stalwart.spec import CleanPodPolicy, Role, TrainingJob
from stalwart.store import keys
from stalwart.store.client import Store
from stalwart.store.records import JobState
from stalwart_operator import names, pods
from stalwart_operator.config import OperatorConfig
from stalwart_operator.kube import is_status
from stalwart_operator.pod_cache import PodCache

_ALIVE_PHASES = ("Pending", "Running")


class KubernetesCluster(Cluster):
    def __init__(
        self,
        *,
        job: TrainingJob,
        namespace: str,
        job_id: str,
        owner_uid: str,
        config: OperatorConfig,
        api: k8s.ApiClient,
        store: Store,
    ) -> None:
        self.job = job
        self.namespace = namespace
        self.job_id = job_id
        self.owner_uid = owner_uid
        self.config = config
        self.core = k8s.CoreV1Api(api)
        self.store = store
        self.log = get_logger("stalwart.operator.cluster", job=job_id)
        # The job's pods: one LIST, then the operator's pod watch (handlers.pod_event -> pod_event).
        self.pods = PodCache(self._list, node_of=_node_of, log=self.log)
        self.pods.resync_seconds = config.pod_resync_seconds

    # -- pods ------------------------------------------------------------------------------------
    def _list(self) -> list[dict[str, Any]]:
        """LIST the job's pods (label-filtered here too: not every API server honours selectors)."""
        listed = self.core.list_namespaced_pod(
            self.namespace, label_selector=names.job_selector(self.job.name), _preload_content=False
        )
        return [
            p
            for p in _json(listed).get("items", [])
            if (p.get("metadata", {}).get("labels") or {}).get(names.JOB_LABEL) == self.job.name
            and p.get("metadata", {}).get("namespace", self.namespace) == self.namespace
        ]

    def _read_pod(self, node: str) -> dict[str, Any] | None:
        """The node's pod as the API server has it now (one GET), None if there is none."""
        try:
            return _json(
                self.core.read_namespaced_pod(
                    names.pod_name(self.job.name, node), self.namespace, _preload_content=False
                )
            )
        except Exception as exc:
            if not is_status(exc, 404):
                raise
            return None

    def list_pods(self) -> list[dict[str, Any]]:
        """The job's pods as the cache holds them (only the fields the operator reads)."""
        return self.pods.pods()

    def pod_event(self, kind: str | None, pod: Mapping[str, Any]) -> None:
        """An event of one of the job's pods from the operator's watch."""
        self.pods.apply(kind, pod)

    def role_for(self, node: str, role: str | None = None) -> Role:
        """The role whose pod template the node's pod is made from: the one the controller names
        (`StartNode` carries it), else the node's slot or standby pool in the controller's state. A
        standby is made from its own role's template and the controller gives it only that role's
        slots, so a rollout standby never takes an actor's place."""
        roles = {r.name: r for r in self.job.spec.roles}
        if role in roles:
            return roles[role]
        state = self.store.get(keys.job_state(self.job_id), JobState)
        per_slot = slot_roles(self.job.spec)
        if state is not None:
            named = node_role(state, node)
            if named in roles:
                return roles[named]
            if node in state.slots and len(state.slots) == len(per_slot):  # a state written before roles
                return roles[per_slot[state.slots.index(node)]]
        else:  # before the controller wrote its state, the first nodes are the slots in order
            index = int(node.rsplit("-", 1)[-1]) if node.rsplit("-", 1)[-1].isdigit() else -1
            if 0 <= index < len(per_slot):
                return roles[per_slot[index]]
        return pods.standby_role(self.job)

    def pod_manifest(self, node: str, role: str | None = None) -> dict[str, Any]:
        spec = self.job.spec
        total = spec.node_count + sum(role_standbys(spec).values())
        return pods.node_pod(
            self.job,
            namespace=self.namespace,
            job_id=self.job_id,
            node=node,
            role=self.role_for(node, role),
            owner_uid=self.owner_uid,
            config=self.config,
            total_pods=total,
        )

    def start_node(self, name: str, role: str | None = None) -> None:
        try:
            manifest = self.pod_manifest(name, role)  # a dict body: the client sends it as it is
            created = self.core.create_namespaced_pod(self.namespace, manifest, _preload_content=False)
            self.pods.apply("ADDED", _json(created))
            self.log.info(
                "pod created",
                fields={"node": name, "pod": names.pod_name(self.job.name, name)},
            )
        except Exception as exc:
            if not is_status(exc, 409):  # it exists: starting is idempotent
                raise

    def _delete_pod(self, name: str) -> None:
        pod = names.pod_name(self.job.name, name)
        try:
            deleted = _json(
                self.core.delete_namespaced_pod(
                    pod,
                    self.namespace,
                    grace_period_seconds=self.config.termination_grace_seconds,
                    _preload_content=False,
                )
            )
            self.log.info("pod deleted", fields={"node": name})
        except Exception as exc:
            if not is_status(exc, 404):
                raise
            deleted = {}
        # The answer is the pod, terminating (a graceful delete) or as it was (gone at once), or a Status.
        if deleted.get("kind") == "Pod" and (deleted.get("metadata") or {}).get("deletionTimestamp"):
            self.pods.apply("MODIFIED", deleted)
        else:
            self.pods.forget(pod)

    def stop_node(self, name: str) -> None:
        """Delete the node's pod. Once the job has finished, the spec's cleanPodPolicy decides."""
        state = self.store.get(keys.job_state(self.job_id), JobState)
        if state is not None and state.phase.terminal:
            policy = self.job.spec.clean_pod_policy
            if policy is CleanPodPolicy.NONE:
                return
            if policy is CleanPodPolicy.RUNNING:
                # Asked of the API server, not the cache: a pod that succeeded a moment ago keeps its logs.
                pod = self._read_pod(name)
                if pod is None or (pod.get("status") or {}).get("phase") not in _ALIVE_PHASES:
                    return
        self._delete_pod(name)

    def list_nodes(self) -> list[NodeInfo]:
        """From the cache: no API call. A node whose pod was re-created shows its newest pod."""
        newest: dict[str, dict[str, Any]] = {}
        for pod in self.list_pods():
            node = _node_of(pod)
            if node and (node not in newest or _age_key(pod) > _age_key(newest[node])):
                newest[node] = pod
        out = []
        for node, pod in newest.items():
            phase = (pod.get("status") or {}).get("phase", "Pending")
            terminating = bool(pod["metadata"].get("deletionTimestamp"))
            out.append(
                NodeInfo(
                    name=node,
                    alive=phase in _ALIVE_PHASES and not terminating,
                    machine=(pod.get("spec") or {}).get("nodeName"),
                    unschedulable=phase == "Pending" and not terminating and _unschedulable(pod),
                )
            )
        return sorted(out, key=lambda n: n.name)

    def free_machines(self) -> int | None:
        """0 while one of the job's pods waits for a machine the scheduler cannot find (Pending,
        PodScheduled False, reason Unschedulable): a role with minReplicas then shrinks rather than
        wait. Otherwise None: the cluster's free capacity is the scheduler's to know."""
        return 0 if any(n.unschedulable for n in self.list_nodes()) else None

    def rendezvous(self, node: str) -> tuple[str, int]:
        """Rank 0's pod IP (its DNS name under the headless Service until it has one)."""
        port = self.config.rendezvous_port or free_port()
        cached = next(
            (
                p["status"]["podIP"]
                for p in self.list_pods()
                if _node_of(p) == node and p["status"].get("podIP") and not p["metadata"].get("deletionTimestamp")
            ),
            None,
        )
        if cached:
            return cached, port
        pod = self._read_pod(node)  # the cache may not have the IP yet: ask for the pod
        ip = ((pod or {}).get("status") or {}).get("podIP")
        return (
            ip or f"{node}.{names.service_name(self.job.name)}.{self.namespace}.svc",
            port,
        )

    def preflight(self, nodes: list[str], procs_per_node: int) -> list[PreflightVerdict]:
        """The collective and compute checks, run by the nodes' own agents in their pods (the
        machines under test, with the GPUs the pods hold), rank 0 on the first node's pod IP."""
        return checks_through_agents(self.store, self.job_id, nodes, procs_per_node, self.log)

    # -- machines --------------------------------------------------------------------------------
    def machine_of(self, node: str) -> str | None:
        """Where the node's pod ran, as the cache saw it (the pod may be gone: cordon follows stop)."""
        self.list_pods()  # the first read fills the cache
        return self.pods.machine(node)

    def cordon(self, node: str, reason: str) -> None:
        """Taint (NoSchedule) and label the Kubernetes Node the node's pod ran on."""
        machine = self.machine_of(node)
        if machine is None:
            self.log.warning("cannot cordon: no machine known for the node", fields={"node": node})
            return
        current = _json(self.core.read_node(machine, _preload_content=False))
        taints = [t for t in (current.get("spec") or {}).get("taints") or [] if t.get("key") != names.CORDON_TAINT]
        taints.append({"key": names.CORDON_TAINT, "value": "true", "effect": "NoSchedule"})
        self.core.patch_node(
            machine,
            {
                "metadata": {
                    "labels": {names.CORDON_LABEL: "true"},
                    "annotations": {names.CORDON_REASON_ANNOTATION: f"{self.job_id}/{node}: {reason}"[:1000]},
                },
                "spec": {"taints": taints},
            },
            _preload_content=False,
        )
        self.log.warning(
            "machine cordoned",
            fields={"node": node, "machine": machine, "reason": reason},
        )

    def uncordon(self, node: str) -> None:
        machine = self.machine_of(node)
        if machine is None:
            return
        current = _json(self.core.read_node(machine, _preload_content=False))
        taints = [t for t in (current.get("spec") or {}).get("taints") or [] if t.get("key") != names.CORDON_TAINT]
        self.core.patch_node(
            machine,
            {
                "metadata": {
                    "labels": {names.CORDON_LABEL: None},
                    "annotations": {names.CORDON_REASON_ANNOTATION: None},
                },
                "spec": {"taints": taints},
            },
            _preload_content=False,
        )
        self.log.info("machine uncordoned", fields={"node": node, "machine": machine})

    def close(self) -> None:
        self.pods.close()


def _node_of(pod: Mapping[str, Any]) -> str | None:
    return ((pod.get("metadata") or {}).get("labels") or {}).get(names.NODE_LABEL)


def _unschedulable(pod: Mapping[str, Any]) -> bool:
    return any(
        c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable"
        for c in (pod.get("status") or {}).get("conditions") or []
    )


def _age_key(pod: dict[str, Any]) -> tuple[str, bool]:
    """Newer pods sort last: created later, or not terminating where both were created alike."""
    meta = pod["metadata"]
    return (str(meta.get("creationTimestamp") or ""), not meta.get("deletionTimestamp"))


def _json(response: Any) -> dict[str, Any]:
    """Raw JSON of a `_preload_content=False` call: plain dicts, as the API server sent them."""
    return json.loads(response.data)
