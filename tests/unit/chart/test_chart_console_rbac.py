"""The console's rights on the cluster: its suspend and resume patch spec.suspend of the TrainingJob
(docs/console.md), so its own service account is bound to get and patch on trainingjobs, nothing else."""

from __future__ import annotations

from typing import Any

from support.chart import NAMESPACE, VALUE_SETS, render


def named(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    [found] = [d for d in docs if d and d["kind"] == kind and d["metadata"]["name"] == name]
    return found


def test_the_console_may_get_and_patch_training_jobs_and_says_it_serves_the_cluster() -> None:
    docs = render(VALUE_SETS["monitored-with-console"])
    pod = named(docs, "Deployment", "stalwart-console")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "stalwart-console" and pod["automountServiceAccountToken"] is True
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env["STALWART_CONSOLE_KUBERNETES"] == "1"
    role = named(docs, "ClusterRole", "stalwart-console")
    assert role["rules"] == [{"apiGroups": ["stalwart.dev"], "resources": ["trainingjobs"], "verbs": ["get", "patch"]}]
    binding = named(docs, "ClusterRoleBinding", "stalwart-console")
    assert binding["roleRef"]["name"] == "stalwart-console"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "stalwart-console", "namespace": NAMESPACE}]
    assert named(docs, "ServiceAccount", "stalwart-console")["metadata"]["namespace"] == NAMESPACE


def test_no_console_no_console_rights() -> None:
    docs = render({})
    assert not [d for d in docs if d and "console" in d["metadata"]["name"]]
