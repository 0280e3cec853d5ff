"""The Helm chart: lints, renders offline (helm-python-sdk, the Helm v4 SDK) for the default values
and other value sets, every rendered manifest passes `kubernetes-validate --strict`, and bad values
are refused by values.schema.json with a message naming the value."""

from __future__ import annotations

import base64
import json
from typing import Any

import kubernetes_validate
import pytest
import yaml
from support.chart import CHART, VALUE_SETS, notes, render

from stalwart.store.credentials import DIAGNOSIS_TOKEN_ENV
from stalwart.store.etcd_auth import ENV_NAMES as ETCD_ENV_NAMES
from stalwart_operator.config import OperatorConfig

K8S_VERSION = "1.30"
PROMETHEUS_OPERATOR = "monitoring.coreos.com/v1"  # its CRDs are not in kubernetes-validate's schemas


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def test_the_chart_lints_clean() -> None:
    from helm_python import lint

    report = lint(CHART, strict=True, kube_version="v1.30.0")
    assert report["errors"] == [], report
    assert not [m for m in report["messages"] if m["severity"] >= 2], report["messages"]


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_every_rendered_manifest_validates_strictly(name: str) -> None:
    docs = render(VALUE_SETS[name])
    assert docs
    for doc in docs:
        if doc["apiVersion"] == PROMETHEUS_OPERATOR:
            assert doc["spec"], doc["kind"]  # checked field by field below
            continue
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_the_default_install() -> None:
    docs = render()
    [operator] = [d for d in by_kind(docs, "Deployment") if d["metadata"]["name"] == "stalwart-operator"]
    assert operator["spec"]["replicas"] == 2
    env = {e["name"]: e.get("value") for e in operator["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["STALWART_ETCD"] == "stalwart-etcd.stalwart.svc:2379"
    assert env["STALWART_DIAGNOSIS_URL"] == "http://stalwart-diagnosis.stalwart.svc:8470"
    # Settings, the etcd client's, and the diagnosis service's token (from its Secret) for the
    # controllers it hosts.
    allowed = {"STALWART_" + f.upper() for f in OperatorConfig.model_fields} | set(ETCD_ENV_NAMES)
    assert set(env) - {DIAGNOSIS_TOKEN_ENV} <= allowed
    OperatorConfig.from_env({k: v for k, v in env.items() if v is not None})  # the operator accepts them
    [etcd] = by_kind(docs, "StatefulSet")
    assert etcd["spec"]["replicas"] == 3
    command = etcd["spec"]["template"]["spec"]["containers"][0]["command"]
    [cluster] = [c for c in command if c.startswith("--initial-cluster=")]
    assert cluster.count("=https://") == 3 and "stalwart-etcd-2=https://stalwart-etcd-2.stalwart-etcd-peers" in cluster
    [diagnosis] = [d for d in by_kind(docs, "Deployment") if d["metadata"]["name"] == "stalwart-diagnosis"]
    assert diagnosis["spec"]["template"]["spec"]["containers"][0]["command"][-1] == "stalwart.diagnosis.service"
    assert not [d for d in docs if "console" in d["metadata"]["name"]]  # off by default
    [dashboard] = by_kind(docs, "ConfigMap")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(dashboard["data"]["stalwart.json"]) == json.loads(
        (CHART / "dashboards" / "stalwart.json").read_text()
    )
    assert not [d for d in docs if d["apiVersion"] == PROMETHEUS_OPERATOR]


def test_monitoring_objects_and_the_console() -> None:
    docs = render(VALUE_SETS["monitored-with-console"])
    [rule] = by_kind(docs, "PrometheusRule")
    shipped = yaml.safe_load((CHART / "files" / "alerts.yaml").read_text())
    assert [g["name"] for g in rule["spec"]["groups"]] == [g["name"] for g in shipped["groups"]]
    urls = [r["annotations"]["runbook_url"] for g in rule["spec"]["groups"] for r in g["rules"]]
    assert urls and all(u.startswith("https://git.example/stalwart/blob/main/runbooks/") for u in urls)
    [monitor] = by_kind(docs, "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus"
    assert {e["port"] for e in monitor["spec"]["endpoints"]} == {"metrics", "http"}
    [pods] = by_kind(docs, "PodMonitor")
    assert pods["spec"]["selector"]["matchLabels"] == {"app.kubernetes.io/managed-by": "stalwart-operator"}
    assert pods["spec"]["namespaceSelector"] == {"matchNames": ["ml", "research"]}
    [console] = [d for d in by_kind(docs, "Deployment") if d["metadata"]["name"] == "stalwart-console"]
    container = console["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["stalwart", "console"] and "--port=8480" in container["args"]


def test_the_diagnosis_token_reaches_the_service_and_its_callers_only() -> None:
    """One Secret (made by the chart, or named in diagnosis.tokenSecret) feeds the service, the
    operator (its controllers send it) and the console; the service listens on its pod's IP."""
    token_ref = {"name": "STALWART_DIAGNOSIS_TOKEN", "valueFrom": {"secretKeyRef": {"name": "", "key": "token"}}}
    for values, secret in (
        ({"console": {"enabled": True}}, "stalwart-diagnosis-token"),
        ({"console": {"enabled": True}, "diagnosis": {"tokenSecret": "mine"}}, "mine"),
    ):
        docs = render(values)
        made = [d for d in by_kind(docs, "Secret") if d["metadata"]["name"] == "stalwart-diagnosis-token"]
        assert len(made) == (secret == "stalwart-diagnosis-token")
        if made:
            assert len(base64.b64decode(made[0]["data"]["token"])) == 48
        expected = {**token_ref, "valueFrom": {"secretKeyRef": {"name": secret, "key": "token"}}}
        for name in ("stalwart-diagnosis", "stalwart-operator", "stalwart-console"):
            [deployment] = [d for d in by_kind(docs, "Deployment") if d["metadata"]["name"] == name]
            container = deployment["spec"]["template"]["spec"]["containers"][0]
            assert expected in container["env"], name
        [service] = [d for d in by_kind(docs, "Deployment") if d["metadata"]["name"] == "stalwart-diagnosis"]
        container = service["spec"]["template"]["spec"]["containers"][0]
        assert "--host=$(POD_IP)" in container["args"]
        assert {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}} in container["env"]
    assert not by_kind(render(VALUE_SETS["external-etcd-minimal"]), "Secret")  # no service, no token


def test_an_external_etcd_replaces_the_bundled_one() -> None:
    docs = render(VALUE_SETS["external-etcd-minimal"])
    assert not by_kind(docs, "StatefulSet") and not by_kind(docs, "ConfigMap")
    [operator] = by_kind(docs, "Deployment")
    env = {e["name"]: e.get("value") for e in operator["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["STALWART_ETCD"] == "etcd.infra.svc:2379" and "STALWART_DIAGNOSIS_URL" not in env
    assert operator["spec"]["replicas"] == 3
    assert "etcd.infra.svc:2379 (external)" in notes(VALUE_SETS["external-etcd-minimal"])


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"etcd": {"replicas": 2}}, "/etcd/replicas"),
        ({"etcd": {"mode": "external"}}, "/etcd/external/endpoint"),
        ({"etcd": {"mode": "cloud"}}, "/etcd/mode"),
        ({"operator": {"replicas": 0}}, "/operator/replicas"),
        ({"operator": {"jobMetricsPort": 70000}}, "/operator/jobMetricsPort"),
        ({"operator": {"replicaz": 2}}, "replicaz"),
        ({"image": {"pullPolicy": "Sometimes"}}, "/image/pullPolicy"),
        ({"monitoring": {"prometheusRule": {"runbookBaseUrl": "git.example"}}}, "runbookBaseUrl"),
        ({"networkPolicy": {"enabled": "yes"}}, "/networkPolicy/enabled"),
        ({"etcd": {"resources": {"limits": None}}}, "/etcd/resources"),
        ({"console": {"resources": {"limits": {"cpu": None}}}}, "/console/resources/limits"),
        ({"podSecurityContext": {"runAsNonRoot": False}}, "/podSecurityContext/runAsNonRoot"),
        ({"containerSecurityContext": {"allowPrivilegeEscalation": True}}, "/containerSecurityContext"),
        ({"jobPods": {"runAsUser": 0}}, "/jobPods/runAsUser"),
        ({"etcd": {"tls": {"clientSecret": "Bad_Name"}}}, "/etcd/tls/clientSecret"),
    ],
)
def test_bad_values_are_refused_with_a_message_naming_them(values: dict[str, Any], message: str) -> None:
    from helm_python import Chart
    from helm_python.errors import HelmValuesError

    with Chart.load(CHART) as chart, pytest.raises(HelmValuesError) as refused:
        chart.render(values=values, name="stalwart", namespace="stalwart")
    assert message in str(refused.value), str(refused.value)
