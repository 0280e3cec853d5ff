"""The kopf handlers: TrainingJob lifecycle, status mirroring, and pod/node events.

`build_registry(config)` registers them on a fresh registry, so the intervals come from the
operator's settings and tests can run several operators side by side. Handlers are plain (sync)
functions: kopf runs them in its thread pool, where blocking etcd and API calls are fine.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import kopf

from stalwart.spec import SpecError
from stalwart.spec.model import MANAGED_BY_STALWART
from stalwart.store.records import JobStage
from stalwart_operator import deadline, kube_requests, kueue, names
from stalwart_operator.config import OperatorConfig
from stalwart_operator.events import cordon_reason, machine_cordoned, node_not_ready, pod_disruption, request_eviction
from stalwart_operator.runtime import Runtime
from stalwart_operator.status import Condition, ConditionType, TrainingJobPhase, rfc3339

RESOURCE = (names.GROUP, names.VERSION, names.PLURAL)
JOB_PODS = {names.JOB_LABEL: kopf.PRESENT}


def managed_here(spec: Any, **_: Any) -> bool:
    """Only jobs managed by the Stalwart operator (spec.managedBy): one that MultiKueue (or any
    other controller) manages gets no finalizer, no pods, no etcd keys and no status from us."""
    return bool((spec or {}).get("managedBy", MANAGED_BY_STALWART) == MANAGED_BY_STALWART)


def has_requests(meta: Any, spec: Any, **_: Any) -> bool:
    return managed_here(spec) and bool(kube_requests.requested((meta or {}).get("annotations")))


def _runtime(memo: Any) -> Runtime:
    return memo.runtime


def _invalid(patch: kopf.Patch, exc: SpecError) -> kopf.PermanentError:
    """Show why the job cannot run in its status, and stop kopf from retrying."""
    now = rfc3339(time.time())
    patch.status["phase"] = TrainingJobPhase.FAILED.value
    patch.status["conditions"] = [
        Condition(
            type=ConditionType.FAILED,
            status="True",
            reason="InvalidSpec",
            message=str(exc)[:1024],
            last_transition_time=now or "",
        ).model_dump(mode="json", by_alias=True)
    ]
    return kopf.PermanentError(str(exc))


def build_registry(config: OperatorConfig) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()

    @kopf.on.startup(id="configure", registry=registry)
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        # Our own storage keys, so the status schema stays strict (no status.kopf) and the
        # finalizer says whose it is.
        settings.persistence.finalizer = names.FINALIZER
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=f"operator.{names.GROUP}")
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
            prefix=f"operator.{names.GROUP}", key="last-handled-configuration"
        )
        settings.posting.level = logging.WARNING
        settings.execution.max_workers = 32
        settings.watching.server_timeout = 300
        settings.networking.request_timeout = 60

    @kopf.on.login(id="login", registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        """The official client's configuration: the service account in a pod, else the kubeconfig."""
        return kopf.login_via_client(**kwargs)

    # kopf's handler protocols name every keyword it may pass; ours take the ones they use and
    # **_ for the rest, which mypy cannot match against the protocols: hence the ignores below.
    # -- the job's lifecycle -----------------------------------------------------------------------
    @kopf.on.resume(*RESOURCE, id="reconcile", when=managed_here, registry=registry)
    @kopf.on.create(*RESOURCE, id="reconcile", when=managed_here, registry=registry)  # type: ignore[arg-type]
    def reconcile(
        body: kopf.Body,
        name: str,
        namespace: str,
        uid: str,
        meta: kopf.Meta,
        patch: kopf.Patch,
        memo: Any,
        logger: logging.Logger,
        **_: Any,
    ) -> None:
        """Submit the spec to etcd, create the headless Service, host the controller (which asks
        KubernetesCluster for the pods)."""
        rt = _runtime(memo)
        document = dict(body)
        if kueue.queued_for_kueue(document) and not (document.get("spec") or {}).get("suspend"):
            # Kueue admits the job by unsetting spec.suspend, as for a Job: nothing starts before.
            document = kueue.suspended_for_admission(document)
            patch.spec["suspend"] = True
            queue = body["metadata"]["labels"][names.KUEUE_QUEUE_LABEL]
            logger.info(f"{name}: queued in Kueue queue {queue!r}, suspended until Kueue admits it")
        try:
            job = rt.parse(document)
        except SpecError as exc:
            raise _invalid(patch, exc) from None
        job_id = names.job_id(namespace, name)
        rt.ensure_token(job, namespace, uid)  # before the spec: whoever reads the spec finds the token
        rt.submit(job, job_id)
        rt.ensure_service(job, namespace, uid)
        if rt.wants_controller(job, job_id) and rt.start(job, namespace, uid):
            logger.info(f"controller started for {job_id}")
        if not (body.get("status") or {}).get("jobId"):
            patch.status["jobId"] = job_id
            patch.status["phase"] = (TrainingJobPhase.SUSPENDED if job.spec.suspend else TrainingJobPhase.CREATED).value
        patch.status["observedGeneration"] = meta.get("generation")

    @kopf.on.update(*RESOURCE, field="spec", id="spec", when=managed_here, registry=registry)  # type: ignore[arg-type]
    def spec_changed(
        body: kopf.Body,
        name: str,
        namespace: str,
        uid: str,
        meta: kopf.Meta,
        patch: kopf.Patch,
        old: Any,
        new: Any,
        memo: Any,
        logger: logging.Logger,
        **_: Any,
    ) -> None:
        """A new spec goes to etcd (the controller applies codeVersion lazily, and carries out
        spec.suspend: workers and pods stop, no incident; unset, a new generation from the newest
        checkpoint); the controller is hosted if it was parked."""
        rt = _runtime(memo)
        try:
            job = rt.parse(dict(body))
        except SpecError as exc:
            raise _invalid(patch, exc) from None
        if (old or {}).get("roles") != (new or {}).get("roles"):
            # The CRD refuses this (a CEL transition rule); an API server without CEL may not.
            raise kopf.PermanentError("roles cannot change while the job exists; delete and re-create it")
        job_id = names.job_id(namespace, name)
        if rt.submit(job, job_id) and job.spec.suspend:
            logger.info(f"suspending {job_id}")
        if rt.wants_controller(job, job_id):
            rt.start(job, namespace, uid)
        patch.status["observedGeneration"] = meta.get("generation")

    @kopf.on.delete(*RESOURCE, id="cleanup", when=managed_here, registry=registry)  # type: ignore[arg-type]
    def delete(body: kopf.Body, name: str, namespace: str, uid: str, memo: Any, **_: Any) -> None:
        """The finalizer: nothing the job owned outlives it, in Kubernetes or in etcd."""
        rt = _runtime(memo)
        try:
            job = rt.parse(dict(body))
        except SpecError:
            job = None
        rt.cleanup(job, name, namespace, uid)

    # -- status ------------------------------------------------------------------------------------
    @kopf.timer(  # type: ignore[arg-type]
        *RESOURCE,
        id="status",
        interval=config.status_interval_seconds,
        initial_delay=config.status_interval_seconds,
        when=managed_here,
        registry=registry,
    )
    def mirror(
        body: kopf.Body,
        name: str,
        namespace: str,
        uid: str,
        meta: kopf.Meta,
        status: kopf.Status,
        patch: kopf.Patch,
        memo: Any,
        logger: logging.Logger,
        **_: Any,
    ) -> None:
        """Copy the controller's state into the status and post the Events it calls for; carry out
        requests made through the Kubernetes API; label the pods with their ranks; fail a job past
        activeDeadlineSeconds; delete the job ttlSecondsAfterFinished after it finished; re-host a
        controller that died."""
        rt = _runtime(memo)
        if meta.get("deletionTimestamp"):
            return  # the finalizer is taking it apart
        try:
            job = rt.parse(dict(body))
        except SpecError:
            return
        current = dict(status)
        # The generation reconcile or spec_changed submitted (a status read before their patch: the
        # body's, whose spec this tick parsed and acts on).
        generation = current.get("observedGeneration") or meta.get("generation")
        observed = rt.observe(job, namespace, uid, current, generation)
        new, state = observed.status, observed.state
        rendered = new.model_dump(mode="json", by_alias=True, exclude_none=True)
        if rendered != {k: v for k, v in current.items() if v is not None}:
            patch.status.update(new.to_patch())
        rt.record_events(job, namespace, uid, current.get("phase"), observed)
        rt.sync_requests(name, namespace, dict(meta.get("annotations") or {}))
        if state is None:
            return
        expired = deadline.expired(job, new, state, time.time())
        if expired is not None:
            logger.warning(f"{names.job_id(namespace, name)}: {expired}")
            rt.fail(job, namespace, uid, deadline.REASON, expired)
            return
        rt.label_pods(job, namespace, uid, state)
        if state.phase.terminal:
            ttl = job.spec.ttl_seconds_after_finished
            if ttl is not None and state.finished_at is not None and time.time() >= state.finished_at + ttl:
                logger.info(f"deleting {name}: finished more than {ttl}s ago")
                rt.delete_resource(name, namespace)
        elif job.spec.suspend and state.stage is JobStage.SUSPENDED:
            rt.park(job, namespace)
        elif rt.start(job, namespace, uid):
            logger.warning(f"controller for {names.job_id(namespace, name)} was not running; started it")

    @kopf.on.event(*RESOURCE, id="requests", when=has_requests, registry=registry)  # type: ignore[arg-type]
    def requests(type: str | None, name: str, namespace: str, meta: kopf.Meta, memo: Any, **_: Any) -> None:
        """A request annotation (stalwart node evict... through the Kubernetes API): into etcd now."""
        if type == "DELETED":
            return
        _runtime(memo).sync_requests(name, namespace, dict(meta.get("annotations") or {}))

    # -- pods and machines -------------------------------------------------------------------------
    @kopf.index("v1", "pods", labels=JOB_PODS, id="pods_by_machine", registry=registry)  # type: ignore[arg-type]
    def pods_by_machine(
        body: kopf.Body, namespace: str, uid: str, labels: kopf.Labels, **_: Any
    ) -> dict[str, tuple[str, str, str, str]] | None:
        """Which job pods run on each Kubernetes Node: (namespace, job, node, pod uid)."""
        machine = (body.get("spec") or {}).get("nodeName")
        node = labels.get(names.NODE_LABEL)
        if not machine or not node:
            return None
        return {machine: (namespace, labels[names.JOB_LABEL], node, uid)}

    @kopf.index("v1", "nodes", id="cordoned_machines", registry=registry)
    def cordoned_machines(body: kopf.Body, name: str, **_: Any) -> dict[str, str] | None:
        """Kubernetes Nodes Stalwart cordoned (an evicted node's machine), with the reason."""
        reason = cordon_reason(dict(body))
        return {name: reason} if reason is not None else None

    @kopf.on.event("v1", "pods", labels=JOB_PODS, id="pod_events", registry=registry)  # type: ignore[arg-type]
    def pod_event(
        type: str | None,
        body: kopf.Body,
        namespace: str,
        uid: str,
        labels: kopf.Labels,
        memo: Any,
        cordoned_machines: kopf.Index,
        logger: logging.Logger,
        **_: Any,
    ) -> None:
        """Every event feeds the job's pod cache (the hosted controller's node list). A failed,
        evicted or disrupted pod: ask the controller to evict (and replace) its node. A standby on a
        machine Stalwart cordoned leaves the pool: it would take a slot on a machine already evicted
        once."""
        _runtime(memo).pod_changed(type, dict(body))
        if type == "DELETED":
            return
        node = labels.get(names.NODE_LABEL)
        if not node:
            return
        job_id = names.job_id(namespace, labels[names.JOB_LABEL])
        disruption = pod_disruption(dict(body))
        standbys_only = False
        machine = (body.get("spec") or {}).get("nodeName")
        if disruption is None and machine and (reasons := list(cordoned_machines.get(machine, []))):
            disruption, standbys_only = machine_cordoned(machine, reasons[0]), True
        if disruption is None:
            return
        if request_eviction(_runtime(memo).store, job_id, node, disruption, uid, standbys_only=standbys_only):
            logger.warning(f"asked the controller of {job_id} to evict {node}: {disruption.reason}")

    @kopf.on.event("v1", "nodes", id="node_events", registry=registry)  # type: ignore[arg-type]
    def node_event(
        type: str | None,
        body: kopf.Body,
        name: str,
        memo: Any,
        pods_by_machine: kopf.Index,
        logger: logging.Logger,
        **_: Any,
    ) -> None:
        """A NotReady Kubernetes Node: every job node on it is evicted (hot-swapped). A Node Stalwart
        cordoned (one job evicted a node there): the standbys on it, of any job, leave their pools;
        running slots of other jobs keep running (their own checks judge them)."""
        if type == "DELETED":
            return
        disruption = node_not_ready(dict(body))
        standbys_only = False
        if disruption is None and (reason := cordon_reason(dict(body))) is not None:
            disruption, standbys_only = machine_cordoned(name, reason), True
        if disruption is None:
            return
        for namespace, job, node, pod_uid in pods_by_machine.get(name, []):
            job_id = names.job_id(namespace, job)
            if request_eviction(_runtime(memo).store, job_id, node, disruption, pod_uid, standbys_only=standbys_only):
                logger.warning(f"asked the controller of {job_id} to evict {node}: {disruption.reason}")

    return registry
