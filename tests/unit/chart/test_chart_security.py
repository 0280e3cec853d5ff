"""The secure-by-default check (issue 16): every pod the chart renders (for every value set the chart
tests use) and every pod the operator makes from the repository's example TrainingJobs runs non-root,
without privilege escalation or capabilities, under the runtime's seccomp profile, with limits;
NetworkPolicies cover every component; etcd speaks TLS and checks client certificates, and the
certificates the chart generates really work against a real etcd."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.chart import NAMESPACE, VALUE_SETS, render
from support.paths import REPO

from stalwart.spec import parse_job
from stalwart.store import Store, StoreUnavailable
from stalwart.store.etcd_auth import CA_ENV, CERT_ENV, KEY_ENV, EtcdAuth
from stalwart.store.etcd_server import EtcdServer, ServerTLS
from stalwart_operator import pods
from stalwart_operator.config import OperatorConfig

WORKLOADS = {"Deployment", "StatefulSet", "DaemonSet", "Job", "CronJob", "Pod"}
EXAMPLES = sorted((REPO / "examples" / "k8s").glob("*.yaml"))
TLS_FLAGS = ("--cert-file", "--key-file", "--trusted-ca-file", "--peer-cert-file", "--peer-key-file")


def pod_spec(doc: dict[str, Any]) -> dict[str, Any]:
    if doc["kind"] == "Pod":
        return doc["spec"]  # type: ignore[no-any-return]
    if doc["kind"] == "CronJob":
        return doc["spec"]["jobTemplate"]["spec"]["template"]["spec"]  # type: ignore[no-any-return]
    return doc["spec"]["template"]["spec"]  # type: ignore[no-any-return]


def confinement_problems(where: str, spec: dict[str, Any], *, cpu_limit: bool = True) -> list[str]:
    """What keeps a pod from passing: each problem names the pod and the field."""
    problems: list[str] = []
    pod = spec.get("securityContext") or {}
    if pod.get("seccompProfile", {}).get("type") != "RuntimeDefault":
        problems.append(f"{where}: securityContext.seccompProfile is not RuntimeDefault")
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(field):
            problems.append(f"{where}: {field}")
    for container in [*spec.get("initContainers", []), *spec["containers"]]:
        name = f"{where} container {container['name']}"
        ctx = container.get("securityContext") or {}
        non_root = ctx.get("runAsNonRoot", pod.get("runAsNonRoot"))
        uid = ctx.get("runAsUser", pod.get("runAsUser"))
        if non_root is not True or uid == 0:
            problems.append(f"{name}: may run as root (runAsNonRoot {non_root}, runAsUser {uid})")
        if ctx.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{name}: allowPrivilegeEscalation is not false")
        if ctx.get("privileged"):
            problems.append(f"{name}: privileged")
        if "ALL" not in (ctx.get("capabilities") or {}).get("drop", []):
            problems.append(f"{name}: capabilities are not dropped (drop: [ALL])")
        limits = (container.get("resources") or {}).get("limits") or {}
        for resource in ("cpu", "memory") if cpu_limit else ("memory",):
            if resource not in limits:
                problems.append(f"{name}: no {resource} limit")
    return problems


def selected_by(policy: dict[str, Any], labels: dict[str, str]) -> bool:
    wanted = policy["spec"]["podSelector"].get("matchLabels", {})
    return all(labels.get(k) == v for k, v in wanted.items())


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_every_rendered_pod_runs_confined_with_limits_behind_a_network_policy(name: str) -> None:
    docs = render(VALUE_SETS[name])
    workloads = [d for d in docs if d["kind"] in WORKLOADS]
    assert workloads
    problems = [p for d in workloads for p in confinement_problems(f"{d['kind']} {d['metadata']['name']}", pod_spec(d))]
    assert problems == []
    policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
    for doc in workloads:
        labels = (doc if doc["kind"] == "Pod" else doc["spec"]["template"])["metadata"]["labels"]
        covering = [p for p in policies if p["metadata"]["namespace"] == doc["metadata"]["namespace"]]
        assert any(selected_by(p, labels) for p in covering), f"no NetworkPolicy selects {doc['metadata']['name']}"
    for policy in policies:
        assert policy["spec"]["policyTypes"] == ["Ingress"], policy["metadata"]["name"]
        # Every policy lets someone in, but the `helm test` pod's, which serves nothing.
        assert policy["spec"].get("ingress") or policy["metadata"]["name"].endswith("-test"), policy["metadata"]["name"]
    # Each namespace the operator serves has a policy for the jobs' node pods.
    served = VALUE_SETS[name].get("operator", {}).get("namespaces", [])
    job_pods = {"app.kubernetes.io/managed-by": "stalwart-operator"}
    for namespace in served:
        assert [p for p in policies if p["metadata"]["namespace"] == namespace and selected_by(p, job_pods)]


def etcd_members(docs: list[dict[str, Any]]) -> dict[str, Any]:
    [etcd] = [d for d in docs if d["kind"] == "StatefulSet"]
    return etcd  # type: ignore[no-any-return]


def test_who_may_reach_etcd() -> None:
    docs = render(VALUE_SETS["monitored-with-console"])
    [policy] = [d for d in docs if d["kind"] == "NetworkPolicy" and d["metadata"]["name"] == "stalwart-etcd"]
    [clients] = [rule["from"] for rule in policy["spec"]["ingress"] if rule["ports"][0]["port"] == 2379]
    components = {peer["podSelector"]["matchLabels"].get("app.kubernetes.io/component") for peer in clients}
    assert components == {"operator", "diagnosis", "console", "etcd", "test", None}  # None: the jobs' node pods
    [jobs] = [peer for peer in clients if "namespaceSelector" in peer]
    assert jobs["namespaceSelector"]["matchExpressions"][0]["values"] == ["ml", "research"]
    [peers] = [rule["from"] for rule in policy["spec"]["ingress"] if rule["ports"][0]["port"] == 2380]
    assert [p["podSelector"]["matchLabels"]["app.kubernetes.io/component"] for p in peers] == ["etcd"]


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_every_etcd_client_presents_the_client_certificate(name: str) -> None:
    docs = render(VALUE_SETS[name])
    client_secret = VALUE_SETS[name].get("etcd", {}).get("tls", {}).get("clientSecret") or "stalwart-etcd-client"
    for doc in [d for d in docs if d["kind"] == "Deployment"]:
        spec = pod_spec(doc)
        [container] = spec["containers"]
        env = {e["name"]: e.get("value") for e in container.get("env", [])}
        mounts = {m["name"]: m["mountPath"] for m in container.get("volumeMounts", [])}
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        assert volumes["etcd-tls"]["secret"]["secretName"] == client_secret, doc["metadata"]["name"]
        for variable, file in ((CA_ENV, "ca.crt"), (CERT_ENV, "tls.crt"), (KEY_ENV, "tls.key")):
            assert env[variable] == f"{mounts['etcd-tls']}/{file}", (doc["metadata"]["name"], variable)
        if container["name"] == "operator":  # and hands the Secret's name on to the jobs' node pods
            assert env["STALWART_ETCD_CLIENT_SECRET"] == client_secret
    if VALUE_SETS[name].get("etcd", {}).get("mode") != "external":
        command = etcd_members(docs)["spec"]["template"]["spec"]["containers"][0]["command"]
        assert "--client-cert-auth" in command and "--peer-client-cert-auth" in command
        assert not [c for c in command if c.startswith(("--listen-client-urls=http:", "--listen-peer-urls=http:"))]


def test_narrowed_rbac_keeps_pods_and_services_out_of_the_cluster_role() -> None:
    docs = render(VALUE_SETS["monitored-with-console"])
    [cluster] = [d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "stalwart-operator"]
    assert not {"pods", "services", "trainingjobs", "events"} & {
        r for rule in cluster["rules"] for r in rule["resources"]
    }
    roles = {d["metadata"]["namespace"] for d in docs if d["kind"] == "Role"}
    bindings = {d["metadata"]["namespace"] for d in docs if d["kind"] == "RoleBinding"}
    assert roles == bindings == {"ml", "research"}
    [wide] = [d for d in render() if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "stalwart-operator"]
    assert "pods" in {r for rule in wide["rules"] for r in rule["resources"]}
    assert not [d for d in render() if d["kind"] in ("Role", "RoleBinding")]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"etcd": {"tls": {"enabled": False}}}, "etcd.auth.enabled needs etcd.tls.enabled"),
        ({"etcd": {"mode": "external", "external": {"endpoint": "e.infra:2379"}}}, "etcd.tls.clientSecret"),
        ({"etcd": {"tls": {"serverSecret": "mine"}}}, "give both"),
    ],
)
def test_inconsistent_etcd_security_is_refused_naming_the_value(values: dict[str, Any], message: str) -> None:
    from helm_python import Chart
    from helm_python.errors import HelmError

    with Chart.load(REPO / "charts" / "stalwart") as chart, pytest.raises(HelmError) as refused:
        chart.render(values=values, name="stalwart", namespace=NAMESPACE)
    assert message in str(refused.value), str(refused.value)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_the_example_jobs_pods_run_confined_with_limits(path: Path) -> None:
    """The node pods the operator makes from the examples, as the default chart configures it."""
    config = OperatorConfig(etcd="stalwart-etcd.stalwart.svc:2379", etcd_client_secret="stalwart-etcd-client")
    problems: list[str] = []
    for doc in [d for d in yaml.safe_load_all(path.read_text()) if d and d["kind"] == "TrainingJob"]:
        job = parse_job(doc)
        for role in job.spec.roles:
            pod = pods.node_pod(
                job, namespace="ml", job_id="ml.x", node="node-0", role=role, owner_uid="u", config=config, total_pods=1
            )
            # A training pod's CPU is the node's: only memory is required to be bounded.
            problems += confinement_problems(f"{path.name} role {role.name}", pod["spec"], cpu_limit=False)
    assert problems == []


def write_secret(doc: dict[str, Any], folder: Path) -> dict[str, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    files = {}
    for key, value in doc["data"].items():
        files[key] = folder / key
        files[key].write_bytes(base64.b64decode(value))
    return files


@pytest.fixture(scope="module")
def chart_etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[EtcdServer, dict[str, Path]]]:
    """A real etcd with the members' certificate the chart generates, started with the chart's TLS flags."""
    docs = render()
    secrets = {
        d["metadata"]["name"]: d for d in docs if d["kind"] == "Secret" and d["metadata"]["namespace"] == NAMESPACE
    }
    tmp = tmp_path_factory.mktemp("chart-pki")
    server = write_secret(secrets["stalwart-etcd-server"], tmp / "server")
    client = write_secret(secrets["stalwart-etcd-client"], tmp / "client")
    tls = ServerTLS(ca=server["ca.crt"], cert=server["tls.crt"], key=server["tls.key"], client_cert_auth=True)
    auth = EtcdAuth(ca=client["ca.crt"], cert=client["tls.crt"], key=client["tls.key"])
    etcd = EtcdServer(tmp / "data", tls=tls, client=auth)
    chart_flags = {c.split("=")[0] for c in etcd_members(docs)["spec"]["template"]["spec"]["containers"][0]["command"]}
    ours = {a.split("=")[0] for a in etcd.argv()}
    assert {f for f in chart_flags if "cert" in f or "key" in f or "ca" in f} == {
        f for f in ours if "cert" in f or "key" in f or "ca" in f
    }  # the harness starts etcd as the chart does
    assert set(TLS_FLAGS) <= chart_flags
    with etcd:
        yield etcd, client


def test_the_generated_certificates_let_stalwart_in_and_keep_others_out(
    chart_etcd: tuple[EtcdServer, dict[str, Path]],
) -> None:
    etcd, client = chart_etcd
    store = Store(
        etcd.endpoint, timeout=2.0, auth=EtcdAuth(ca=client["ca.crt"], cert=client["tls.crt"], key=client["tls.key"])
    )
    try:
        store.put("/stalwart/v1/probe", "ok")
        assert store.get_raw("/stalwart/v1/probe") == b"ok"
    finally:
        store.close()
    for auth in (EtcdAuth(), EtcdAuth(ca=client["ca.crt"])):
        intruder = Store(etcd.endpoint, timeout=2.0, auth=auth)
        try:
            with pytest.raises(StoreUnavailable):
                intruder.get_raw("/stalwart/v1/probe")
        finally:
            intruder.close()
