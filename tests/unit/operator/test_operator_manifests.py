"""Every manifest the chart installs or the operator makes validates against the Kubernetes schemas
(kubernetes-validate, no cluster), and the pods carry what the agent and the scheduler need.
(The chart's own value sets and schema: tests/unit/chart/test_chart.py.)"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from support.chart import render
from support.paths import REPO

from stalwart.spec import ALLOWED_PATHS_ENV, SpecError, parse_job
from stalwart.store.credentials import DIAGNOSIS_TOKEN_ENV, JOB_TOKEN_ENV
from stalwart.store.etcd_auth import ENV_NAMES as ETCD_ENV_NAMES
from stalwart_operator import names, pods
from stalwart_operator.config import OperatorConfig

K8S_VERSION = "1.30"
EXAMPLES = sorted((REPO / "examples" / "k8s").glob("*.yaml"))
CONFIG = OperatorConfig(etcd="etcd.stalwart-system.svc:2379")


def documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


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
    # Settings, the etcd client's, and the diagnosis service's token (from its Secret) for the
    # controllers it hosts.
    allowed = {"STALWART_" + f.upper() for f in OperatorConfig.model_fields} | set(ETCD_ENV_NAMES)
    assert set(env) - {DIAGNOSIS_TOKEN_ENV} <= allowed


def test_the_cluster_role_grants_no_more_than_needed() -> None:
    [role] = [d for d in render() if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "stalwart-operator"]
    granted = {
        (g, r, v) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]
    }
    assert not any(v in ("*", "escalate", "bind", "impersonate") or r == "*" for _, r, v in granted)
    # The job's token Secret is written and deleted; no Secret is ever read.
    assert {v for _, r, v in granted if r == "secrets"} == {"create", "patch", "delete"}
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


def node_pod(j: Any, config: OperatorConfig = CONFIG) -> dict[str, Any]:
    return pods.node_pod(
        j,
        namespace="ml",
        job_id="ml.demo",
        node="node-3",
        role=j.spec.roles[0],
        owner_uid="u-1",
        config=config,
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
    env = {e["name"]: e.get("value") or e["valueFrom"] for e in container["env"]}
    assert env["STALWART_JOB"] == "ml.demo" and env["STALWART_NODE"] == "node-3"
    assert env["STALWART_ETCD"] == CONFIG.etcd and env["STALWART_MACHINE"] == {
        "fieldRef": {"fieldPath": "spec.nodeName"}
    }
    # The agent's services listen on the pod's address; the job's token comes from its Secret.
    assert env["STALWART_NODE_ADDRESS"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert "STALWART_METRICS_HOST" not in env and ALLOWED_PATHS_ENV not in env
    assert env[JOB_TOKEN_ENV] == {"secretKeyRef": {"name": "demo-stalwart-token", "key": "token"}}
    args = container["args"]
    assert args[args.index("--job") + 1] == "$(STALWART_JOB)" and "--job-dir" in args
    configured = pods.node_pod(
        job(),
        namespace="ml",
        job_id="ml.demo",
        node="node-3",
        role=job().spec.roles[0],
        owner_uid="u-1",
        config=CONFIG.model_copy(update={"allowed_paths": ["/data", "/ckpt"], "agent_metrics_host": "10.0.0.1"}),
        total_pods=6,
    )
    env = {e["name"]: e.get("value") for e in configured["spec"]["containers"][0]["env"]}
    assert env[ALLOWED_PATHS_ENV] == "/data:/ckpt" and env["STALWART_METRICS_HOST"] == "10.0.0.1"


def test_the_job_token_secret_validates() -> None:
    secret = pods.job_token_secret(job(), namespace="ml", owner_uid="u-1", token="t" * 43)
    validate(secret)
    assert secret["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    assert base64.b64decode(secret["data"]["token"]) == b"t" * 43


def test_a_role_template_is_merged_over_the_operators_pod() -> None:
    """Kubernetes' own shapes, added to (lists) or replacing (the rest) what the operator sets; the
    operator's labels, env, volumes and cordon affinity stay."""
    j = job(tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}])
    template = {
        "metadata": {"labels": {"team": "llm"}, "annotations": {"example.com/cost-center": "42"}},
        "spec": {
            "serviceAccountName": "trainer",
            "imagePullSecrets": [{"name": "registry"}],
            "hostNetwork": True,
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]}]}
                        ]
                    }
                },
                "podAntiAffinity": {
                    "preferredDuringSchedulingIgnoredDuringExecution": [
                        {
                            "weight": 10,
                            "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname", "labelSelector": {}},
                        }
                    ]
                },
            },
            "tolerations": [{"key": "rdma", "operator": "Exists"}],
            "topologySpreadConstraints": [
                {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "ScheduleAnyway"}
            ],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "datasets"}}],
            "securityContext": {"fsGroup": 1000},
            "containers": [
                {
                    "name": "agent",
                    "env": [
                        {"name": "AWS_ACCESS_KEY_ID", "valueFrom": {"secretKeyRef": {"name": "s3", "key": "id"}}},
                        {"name": "NCCL_DEBUG", "value": "WARN"},
                    ],
                    "envFrom": [{"configMapRef": {"name": "nccl-tuning"}}],
                    "volumeMounts": [{"name": "data", "mountPath": "/data", "readOnly": True}],
                    "resources": {
                        "limits": {"rdma/hca_shared_devices_a": 1, "vpc.amazonaws.com/efa": 4, "memory": "900Gi"}
                    },
                    "securityContext": {"capabilities": {"add": ["SYS_PTRACE", "IPC_LOCK"]}},
                }
            ],
        },
    }
    doc = j.model_dump(mode="json", by_alias=True)
    doc["spec"]["roles"][0]["template"] = template
    with_template = parse_job(doc)
    assert pods.template_problems(with_template, CONFIG) == []
    pod = node_pod(with_template)
    validate(pod)
    meta, spec = pod["metadata"], pod["spec"]
    assert meta["labels"]["team"] == "llm" and meta["labels"][names.JOB_LABEL] == "demo"
    assert meta["annotations"] == {"example.com/cost-center": "42"}
    assert spec["serviceAccountName"] == "trainer" and spec["imagePullSecrets"] == [{"name": "registry"}]
    assert spec["hostNetwork"] is True and spec["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert spec["automountServiceAccountToken"] is False  # unless the template asks for the token
    [term] = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term["matchExpressions"] == [
        {"key": "zone", "operator": "In", "values": ["a", "b"]},
        {"key": names.CORDON_LABEL, "operator": "DoesNotExist"},  # still off cordoned machines
    ]
    assert "podAntiAffinity" in spec["affinity"]
    assert [t["key"] for t in spec["tolerations"]] == ["nvidia.com/gpu", "rdma"]
    assert [v["name"] for v in spec["volumes"]] == ["workdir", "dshm", "data"]
    assert spec["securityContext"] == {**pods.pod_security(CONFIG), "fsGroup": 1000}  # key by key, theirs win
    [container] = spec["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert env["AWS_ACCESS_KEY_ID"]["valueFrom"]["secretKeyRef"] == {"name": "s3", "key": "id"}
    assert env["STALWART_JOB"]["value"] == "ml.demo" and env["NCCL_DEBUG"]["value"] == "WARN"
    assert container["envFrom"] == [{"configMapRef": {"name": "nccl-tuning"}}]
    assert [m["mountPath"] for m in container["volumeMounts"]] == [CONFIG.pod_workdir, "/dev/shm", "/data"]
    limits = container["resources"]["limits"]
    assert limits == {
        "memory": "900Gi",
        "nvidia.com/gpu": "8",
        "rdma/hca_shared_devices_a": 1,
        "vpc.amazonaws.com/efa": 4,
    }
    assert container["resources"]["requests"]["cpu"] == "96"
    assert container["securityContext"] == {  # what the template adds, over the operator's defaults
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"], "add": ["SYS_PTRACE", "IPC_LOCK"]},
    }


def test_node_pods_are_confined_and_get_etcds_client_certificate() -> None:
    config = CONFIG.model_copy(update={"etcd_client_secret": "stalwart-etcd-client"})
    pod = node_pod(job(), config)
    validate(pod)
    spec = pod["spec"]
    assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] == 1000
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    [container] = spec["containers"]
    assert container["securityContext"] == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["STALWART_ETCD_CA"] == f"{pods.ETCD_TLS_PATH}/ca.crt"
    assert env["STALWART_ETCD_CERT"] == f"{pods.ETCD_TLS_PATH}/tls.crt"
    assert env["STALWART_ETCD_KEY"] == f"{pods.ETCD_TLS_PATH}/tls.key"
    [volume] = [v for v in spec["volumes"] if v["name"] == pods.ETCD_TLS_VOLUME]
    assert volume["secret"]["secretName"] == "stalwart-etcd-client"
    assert {"name": pods.ETCD_TLS_VOLUME, "mountPath": pods.ETCD_TLS_PATH, "readOnly": True} in container[
        "volumeMounts"
    ]
    plain = node_pod(job())
    assert not [e for e in plain["spec"]["containers"][0]["env"] if e["name"].startswith("STALWART_ETCD_")]


def test_a_template_may_not_take_the_operators_names() -> None:
    doc = job().model_dump(mode="json", by_alias=True)
    doc["spec"]["roles"][0]["template"] = {
        "spec": {
            "volumes": [{"name": "dshm", "emptyDir": {}}],
            "containers": [
                {
                    "name": "agent",
                    "env": [
                        {"name": "STALWART_ETCD", "value": "elsewhere:2379"},
                        {"name": "STALWART_JOB_TOKEN", "value": "guessed"},
                        {"name": "LD_PRELOAD", "value": "/x.so"},
                        {"name": "RANK", "value": "0"},
                        {"name": "NCCL_DEBUG", "value": "INFO"},
                    ],
                    "volumeMounts": [{"name": "missing", "mountPath": "/dev/shm"}],
                }
            ],
        }
    }
    problems = pods.template_problems(parse_job(doc), CONFIG)
    assert any("'dshm' is the operator's" in p for p in problems)
    assert any("STALWART_ETCD is set by the operator" in p for p in problems)
    assert any("STALWART_JOB_TOKEN is set by the operator" in p for p in problems)
    assert any("LD_PRELOAD would change what the dynamic loader loads" in p for p in problems)
    assert any("RANK is set by the platform" in p for p in problems)
    assert not any("NCCL_DEBUG" in p for p in problems)  # the job's own variables are fine
    assert any("/dev/shm is the operator's" in p for p in problems)
    assert any("no volume named 'missing'" in p for p in problems)
    doc["spec"]["roles"][0]["template"] = {"metadata": {"labels": {"stalwart.dev/job": "other"}}}
    with pytest.raises(SpecError, match="stalwart.dev/ are the operator's"):
        parse_job(doc)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_the_pods_of_every_example_validate(path: Path) -> None:
    for document in documents(path):
        if document["kind"] != names.KIND:
            continue
        j = parse_job(document)
        assert pods.template_problems(j, CONFIG) == []
        for i, role in enumerate(j.spec.roles):
            validate(
                pods.node_pod(
                    j,
                    namespace="ml",
                    job_id="ml.x",
                    node=f"node-{i}",
                    role=role,
                    owner_uid="u-1",
                    config=CONFIG,
                    total_pods=j.spec.node_count,
                )
            )


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
