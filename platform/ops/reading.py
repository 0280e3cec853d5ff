"""Where the read commands (`stalwart jobs`, `status`, `incidents`) read a job: etcd, or the
Kubernetes API.

With etcd (a `stalwart run` job, or an engineer with etcd access) they read the controller's records
themselves. On a cluster an on-call engineer holds a kubeconfig, not an etcd client certificate:
there they read what the operator publishes on each TrainingJob, its status (the summary, the
newest incidents, the nodes not healthy), so the cluster's RBAC governs the reads as it does the
writes (stalwart.ops.actions). The platform imports no Kubernetes client: the Kubernetes reader is
the same plugin as the actions (entry point group `stalwart.cli.actions`, stalwart_operator), loaded
only when it is needed, and it answers with the same rows as etcd's reader.

Which one, first match (as stalwart.ops.actions chooses):
  1. `--etcd HOST:PORT` on the command line: etcd.
  2. `kubectl stalwart ...` (the kubectl plugin): the Kubernetes API, if a kubeconfig is found.
  3. etcd from $STALWART_ETCD or the config file.
  4. a kubeconfig: the Kubernetes API.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol

from stalwart.ops.actions import PREFER_KUBERNETES_ENV, kubernetes_plugin
from stalwart.ops.connection import ETCD_ENV, config_path, open_store, resolve
from stalwart.ops.errors import EXIT_USAGE, OpsError
from stalwart.ops.incidents import IncidentRow, incident_row, read_incidents
from stalwart.ops.jobs import JobRow, read_jobs
from stalwart.ops.lookup import in_namespace, qualified_job
from stalwart.ops.status import StatusReport, read_status
from stalwart.store.client import Store


class JobReader(Protocol):
    """What the read commands need, from etcd or from the Kubernetes API."""

    where: str  # for captions and messages: "etcd 127.0.0.1:2379", "the Kubernetes API (namespace ml)"

    def jobs(self) -> list[JobRow]: ...

    def status(self, job: str) -> StatusReport: ...

    def incidents(self, job: str | None) -> list[IncidentRow]:
        """One job's incidents or every job's (in the namespace), oldest first."""
        ...


class EtcdReader:
    def __init__(self, store: Store, namespace: str | None) -> None:
        self.store, self.namespace = store, namespace
        self.where = f"etcd {store.endpoint}"

    def jobs(self) -> list[JobRow]:
        rows = read_jobs(self.store)
        return [r for r in rows if r.namespace == self.namespace] if self.namespace else rows

    def status(self, job: str) -> StatusReport:
        return read_status(self.store, qualified_job(job, self.namespace))

    def incidents(self, job: str | None) -> list[IncidentRow]:
        name = qualified_job(job, self.namespace) if job else None
        found = read_incidents(self.store, name)
        if self.namespace and name is None:
            found = [i for i in found if in_namespace(self.store, i.job, self.namespace)]
        return [incident_row(i) for i in found]


def _kubernetes_reader(namespace: str | None) -> JobReader | None:
    actions = kubernetes_plugin(namespace)
    reader = getattr(actions, "reader", None) if actions is not None else None
    return reader() if callable(reader) else None


@contextmanager
def open_reader(etcd: str | None, namespace: str | None) -> Iterator[JobReader]:
    """The way to read jobs, by the order in this module's docstring."""
    if etcd is None and os.environ.get(PREFER_KUBERNETES_ENV):
        kube = _kubernetes_reader(namespace)
        if kube is not None:
            yield kube
            return
    if etcd is None and resolve(etcd).etcd is None:
        kube = _kubernetes_reader(namespace)
        if kube is not None:
            yield kube
            return
        raise OpsError(
            f"nothing to read from: pass --etcd HOST:PORT, set {ETCD_ENV}, write 'etcd: HOST:PORT' in "
            f"{config_path()}, or use a kubeconfig (KUBECONFIG or ~/.kube/config) with `pip install "
            "stalwart[operators]` for the Kubernetes API",
            EXIT_USAGE,
        )
    with open_store(etcd) as store:
        yield EtcdReader(store, namespace)
