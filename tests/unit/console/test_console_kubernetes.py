"""The console's suspend and resume on a Kubernetes cluster go through the TrainingJob, so they last.

The console serves etcd (a real one) and, told it serves a cluster (ConsoleConfig.kubernetes, as the
chart sets it), patches `spec.suspend` of the TrainingJob on the emulated API server
(tests/support/kubesim.py) through the Kubernetes plugin the CLI uses (stalwart_operator.cli_actions),
found by the kubeconfig. etcd's copy of the spec is left to the operator, which writes it from the
custom resource; a `stalwart run` job (no namespace in its id) is still suspended in etcd.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from kubernetes import client as k8s
from support.kubesim import ApiServer, raw

from stalwart.console.access import AccessSettings, Gate, Role, TokenHolder
from stalwart.console.app import ConsoleConfig, create_app
from stalwart.store import Store, keys
from stalwart.store.records import AuditEntry, JobPhase, JobState
from stalwart_operator import crd, names

ON_CLUSTER, LOCAL = "default.demo-k8s", "console-local-run"
TOKEN = "op-token-k8s"
OPERATOR = {"Authorization": f"Bearer {TOKEN}"}


def training_job(name: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{names.GROUP}/{names.VERSION}",
        "kind": "TrainingJob",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"roles": [{"name": "trainer", "replicas": 1, "command": ["python", "t.py"]}], "suspend": False},
    }


@pytest.fixture(scope="module")
def api() -> Iterator[ApiServer]:
    server = ApiServer(crd.crd()).start()
    yield server
    server.stop()


@pytest.fixture
def store(etcd) -> Iterator[Store]:  # type: ignore[no-untyped-def]
    s = Store(etcd.endpoint)
    now = time.time()
    for job in (ON_CLUSTER, LOCAL):
        s.delete_prefix(keys.job_prefix(job))
        s.put(keys.job_spec(job), json.dumps(training_job(job.rpartition(".")[2])))
        state = JobState(
            job=job, phase=JobPhase.RUNNING, generation=1, slots=["node-a"], created_at=now, updated_at=now
        )
        s.put(keys.job_state(job), state)
    yield s
    for job in (ON_CLUSTER, LOCAL):
        s.delete_prefix(keys.job_prefix(job))
    s.close()


@pytest.fixture
def custom(api: ApiServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[k8s.CustomObjectsApi]:
    """The TrainingJob on the API server, and a kubeconfig leading there (as a pod's service account would)."""
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(api.kubeconfig(tmp_path / "kubeconfig")))
    objects = k8s.CustomObjectsApi(api.client())
    name = ON_CLUSTER.partition(".")[2]
    objects.create_namespaced_custom_object(names.GROUP, names.VERSION, "default", names.PLURAL, training_job(name))
    yield objects
    objects.delete_namespaced_custom_object(names.GROUP, names.VERSION, "default", names.PLURAL, name)


def cr_suspend(custom: k8s.CustomObjectsApi) -> Any:
    body = raw(
        custom.get_namespaced_custom_object(
            names.GROUP, names.VERSION, "default", names.PLURAL, ON_CLUSTER.partition(".")[2], _preload_content=False
        )
    )
    return body["spec"].get("suspend")


def etcd_suspend(store: Store, job: str) -> Any:
    return json.loads(store.get_raw(keys.job_spec(job)) or "{}")["spec"].get("suspend")


def console(store: Store, kubernetes: bool) -> TestClient:
    settings = AccessSettings(
        tokens=[TokenHolder(user="olga", role=Role.OPERATOR, sha256=hashlib.sha256(TOKEN.encode()).hexdigest())]
    )
    app = create_app(store, Gate(settings, b"k" * 32), None, ConsoleConfig(kubernetes=kubernetes))
    return TestClient(app, client=("127.0.0.1", 40000), raise_server_exceptions=False, follow_redirects=False)


def act(c: TestClient, job: str, action: str, reason: str) -> Any:
    page = c.get(f"/jobs/{job}/actions/{action}", headers=OPERATOR)
    found = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert found, page.text
    return c.post(f"/jobs/{job}/actions/{action}", data={"reason": reason, "csrf": found.group(1)}, headers=OPERATOR)


def test_suspend_and_resume_patch_the_training_job(store: Store, custom: k8s.CustomObjectsApi) -> None:
    c = console(store, kubernetes=True)
    done = act(c, ON_CLUSTER, "suspend", "maintenance window")
    assert done.status_code == 303, done.text
    assert cr_suspend(custom) is True
    assert etcd_suspend(store, ON_CLUSTER) is False  # the operator writes etcd's copy from the resource
    again = act(c, ON_CLUSTER, "suspend", "twice")
    assert again.status_code == 409 and "already suspended" in again.text
    assert act(c, ON_CLUSTER, "resume", "window over").status_code == 303
    assert cr_suspend(custom) is False
    entries = sorted(store.get_prefix(keys.audit_prefix(ON_CLUSTER), AuditEntry), key=lambda e: e.at)
    assert [(e.action, e.reason, e.actor) for e in entries] == [
        ("suspend", "maintenance window", "olga"),
        ("resume", "window over", "olga"),
    ]


def test_a_job_no_operator_runs_is_still_suspended_in_etcd(store: Store, custom: k8s.CustomObjectsApi) -> None:
    c = console(store, kubernetes=True)
    assert act(c, LOCAL, "suspend", "local run").status_code == 303
    assert etcd_suspend(store, LOCAL) is True


def test_a_console_not_told_of_a_cluster_edits_etcd(store: Store, custom: k8s.CustomObjectsApi) -> None:
    c = console(store, kubernetes=False)
    assert act(c, ON_CLUSTER, "suspend", "no cluster").status_code == 303
    assert etcd_suspend(store, ON_CLUSTER) is True and cr_suspend(custom) is False


def test_a_missing_training_job_is_a_clear_error(store: Store, custom: k8s.CustomObjectsApi) -> None:
    gone = "default.no-such-tj"
    store.put(keys.job_spec(gone), json.dumps(training_job("no-such-tj")))
    now = time.time()
    store.put(
        keys.job_state(gone),
        JobState(job=gone, phase=JobPhase.RUNNING, generation=1, slots=[], created_at=now, updated_at=now),
    )
    try:
        refused = act(console(store, kubernetes=True), gone, "suspend", "why not")
        assert refused.status_code == 400 and "no TrainingJob" in refused.text
    finally:
        store.delete_prefix(keys.job_prefix(gone))
