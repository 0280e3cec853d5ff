"""How the on-call commands act on a job: through etcd, or through the Kubernetes API.

With etcd (a `stalwart run` job, or an engineer with etcd access) the CLI writes the
OperatorRequest itself. On a cluster, on-call engineers hold a kubeconfig, not etcd access: the
request becomes an annotation on the TrainingJob (the operator turns it into the same
OperatorRequest), so the cluster's RBAC and audit log apply. The platform imports no Kubernetes
client: the Kubernetes side is a plugin (entry point group `stalwart.cli.actions`, provided by
stalwart_operator.cli_actions), loaded only when it is needed.

Which one, first match:
  1. `--etcd HOST:PORT` on the command line: etcd.
  2. `kubectl stalwart ...` (the kubectl plugin): the Kubernetes API, if a kubeconfig is found.
  3. etcd from $STALWART_ETCD or the config file.
  4. a kubeconfig ($KUBECONFIG, ~/.kube/config, or the pod's service account): the Kubernetes API.
`-n/--namespace NS` names the job's namespace; with etcd, job `demo` in `ml` is `ml.demo`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from importlib.metadata import entry_points
from pathlib import Path
from typing import Protocol

from stalwart.ops import requests, suspension
from stalwart.ops.connection import ETCD_ENV, config_path, open_store, resolve
from stalwart.ops.errors import EXIT_USAGE, OpsError
from stalwart.ops.lookup import job_for_node, qualified_job
from stalwart.ops.requests import Waiting, quiet
from stalwart.store import keys
from stalwart.store.client import Store
from stalwart.store.records import JobState, OperatorRequest, RequestKind

ENTRY_POINTS = "stalwart.cli.actions"
# Set by the kubectl plugin's entry point: prefer the Kubernetes API over a configured etcd.
PREFER_KUBERNETES_ENV = "STALWART_PREFER_KUBERNETES"


class JobActions(Protocol):
    """What the commands need: find the job, ask its controller, suspend or resume it."""

    where: str  # for messages: "etcd at host:2379", "the Kubernetes API (namespace ml)"
    store: Store | None  # etcd's, when acting through etcd (machines outside jobs are cordoned there)

    def job_id(self, name: str) -> str: ...

    def is_job(self, name: str) -> bool: ...

    def job_for_node(self, node: str, job: str | None) -> str | None: ...

    def ask(self, job: str, kind: RequestKind, node: str | None, reason: str, timeout: float) -> OperatorRequest: ...

    def suspend(self, job: str, suspended: bool, timeout: float) -> str: ...


class EtcdActions:
    def __init__(self, store: Store, namespace: str | None, waiting: Waiting = quiet) -> None:
        self.store: Store | None = store
        self._store = store
        self.namespace = namespace
        self.waiting = waiting
        self.where = f"etcd at {store.endpoint}"

    def job_id(self, name: str) -> str:
        return qualified_job(name, self.namespace)

    def is_job(self, name: str) -> bool:
        try:
            key = keys.job_state(self.job_id(name))
        except ValueError:
            return False
        return self._store.get(key, JobState) is not None

    def job_for_node(self, node: str, job: str | None) -> str | None:
        return job_for_node(self._store, node, self.job_id(job) if job else None)

    def ask(self, job: str, kind: RequestKind, node: str | None, reason: str, timeout: float) -> OperatorRequest:
        request = requests.submit(self._store, job, kind, node, reason)
        return requests.wait(self._store, job, request, timeout, self.waiting)

    def suspend(self, job: str, suspended: bool, timeout: float) -> str:
        """Set spec.suspend in etcd (stalwart.ops.spec_edit, as the console does) and wait for the
        job's controller to carry it out."""
        return suspension.suspend(self._store, self.job_id(job), suspended, timeout, self.waiting)


class SuspendPatcher(Protocol):
    """The Kubernetes plugin's spec.suspend patch, for a caller that does not wait (the console)."""

    where: str

    def request_suspend(self, job: str, suspended: bool) -> bool: ...


def training_job(job_id: str) -> tuple[str, str] | None:
    """(namespace, name) of the TrainingJob an etcd job id stands for (`ml.demo`: demo in ml, as the
    operator names them); None for a job no operator runs (`stalwart run`'s, without a dot)."""
    namespace, dot, name = job_id.partition(".")
    return (namespace, name) if dot and namespace and name else None


def kubernetes_patcher(namespace: str) -> SuspendPatcher:
    """The Kubernetes plugin's actions in `namespace`, for a caller that was told it serves a cluster:
    an OpsError (not a silent fallback to etcd) when the plugin or the credentials are missing."""
    found = entry_points(group=ENTRY_POINTS, name="kubernetes")
    if not found:
        raise OpsError(
            "this console serves a Kubernetes cluster, but the Kubernetes plugin is not installed "
            "(pip install stalwart[operators])"
        )
    patcher: SuspendPatcher = next(iter(found)).load()(namespace, quiet)
    return patcher


def _kubeconfig_present() -> bool:
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        return True
    configured = os.environ.get("KUBECONFIG")
    paths = configured.split(os.pathsep) if configured else [str(Path.home() / ".kube" / "config")]
    return any(p and Path(p).exists() for p in paths)


def kubernetes_plugin(namespace: str | None, waiting: Waiting = quiet) -> JobActions | None:
    """The Kubernetes plugin's actions (its reader too: stalwart.ops.reading), or None when it is not
    installed or no kubeconfig exists."""
    if not _kubeconfig_present():
        return None
    found = entry_points(group=ENTRY_POINTS, name="kubernetes")
    if not found:
        return None
    factory = next(iter(found)).load()
    actions: JobActions = factory(namespace, waiting)
    return actions


@contextmanager
def open_actions(etcd: str | None, namespace: str | None, waiting: Waiting = quiet) -> Iterator[JobActions]:
    """The way to act on jobs, by the order in this module's docstring; `waiting` shows the waits."""
    if etcd is None and os.environ.get(PREFER_KUBERNETES_ENV):
        kube = kubernetes_plugin(namespace, waiting)
        if kube is not None:
            yield kube
            return
    conn = resolve(etcd)
    if etcd is None and conn.etcd is None:
        kube = kubernetes_plugin(namespace, waiting)
        if kube is not None:
            yield kube
            return
        raise OpsError(
            f"nothing to act through: pass --etcd HOST:PORT, set {ETCD_ENV}, write 'etcd: HOST:PORT' in "
            f"{config_path()}, or use a kubeconfig (KUBECONFIG or ~/.kube/config) with `pip install "
            "stalwart[operators]` for the Kubernetes API",
            EXIT_USAGE,
        )
    with open_store(etcd) as store:
        yield EtcdActions(store, namespace, waiting)
