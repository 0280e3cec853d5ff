"""The CLI's Kubernetes path (stalwart.ops.actions): on-call requests as annotations on the
TrainingJob, suspend and resume as spec.suspend, answers read back from its status. Everything goes
through the Kubernetes API with the user's kubeconfig, so the cluster's RBAC decides and its audit
log records: the user needs get and patch on trainingjobs, and list on pods to find a node's job.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from typing import TYPE_CHECKING, Any

import kubernetes
from kubernetes import client as k8s

from stalwart.ops.errors import EXIT_TIMEOUT, EXIT_USAGE, OpsError
from stalwart.ops.requests import POLL_SECONDS, Waiting, quiet, requester
from stalwart.store.records import OperatorRequest, RequestKind, RequestStatus
from stalwart_operator import kube_requests, names
from stalwart_operator.kube import USER_AGENT, is_status
from stalwart_operator.status import ConditionType, RequestState, TrainingJobPhase

if TYPE_CHECKING:
    from stalwart.ops.reading import JobReader

FIELD_MANAGER = "kubectl-stalwart"


def _client() -> tuple[k8s.ApiClient, str]:
    """The kubeconfig's client and the context's namespace (in a pod: its service account)."""
    try:
        kubernetes.config.load_incluster_config()
        namespace_file = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
        with open(namespace_file) as f:
            namespace = f.read().strip()
    except (kubernetes.config.ConfigException, OSError):
        # $KUBECONFIG as it is now: the library reads it once, when it is imported.
        config_file = os.environ.get("KUBECONFIG") or None
        try:
            kubernetes.config.load_kube_config(config_file=config_file)
            _, context = kubernetes.config.list_kube_config_contexts(config_file=config_file)
        except (kubernetes.config.ConfigException, OSError) as exc:
            raise OpsError(f"cannot use the kubeconfig: {exc}", EXIT_USAGE) from None
        namespace = (context or {}).get("context", {}).get("namespace") or "default"
    api = k8s.ApiClient()
    api.user_agent = f"{USER_AGENT} (cli)"
    return api, namespace


def kubernetes_actions(namespace: str | None, waiting: Waiting = quiet) -> KubernetesActions:
    """The entry point stalwart.ops.actions loads; `waiting` shows the waits (the CLI's spinner)."""
    api, default = _client()
    return KubernetesActions(api, namespace or default, waiting)


class KubernetesActions:
    def __init__(self, api: k8s.ApiClient, namespace: str, waiting: Waiting = quiet) -> None:
        self.waiting = waiting
        self.custom = k8s.CustomObjectsApi(api)
        self.core = k8s.CoreV1Api(api)
        self.namespace = namespace
        self.where = f"the Kubernetes API (namespace {namespace})"
        self.store = None

    # -- reading -----------------------------------------------------------------------------------
    def job_id(self, name: str) -> str:
        return name

    def _get(self, job: str) -> dict[str, Any] | None:
        try:
            body = self.custom.get_namespaced_custom_object(
                names.GROUP, names.VERSION, self.namespace, names.PLURAL, job, _preload_content=False
            )
        except Exception as exc:
            if is_status(exc, 404):
                return None
            raise api_error(exc, f"read TrainingJob {job}") from None
        return json_body(body)

    def require(self, job: str) -> dict[str, Any]:
        body = self._get(job)
        if body is None:
            raise OpsError(f"no TrainingJob {job!r} in namespace {self.namespace} (kubectl get tj -n {self.namespace})")
        return body

    def is_job(self, name: str) -> bool:
        return self._get(name) is not None

    def job_for_node(self, node: str, job: str | None) -> str | None:
        if job is not None:
            self.require(job)
            return job
        try:
            listed = self.core.list_namespaced_pod(
                self.namespace, label_selector=f"{names.NODE_LABEL}={node}", _preload_content=False
            )
        except Exception as exc:
            raise api_error(exc, "list pods") from None
        jobs = sorted(
            {
                labels[names.JOB_LABEL]
                for p in json_body(listed).get("items", [])
                if (labels := p["metadata"].get("labels") or {}).get(names.NODE_LABEL) == node
                and names.JOB_LABEL in labels
            }
        )
        if len(jobs) > 1:
            raise OpsError(f"node {node!r} is in several jobs ({', '.join(jobs)}): pass --job")
        return jobs[0] if jobs else None

    # -- acting ------------------------------------------------------------------------------------
    def _patch(self, job: str, body: dict[str, Any]) -> None:
        try:
            self.custom.patch_namespaced_custom_object(
                names.GROUP,
                names.VERSION,
                self.namespace,
                names.PLURAL,
                job,
                body,
                field_manager=FIELD_MANAGER,
                _preload_content=False,
            )
        except Exception as exc:
            if is_status(exc, 404):
                raise OpsError(f"no TrainingJob {job!r} in namespace {self.namespace}") from None
            raise api_error(exc, f"patch TrainingJob {job}") from None

    def ask(self, job: str, kind: RequestKind, node: str | None, reason: str, timeout: float) -> OperatorRequest:
        """Annotate the job with the request; wait for the controller's answer in its status."""
        request_id = f"req-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
        value = kube_requests.RequestAnnotation(
            kind=kind, node=node, reason=reason[:500], requested_by=requester()[:200], requested_at=time.time()
        ).model_dump_json(by_alias=True)
        annotation = kube_requests.annotation_key(request_id)
        self._patch(job, {"metadata": {"annotations": {annotation: value}}})
        what = f"{kind.value} {node or 'every node'} in {self.namespace}/{job}"
        deadline = time.monotonic() + timeout
        try:
            with self.waiting(f"waiting for the operator and controller to {what} (request {request_id})"):
                while time.monotonic() < deadline:
                    answer = next(
                        (
                            r
                            for r in (self.require(job).get("status") or {}).get("requests") or []
                            if r.get("id") == request_id
                        ),
                        None,
                    )
                    if answer is not None and answer.get("phase") != RequestStatus.PENDING.value:
                        return as_request(RequestState.model_validate(answer))
                    time.sleep(POLL_SECONDS)
        except KeyboardInterrupt:
            self._patch(job, kube_requests.removal_patch([annotation]))
            raise
        self._patch(job, kube_requests.removal_patch([annotation]))  # the operator withdraws it
        raise OpsError(
            f"no answer to request {request_id} ({what}) within {timeout:.0f}s, so it was withdrawn; is the "
            f"operator running? (kubectl get tj {job} -n {self.namespace}; --timeout waits longer)",
            EXIT_TIMEOUT,
        )

    def reader(self) -> JobReader:
        """The read commands' way through the same API and namespace (stalwart.ops.reading)."""
        from stalwart_operator.cli_reads import KubernetesReader

        return KubernetesReader(self)

    def request_suspend(self, job: str, suspended: bool) -> bool:
        """Set the TrainingJob's spec.suspend, without waiting (the console's way: the page shows the
        job follow). False if it already was so: nothing is patched then."""
        body = self.require(job)
        if bool((body.get("spec") or {}).get("suspend")) == suspended:
            return False
        self._patch(job, {"spec": {"suspend": suspended}})
        return True

    def suspend(self, job: str, suspended: bool, timeout: float) -> str:
        """Set spec.suspend and wait for the job's controller to follow: every pod stopped (the
        Suspended condition), or training again (phase Running) after a resume."""
        if not self.request_suspend(job, suspended):
            return f"{self.namespace}/{job} is already {'suspended' if suspended else 'not suspended'}"
        verb = "suspend" if suspended else "resume"
        deadline = time.monotonic() + timeout
        with self.waiting(f"waiting for the operator to {verb} {self.namespace}/{job}"):
            while time.monotonic() < deadline:
                status = self.require(job).get("status") or {}
                phase = status.get("phase")
                if _followed(status, suspended):
                    return f"{self.namespace}/{job}: {phase}"
                time.sleep(POLL_SECONDS)
        raise OpsError(
            f"spec.suspend of {self.namespace}/{job} is set to {str(suspended).lower()}, but its status did not follow "
            f"within {timeout:.0f}s; is the operator running? (kubectl describe tj {job} -n {self.namespace})",
            EXIT_TIMEOUT,
        )


def _followed(status: dict[str, Any], suspended: bool) -> bool:
    phase = status.get("phase")
    if phase in (TrainingJobPhase.SUCCEEDED.value, TrainingJobPhase.FAILED.value):
        return True
    if not suspended:
        return phase == TrainingJobPhase.RUNNING.value
    return any(
        c.get("type") == ConditionType.SUSPENDED.value and c.get("status") == "True"
        for c in status.get("conditions") or []
    )


def json_body(response: Any) -> dict[str, Any]:
    """Raw JSON of a `_preload_content=False` call."""
    data: dict[str, Any] = json.loads(response.data)
    return data


def as_request(state: RequestState) -> OperatorRequest:
    """A request as the operator's status carries it, in the store's shape (for the CLI's rows)."""
    return OperatorRequest(
        id=state.id,
        kind=RequestKind(state.kind),
        node=state.node,
        requested_by=state.requested_by,
        requested_at=0.0,
        status=RequestStatus(state.phase),
        message=state.message,
        result=json.loads(state.result) if state.result else None,
    )


def api_error(exc: Exception, what: str) -> OpsError:
    if is_status(exc, 401, 403):
        return OpsError(f"the Kubernetes API refused to {what}: {getattr(exc, 'reason', exc)} (check your RBAC)")
    return OpsError(f"cannot {what} through the Kubernetes API: {exc}")
