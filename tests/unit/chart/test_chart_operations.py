"""The chart's day-two objects: the `helm test` pod (its script run against a real etcd), the
PodDisruptionBudgets, TrainingJobs in the aggregated view/edit/admin roles, and the note that Helm
never upgrades crds/. Every rendered manifest also passes kubernetes-validate --strict (test_chart)."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import kubernetes_validate
import pytest
from support.chart import CHART, VALUE_SETS, notes, render

from stalwart.net import free_port
from stalwart.store.etcd_server import EtcdServer

K8S_VERSION = "1.30"


def by_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def test_pod(values: dict[str, Any] | None = None) -> dict[str, Any]:
    [pod] = by_kind(render(values), "Pod").values()
    return pod


test_pod.__test__ = False  # type: ignore[attr-defined]  # a helper, not a test


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_helm_test_has_a_pod_that_is_a_test_hook(name: str) -> None:
    pod = test_pod(VALUE_SETS[name])
    annotations = pod["metadata"]["annotations"]
    assert annotations["helm.sh/hook"] == "test"
    assert "hook-succeeded" in annotations["helm.sh/hook-delete-policy"]
    assert (
        pod["spec"]["restartPolicy"] == "Never" and pod["metadata"]["labels"]["app.kubernetes.io/component"] == "test"
    )
    kubernetes_validate.validate(pod, K8S_VERSION, strict=True)
    [container] = pod["spec"]["containers"]
    assert container["resources"]["limits"] and container["securityContext"]["allowPrivilegeEscalation"] is False


def test_no_test_pod_when_tests_are_off() -> None:
    assert by_kind(render({"tests": {"enabled": False}}), "Pod") == {}


def run_test_script(pod: dict[str, Any], etcd: str, diagnosis: str = "") -> subprocess.CompletedProcess[str]:
    """The test pod's own command and script, with its etcd and diagnosis arguments replaced."""
    [container] = pod["spec"]["containers"]
    command, (script, _etcd, _diagnosis) = container["command"], container["args"]
    assert command == ["python", "-c"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("STALWART_ETCD")}
    return subprocess.run(
        [sys.executable, "-c", script, etcd, diagnosis], capture_output=True, text=True, timeout=120, env=env
    )


def test_the_test_pods_script_passes_against_a_live_etcd_and_fails_without_one(etcd: EtcdServer) -> None:
    pod = test_pod({"etcd": {"tls": {"enabled": False}, "auth": {"enabled": False}}})
    [container] = pod["spec"]["containers"]
    assert container["args"][1] == "stalwart-etcd.stalwart.svc:2379"
    assert container["args"][2] == "http://stalwart-diagnosis.stalwart.svc:8470"
    ok = run_test_script(pod, etcd.endpoint)
    assert ok.returncode == 0 and "etcd answers" in ok.stdout, ok.stderr
    down = run_test_script(pod, f"127.0.0.1:{free_port()}")
    assert down.returncode != 0


