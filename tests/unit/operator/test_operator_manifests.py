"""Every manifest the chart installs or the operator makes validates against the Kubernetes schemas
(kubernetes-validate, no cluster), and the pods carry what the agent and the scheduler need.
(The chart's own value sets and schema: tests/unit/chart/test_chart.py.)"""

from __future__ import annotations

from typing import Any

import kubernetes_validate
from support.chart import render

from stalwart.spec import parse_job
from stalwart_operator import names, pods
from stalwart_operator.config import OperatorConfig

K8S_VERSION = "1.30"
CONFIG = OperatorConfig(etcd="etcd.stalwart-system.svc:2379")


def validate(document: dict[str, Any]) -> None:
    kubernetes_validate.validate(document, K8S_VERSION, strict=True)


def test_the_install_set_is_complete() -> None:
    installed = render()
    kinds = {(d["kind"], d["metadata"]["name"]) for d in installed}
    assert {
        ("CustomResourceDefinition", names.CRD_NAME),
        ("ServiceAccount", "stalwart-operator"),
        ("ClusterRole", "stalwart-operator"),
        ("ClusterRoleBinding", "stalwart-operator"),
        ("Deployment", "stalwart-operator"),
        ("StatefulSet", "stalwart-etcd"),
        ("Service", "stalwart-etcd"),
    } <= kinds
    [deployment] = [d for d in installed if d["kind"] == "Deployment" and d["metadata"]["name"] == "stalwart-operator"]
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "stalwart-operator" and deployment["spec"]["replicas"] == 2
    env = {e["name"] for e in pod["containers"][0]["env"]}
    assert {"STALWART_ETCD", "STALWART_IDENTITY"} <= env
    assert set(env) <= {"STALWART_" + f.upper() for f in OperatorConfig.model_fields}


def test_the_cluster_role_grants_no_more_than_needed() -> None:
    [role] = [d for d in render() if d["kind"] == "ClusterRole"]
    granted = {
        (g, r, v) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]
    }
    assert not any(v in ("*", "escalate", "bind", "impersonate") or r in ("*", "secrets") for _, r, v in granted)
    assert ("", "pods", "create") in granted and ("", "nodes", "patch") in granted
    assert ("stalwart.dev", "trainingjobs/status", "patch") in granted
    assert not any(r == "nodes" and v in ("create", "delete") for _, r, v in granted)


def job(**scheduling: Any) -> Any:
    return parse_job(
        {
            "apiVersion": "stalwart.dev/v1alpha1",
            "kind": "TrainingJob",
            "metadata": {"name": "demo"},
            "spec": {
                "roles": [
                    {
                        "name": "trainer",
                        "replicas": 4,
                        "processesPerNode": 8,
                        "command": ["python", "t.py"],
                        "image": "registry.example/train:1",
                        "env": {"MODE": "x"},
                        "resources": {"gpus": 8, "cpu": "96", "memory": "1000Gi"},
                    }
                ],
                "standbys": {"count": 2},
                "scheduling": scheduling,
            },
        }
    )


def node_pod(j: Any) -> dict[str, Any]:
    return pods.node_pod(
        j,
        namespace="ml",
        job_id="ml.demo",
        node="node-3",
        role=j.spec.roles[0],
        owner_uid="u-1",
        config=CONFIG,
        total_pods=6,
    )


def test_a_node_pod_runs_the_agent_with_gpus_and_the_job_environment() -> None:
    pod = node_pod(
        job(
            nodeSelector={"gpu": "h100"},
            priorityClassName="high",
            tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        )
    )
    validate(pod)
    meta, spec = pod["metadata"], pod["spec"]
    assert meta["name"] == "demo-node-3" and meta["namespace"] == "ml"
    assert meta["labels"][names.JOB_LABEL] == "demo" and meta["labels"][names.NODE_LABEL] == "node-3"
    assert meta["ownerReferences"] == [
        {
            "apiVersion": "stalwart.dev/v1alpha1",
            "kind": "TrainingJob",
            "name": "demo",
            "uid": "u-1",
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    assert spec["restartPolicy"] == "Never" and spec["hostname"] == "node-3" and spec["subdomain"] == "demo"
    assert spec["nodeSelector"] == {"gpu": "h100"} and spec["priorityClassName"] == "high"
    assert spec["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    [term] = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term["matchExpressions"] == [{"key": names.CORDON_LABEL, "operator": "DoesNotExist"}]
    [container] = spec["containers"]
    assert container["image"] == "registry.example/train:1"
    assert container["command"] == ["python", "-m", "stalwart.cli.main", "agent"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert container["resources"]["requests"] == {
        "cpu": "96",
        "memory": "1000Gi",
        "nvidia.com/gpu": "8",
    }
    env = {e["name"]: e.get("value") or e["valueFrom"]["fieldRef"]["fieldPath"] for e in container["env"]}
    assert env["STALWART_JOB"] == "ml.demo" and env["STALWART_NODE"] == "node-3"
    assert env["STALWART_ETCD"] == CONFIG.etcd and env["STALWART_MACHINE"] == "spec.nodeName"
    args = container["args"]
    assert args[args.index("--job") + 1] == "$(STALWART_JOB)" and "--job-dir" in args


def test_gang_scheduling_with_volcano() -> None:
    j = job(schedulerName="volcano", queue="research")
    pod = node_pod(j)
    validate(pod)
    assert pod["spec"]["schedulerName"] == "volcano"
    assert pod["metadata"]["annotations"] == {
        names.VOLCANO_GROUP_ANNOTATION: "demo",
        names.VOLCANO_QUEUE_ANNOTATION: "research",
    }
    group = pods.volcano_podgroup(j, namespace="ml", owner_uid="u-1")
    assert group is not None and group["kind"] == "PodGroup"
    assert group["spec"] == {"minMember": 4, "queue": "research"}
    assert pods.volcano_podgroup(job(), namespace="ml", owner_uid="u-1") is None


def test_gang_admission_with_kueue() -> None:
    pod = node_pod(job(queue="team-a"))
    validate(pod)
    assert pod["metadata"]["labels"][names.KUEUE_QUEUE_LABEL] == "team-a"
    assert pod["metadata"]["labels"][names.KUEUE_GROUP_LABEL] == "demo"
    assert pod["metadata"]["annotations"][names.KUEUE_GROUP_COUNT_ANNOTATION] == "6"
    assert "schedulerName" not in pod["spec"]


def test_the_headless_service_validates() -> None:
    service = pods.headless_service(job(), namespace="ml", owner_uid="u-1", config=CONFIG)
    validate(service)
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is True
    assert service["spec"]["selector"] == {
        names.JOB_LABEL: "demo",
        names.JOB_NAMESPACE_LABEL: "ml",
    }
    assert names.service_name("7up") == "tj-7up"  # Service names must start with a letter
