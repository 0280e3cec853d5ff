"""What the kopf handlers share in one operator process: settings, etcd, the API client and the
hosted controllers. It lives in kopf's `memo`; the handlers stay thin."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client as k8s

from stalwart.controller.core.ranks import slot_roles
from stalwart.logs import get_logger
from stalwart.spec import PathConfinement, SpecError, TrainingJob, confined, parse_job
from stalwart.spec.confinement import allowed_roots
from stalwart.store import keys
from stalwart.store.client import Store
from stalwart.store.credentials import ensure_job_token
from stalwart.store.jobs import read_spec
from stalwart.store.nodes import read_nodes
from stalwart.store.records import Incident, JobPhase, JobState, OperatorRequest
from stalwart_operator import kube_requests, names, pods, recorder
from stalwart_operator.cluster import KubernetesCluster
from stalwart_operator.config import OperatorConfig
from stalwart_operator.hosting import ControllerHost
from stalwart_operator.kube import is_status
from stalwart_operator.status import PodView, TrainingJobStatus, build_status

log = get_logger("stalwart.operator")
# A re-list is thousands of events: tell the caches about it at most this often (each debounces).
RELIST_SIGNAL_SECONDS = 0.2


@dataclass(frozen=True)
class Observed:
    status: TrainingJobStatus
    state: JobState | None
    incidents: list[Incident]
    requests: list[OperatorRequest]


def document(body: dict[str, Any]) -> dict[str, Any]:
    """The custom resource as the TrainingJob document `stalwart run` reads: no status, no server
    fields in metadata."""
    meta = body.get("metadata") or {}
    return {
        "apiVersion": body.get("apiVersion"),
        "kind": body.get("kind"),
        "metadata": {
            "name": meta.get("name"),
            "namespace": meta.get("namespace") or "default",
            "labels": dict(meta.get("labels") or {}),
        },
        "spec": body.get("spec") or {},
    }


class Runtime:
    def __init__(self, config: OperatorConfig, store: Store, api: k8s.ApiClient) -> None:
        self.config = config
        self.store = store
        self.api = api
        self.core = k8s.CoreV1Api(api)
        self.custom = k8s.CustomObjectsApi(api)
        self.host = ControllerHost(store)
        self._clusters: dict[str, KubernetesCluster] = {}
        # Jobs (by uid) whose finalizer ran: nothing may host their controller again, even a timer
        # that was already running when the deletion began.
        self._deleted: set[str] = set()
        # Jobs (by uid) the operator itself ended (activeDeadlineSeconds): not hosted again.
        self._ended: set[str] = set()
        self._relist_signalled = -RELIST_SIGNAL_SECONDS

    # -- jobs ------------------------------------------------------------------------------------
    def parse(self, body: dict[str, Any]) -> TrainingJob:
        """The spec, bounded and validated as `stalwart run` does it, its paths confined to the
        image's job folder and the configured allowed folders (the agents check them again)."""
        meta = body.get("metadata") or {}
        source = f"TrainingJob {meta.get('namespace')}/{meta.get('name')}"
        job = parse_job(document(body), source)
        problems = pods.template_problems(job, self.config)
        if problems:
            raise SpecError(source, problems)
        paths = PathConfinement(Path(self.config.job_dir), allowed_roots(os.pathsep.join(self.config.allowed_paths)))
        return confined(job, paths, source)

    def cluster(self, job: TrainingJob, namespace: str, uid: str) -> KubernetesCluster:
        """One KubernetesCluster per job (per uid: a re-created job of the same name gets a new one)."""
        job_id = names.job_id(namespace, job.name)
        current = self._clusters.get(job_id)
        if current is not None and current.owner_uid == uid:
            current.job = job  # the hosted controller holds this object: new pods follow the new spec
        else:
            if current is not None:
                current.close()  # an earlier job of the same name: its pod cache stops
            current = KubernetesCluster(
                job=job,
                namespace=namespace,
                job_id=job_id,
                owner_uid=uid,
                config=self.config,
                api=self.api,
                store=self.store,
            )
            self._clusters[job_id] = current
        return current

    def ensure_token(self, job: TrainingJob, namespace: str, uid: str) -> None:
        """The job's credential: in etcd (created once, kept across operator restarts) and in the
        Secret its pods read. The operator writes the Secret and never reads one back."""
        token = ensure_job_token(self.store, names.job_id(namespace, job.name))
        secret = pods.job_token_secret(job, namespace=namespace, owner_uid=uid, token=token)
        try:
            self.core.create_namespaced_secret(namespace, secret, _preload_content=False)
        except Exception as exc:
            if not is_status(exc, 409):
                raise
            # Left by an earlier job of the same name (or an earlier run of this one): make it ours.
            self.core.patch_namespaced_secret(
                secret["metadata"]["name"],
                namespace,
                secret,
                _preload_content=False,
            )

    def submit(self, job: TrainingJob, job_id: str) -> bool:
        """Write the spec where the controller and the agents read it. True if it changed."""
        doc = job.model_dump(mode="json", by_alias=True)
        raw = self.store.get_raw(keys.job_spec(job_id))
        if raw is not None and json.loads(raw) == doc:
            return False
        self.store.put(keys.job_spec(job_id), json.dumps(doc))
        return True

    def start(self, job: TrainingJob, namespace: str, uid: str) -> bool:
        """Host the job's controller (no-op if hosted, finished, deleted or ended by the operator).
        A suspended job's controller is hosted too: it carries out the suspension itself (workers,
        then pods, stop; no incident) and resumes the job from its newest checkpoint."""
        if uid in self._deleted or uid in self._ended:
            return False
        cluster = self.cluster(job, namespace, uid)
        return self.host.ensure(names.job_id(namespace, job.name), lambda: cluster)

    def ensure_service(self, job: TrainingJob, namespace: str, uid: str) -> None:
        _create(
            lambda: self.core.create_namespaced_service(
                namespace,
                pods.headless_service(job, namespace=namespace, owner_uid=uid, config=self.config),
                _preload_content=False,
            )
        )
        group = pods.volcano_podgroup(job, namespace=namespace, owner_uid=uid)
        if group is not None:
            try:
                _create(
                    lambda: self.custom.create_namespaced_custom_object(
                        "scheduling.volcano.sh",
                        "v1beta1",
                        namespace,
                        "podgroups",
                        group,
                        _preload_content=False,
                    )
                )
            except Exception as exc:
                if not is_status(exc, 404):
                    raise
                log.warning(
                    "Volcano is not installed: no PodGroup for the gang",
                    fields={"job": job.name},
                )

    def fail(self, job: TrainingJob, namespace: str, uid: str, reason: str, message: str) -> None:
        """End the job as Failed from outside its controller (activeDeadlineSeconds): stop the
        controller, record the terminal state (compare-and-swap: never over a newer decision), then
        let the spec's cleanPodPolicy decide which pods go."""
        job_id = names.job_id(namespace, job.name)
        self._ended.add(uid)  # no timer re-hosts it meanwhile
        self.host.stop(job_id)
        key = keys.job_state(job_id)
        state, revision = self.store.get_with_revision(key, JobState)
        if state is None or state.phase.terminal:
            return
        now = time.time()
        failed = state.model_copy(
            update={
                "phase": JobPhase.FAILED,
                "reason": reason,
                "message": message,
                "finished_at": now,
                "updated_at": now,
            }
        )
        if not self.store.commit({key: failed}, expect_revision={key: revision}):
            self._ended.discard(uid)  # the state moved: the next status tick looks again
            return
        cluster = self.cluster(job, namespace, uid)
        for pod in cluster.list_pods():
            node = (pod["metadata"].get("labels") or {}).get(names.NODE_LABEL)
            if node:
                cluster.stop_node(node)
        log.warning("job failed by the operator", fields={"job": job_id, "reason": reason, "message": message})

    def sync_requests(self, name: str, namespace: str, annotations: dict[str, str]) -> None:
        """Requests made through the Kubernetes API into etcd; answered ones lose their annotation."""
        done = kube_requests.sync(self.store, names.job_id(namespace, name), annotations)
        if done:
            _delete(
                lambda: self.custom.patch_namespaced_custom_object(
                    names.GROUP,
                    names.VERSION,
                    namespace,
                    names.PLURAL,
                    name,
                    kube_requests.removal_patch(done),
                    _preload_content=False,
                )
            )

    def wants_controller(self, job: TrainingJob, job_id: str) -> bool:
        """A job created suspended (Kueue) gets no controller, and so no pods, until it is resumed."""
        return not (job.spec.suspend and self.store.get(keys.job_state(job_id), JobState) is None)

    def park(self, job: TrainingJob, namespace: str) -> None:
        """A suspended job whose controller has stopped every pod needs no controller until it is
        resumed (Kueue may hold many jobs suspended): its state waits in etcd."""
        job_id = names.job_id(namespace, job.name)
        submitted = read_spec(self.store, job_id)
        if submitted is not None and not submitted.spec.suspend:
            return  # resumed since this status tick read the TrainingJob
        if self.host.running(job_id):
            self.host.stop(job_id)
            log.info("suspended: controller parked until the job resumes", fields={"job": job_id})

    def cleanup(self, job: TrainingJob | None, name: str, namespace: str, uid: str) -> None:
        """Everything the job owns: its controller, pods, Service, PodGroup and etcd keys."""
        job_id = names.job_id(namespace, name)
        self._deleted.add(uid)
        self.host.stop(job_id)
        cluster = self._clusters.pop(job_id, None)
        if cluster is not None:
            cluster.close()
        listed = json.loads(
            self.core.list_namespaced_pod(
                namespace, label_selector=names.job_selector(name), _preload_content=False
            ).data  # unparsed: a urllib3 response
        )
        for pod in listed.get("items", []):
            if ((pod.get("metadata") or {}).get("labels") or {}).get(names.JOB_LABEL) == name:
                _delete(
                    lambda p=pod: self.core.delete_namespaced_pod(
                        p["metadata"]["name"], namespace, _preload_content=False
                    )
                )
        _delete(
            lambda: self.core.delete_namespaced_service(names.service_name(name), namespace, _preload_content=False)
        )
        _delete(
            lambda: self.core.delete_namespaced_secret(names.token_secret_name(name), namespace, _preload_content=False)
        )
        if job is not None and job.spec.scheduling.scheduler_name == "volcano":
            _delete(
                lambda: self.custom.delete_namespaced_custom_object(
                    "scheduling.volcano.sh",
                    "v1beta1",
                    namespace,
                    "podgroups",
                    names.podgroup_name(name),
                    _preload_content=False,
                )
            )
        self.store.delete_prefix(keys.job_prefix(job_id))
        log.info("job cleaned up", fields={"job": job_id})

    # -- status ------------------------------------------------------------------------------------
    def observe(
        self,
        job: TrainingJob,
        namespace: str,
        uid: str,
        previous: dict[str, Any] | None,
        generation: int | None,
    ) -> Observed:
        """The status as etcd and the pods show it now, and the records it came from."""
        job_id = names.job_id(namespace, job.name)
        state = self.store.get(keys.job_state(job_id), JobState)
        incidents = self.store.get_prefix(keys.incidents_prefix(job_id), Incident)
        requests = [
            r
            for r in self.store.get_prefix(keys.requests_prefix(job_id), OperatorRequest)
            if r.requested_by.endswith(kube_requests.VIA_KUBERNETES)
        ]
        nodes = read_nodes(self.store, job_id)
        cluster = self.cluster(job, namespace, uid)
        views: dict[str, PodView] = {}
        for pod in cluster.list_pods():
            node = pod["metadata"]["labels"].get(names.NODE_LABEL)
            if node:
                views[node] = PodView(
                    name=pod["metadata"]["name"],
                    phase=(pod.get("status") or {}).get("phase", "Pending"),
                    machine=(pod.get("spec") or {}).get("nodeName"),
                    terminating=bool(pod["metadata"].get("deletionTimestamp")),
                )
        try:
            before = TrainingJobStatus.model_validate(previous) if previous else None
        except ValueError:
            before = None
        status = build_status(
            job_id=job_id,
            state=state,
            incidents=incidents,
            slot_roles=slot_roles(job.spec),
            pods=views,
            registered=set(nodes.registrations),
            previous=before,
            suspended=job.spec.suspend,
            observed_generation=generation,
            now=time.time(),
            requests=requests,
        )
        if state is not None:
            live = [w.step for w in state.current_workers(nodes.heartbeats) if w.step is not None]
            if live and (status.current_step is None or max(live) > status.current_step):
                status = status.model_copy(update={"current_step": max(live)})
        return Observed(status, state, incidents, requests)

    # -- events ------------------------------------------------------------------------------------
    def record_events(
        self, job: TrainingJob, namespace: str, uid: str, before_phase: str | None, observed: Observed
    ) -> int:
        """Post the Events the records call for (phase change, new incidents, recoveries) once each.
        Returns how many were posted."""
        job_id = names.job_id(namespace, job.name)
        posted = recorder.load_posted(self.store, job_id)
        events, after = recorder.pending_events(observed.incidents, posted)
        saved, after = recorder.suspension_save_event(observed.state, after)
        if saved is not None:
            events.append(saved)
        change = recorder.phase_event(before_phase, observed.status.phase, observed.state, time.time())
        if change is not None:
            events.append(change)
        count = 0
        for event in sorted(events, key=lambda e: e.at):
            body = recorder.event_manifest(
                event, job=job.name, namespace=namespace, uid=uid, instance=self.config.identity
            )
            try:
                self.core.create_namespaced_event(namespace, body, _preload_content=False)
                count += 1
            except Exception as exc:
                if not is_status(exc, 409):  # posted before this operator restarted
                    raise
        if after != posted:
            recorder.save_posted(self.store, job_id, after)
        return count

    def label_pods(self, job: TrainingJob, namespace: str, uid: str, state: JobState) -> None:
        """Show the controller's view on the pods: the node rank each holds, or that it is a standby."""
        wanted: dict[str, dict[str, str | None]] = {}
        for rank, node in enumerate(state.slots):
            wanted[node] = {names.NODE_RANK_LABEL: str(rank), names.STANDBY_LABEL: None}
        for node in state.standbys:
            wanted[node] = {names.NODE_RANK_LABEL: None, names.STANDBY_LABEL: "true"}
        for pod in self.cluster(job, namespace, uid).list_pods():
            labels = pod["metadata"].get("labels") or {}
            want = wanted.get(labels.get(names.NODE_LABEL, ""))
            if want is None or all(labels.get(k) == v for k, v in want.items()):
                continue
            _delete(
                lambda p=pod, w=want: self.core.patch_namespaced_pod(
                    p["metadata"]["name"], namespace, {"metadata": {"labels": w}}, _preload_content=False
                )
            )

    def delete_resource(self, name: str, namespace: str) -> None:
        _delete(
            lambda: self.custom.delete_namespaced_custom_object(
                names.GROUP, names.VERSION, namespace, names.PLURAL, name, _preload_content=False
            )
        )

    # -- pods ------------------------------------------------------------------------------------
    def pod_changed(self, kind: str | None, pod: dict[str, Any]) -> None:
        """An event from kopf's pod watch, into the cache of the job it belongs to. A listing's
        event (kind None: kopf listed the pods again, after 410 Gone or a broken watch) makes every
        job's cache LIST once: a re-list does not report the pods deleted meanwhile."""
        meta = pod.get("metadata") or {}
        job = (meta.get("labels") or {}).get(names.JOB_LABEL)
        cluster = self._clusters.get(names.job_id(meta.get("namespace") or "default", job)) if job else None
        if cluster is not None:
            cluster.pod_event(kind, pod)
        if kind is None:
            now = time.monotonic()
            if now - self._relist_signalled >= RELIST_SIGNAL_SECONDS:
                self._relist_signalled = now
                for each in list(self._clusters.values()):
                    each.pods.relisted()

    def close(self) -> None:
        self.host.stop_all()
        for cluster in list(self._clusters.values()):
            cluster.close()
        self.api.close()


def _create(call: Any) -> None:
    try:
        call()
    except Exception as exc:
        if not is_status(exc, 409):
            raise


def _delete(call: Any) -> None:
    """Deleting (or patching) what is already gone is fine."""
    try:
        call()
    except Exception as exc:
        if not is_status(exc, 404):
            raise