def test_the_test_pod_reads_etcd_with_stalwarts_client_certificate() -> None:
    pod = test_pod()
    [container] = pod["spec"]["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["STALWART_ETCD_CERT"] == "/etc/stalwart/etcd-tls/tls.crt"
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["etcd-tls"]["secret"]["secretName"] == "stalwart-etcd-client"
    policies = by_kind(render(), "NetworkPolicy")
    for component in ("etcd", "diagnosis"):  # the policies let the test pod in
        peers = [p for rule in policies[f"stalwart-{component}"]["spec"]["ingress"] for p in rule["from"]]
        labels = [p.get("podSelector", {}).get("matchLabels", {}) for p in peers]
        assert any(m.get("app.kubernetes.io/component") == "test" for m in labels), component


def test_disruption_budgets_keep_etcds_quorum_and_an_operator() -> None:
    pdbs = by_kind(render(), "PodDisruptionBudget")
    etcd = pdbs["stalwart-etcd"]["spec"]
    assert etcd["maxUnavailable"] == 1  # 2 of 3 members stay: the quorum
    assert etcd["selector"]["matchLabels"]["app.kubernetes.io/component"] == "etcd"
    assert pdbs["stalwart-operator"]["spec"]["maxUnavailable"] == 1
    [etcd_set] = by_kind(render(), "StatefulSet").values()
    assert etcd_set["spec"]["selector"]["matchLabels"] == etcd["selector"]["matchLabels"]
    # No budget for an etcd the chart does not run, or for a single member (it would block drains).
    assert "stalwart-etcd" not in by_kind(render(VALUE_SETS["external-etcd-minimal"]), "PodDisruptionBudget")
    single = {"etcd": {"replicas": 1}, "operator": {"replicas": 1}}
    assert by_kind(render(single), "PodDisruptionBudget") == {}


def test_trainingjobs_are_in_the_aggregated_view_edit_and_admin_roles() -> None:
    roles = by_kind(render(), "ClusterRole")
    view, edit = roles["stalwart-trainingjobs-view"], roles["stalwart-trainingjobs-edit"]
    aggregate = "rbac.authorization.k8s.io/aggregate-to-"
    assert {k for k, v in view["metadata"]["labels"].items() if k.startswith(aggregate) and v == "true"} == {
        f"{aggregate}view",
        f"{aggregate}edit",
        f"{aggregate}admin",
    }
    assert {k for k, v in edit["metadata"]["labels"].items() if k.startswith(aggregate) and v == "true"} == {
        f"{aggregate}edit",
        f"{aggregate}admin",
    }
    [read] = view["rules"]
    assert read["apiGroups"] == ["stalwart.dev"] and set(read["verbs"]) == {"get", "list", "watch"}
    assert set(read["resources"]) == {"trainingjobs", "trainingjobs/status"}
    [write] = edit["rules"]
    assert write["resources"] == ["trainingjobs"] and {"create", "patch", "delete"} <= set(write["verbs"])
    off = by_kind(render({"rbac": {"create": True, "aggregateToDefaultRoles": False}}), "ClusterRole")
    assert "stalwart-trainingjobs-view" not in off and "stalwart-operator" in off


def test_the_notes_say_helm_never_upgrades_the_crd() -> None:
    text = notes()
    assert "never upgrades" in text and "helm show crds" in text and "helm test stalwart" in text


def test_every_shipped_alert_has_a_window_and_an_absolute_runbook_link() -> None:
    [rule] = by_kind(render(VALUE_SETS["monitored-with-console"]), "PrometheusRule").values()
    alerts = [r for g in rule["spec"]["groups"] for r in g["rules"]]
    assert len(alerts) >= 12
    for alert in alerts:
        assert alert.get("for"), f"{alert['alert']} has no for:"
        url = alert["annotations"]["runbook_url"]
        assert url.startswith("https://git.example/stalwart/blob/main/runbooks/") and url.endswith(".md"), url
    names = {a["alert"] for a in alerts}
    assert {
        "StalwartNodeAgentDown",
        "StalwartCheckpointSavesFailing",
        "StalwartRestartStorm",
        "StalwartDiagnosisServiceDown",
    } <= names


def test_the_prometheus_rule_needs_a_runbook_base_url() -> None:
    """A relative runbook_url is no link in Alertmanager or Grafana: the rule is refused without one."""
    from helm_python import Chart
    from helm_python.errors import HelmRenderError, HelmValuesError

    with Chart.load(CHART) as chart:
        for base, message in (("", "runbookBaseUrl: the URL"), ("https://", "runbookBaseUrl")):
            values = {"monitoring": {"prometheusRule": {"enabled": True, "runbookBaseUrl": base}}}
            with pytest.raises((HelmRenderError, HelmValuesError)) as refused:
                chart.render(values=values, name="stalwart", namespace="stalwart")
            assert message in str(refused.value), str(refused.value)
