"""`stalwart run`: one job on this machine, with a real etcd, a controller process and node agents.

This process is the supervisor that Kubernetes is on a cluster: it starts etcd (unless given one),
submits the job, keeps one controller process alive until the job ends, and tears everything down.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from pydantic import BaseModel
from rich.console import Console

from stalwart.cluster.local import NODE_FAULTS_ENV, PREFLIGHT_FAULTS_ENV, LocalCluster
from stalwart.faults import (
    EtcdFaults,
    FaultInjector,
    FaultSpec,
    FiredFault,
    controller_fault_env,
    node_fault_env,
    preflight_fault_env,
)
from stalwart.handover import spawn_listening
from stalwart.logs import configure, get_logger
from stalwart.processes import spawn, stop_process
from stalwart.runner.display import ProgressView, summary_view
from stalwart.runner.etcd_outage import EtcdOutage
from stalwart.runner.summary import JobSnapshot, snapshot
from stalwart.spec import TrainingJob
from stalwart.store import keys
from stalwart.store.client import Store, StoreUnavailable
from stalwart.store.credentials import DIAGNOSIS_TOKEN_ENV, new_token, publish_service_token, replace_job_token
from stalwart.store.etcd_server import EtcdServer
from stalwart.store.nodes import read_nodes
from stalwart.store.records import JobPhase, JobState, ServiceEndpoint
from stalwart.styles import terminal_width
from stalwart.telemetry.job_exporter import JobExporter
from stalwart.telemetry.scrape_targets import FILE_NAME as TARGETS_FILE
from stalwart.telemetry.scrape_targets import target_groups, write_targets

POLL_SECONDS = 0.25
TARGETS_SECONDS = 2.0
MAX_CONTROLLER_STARTS = 20


class RunResult(BaseModel):
    job: str
    phase: JobPhase
    workdir: str
    etcd: str
    snapshot: JobSnapshot | None
    faults: list[FiredFault]
    controller_starts: int
    # generation -> node -> agent pid, as seen while the job ran: shows which agents survived.
    agents_by_generation: dict[int, dict[str, int]] = {}
    # role -> its generation -> the pids of its workers seen in it (multi-role jobs): shows which
    # roles' processes a failure left alone.
    role_pids: dict[str, dict[int, list[int]]] = {}


class JobAlreadyExists(RuntimeError):
    pass


def with_etcd_outage(job: TrainingJob, seconds: float) -> TrainingJob:
    """The job with faultTolerance.etcdOutageSeconds set (the command line's --etcd-outage)."""
    ft = job.spec.fault_tolerance.model_copy(update={"etcd_outage_seconds": seconds})
    return job.model_copy(update={"spec": job.spec.model_copy(update={"fault_tolerance": ft})})


class LocalRun:
    def __init__(
        self,
        job: TrainingJob,
        job_file: Path,
        workdir: Path,
        *,
        etcd_endpoint: str | None = None,
        faults: list[FaultSpec] | None = None,
        console: Console | None = None,
        timeout: float = 3600.0,
        metrics_port: int = 0,
        console_port: int | None = None,
        etcd_outage_seconds: float | None = None,
        max_nodes: int | None = None,
    ) -> None:
        """`etcd_outage_seconds`: overrides the job's faultTolerance.etcdOutageSeconds, for the
        runner, the controller and the agents alike (it is submitted with the spec). `max_nodes`: the
        machines the run may use, standbys included (a killed node's machine is lost), so that a job
        can run out of them as on a cluster; None: as many as the job asks for."""
        if max_nodes is not None and max_nodes < job.spec.node_count:
            raise ValueError(
                f"--max-nodes {max_nodes} is fewer than the {job.spec.node_count} nodes the job needs: "
                "it could never start"
            )
        if etcd_outage_seconds is not None:
            job = with_etcd_outage(job, etcd_outage_seconds)
        if etcd_endpoint and any(f.kind.on_etcd for f in faults or []):
            raise ValueError("pause-etcd and kill-etcd act on the etcd that `stalwart run` starts: leave out --etcd")
        self.job = job
        self.job_dir = job_file.resolve().parent
        self.workdir = workdir.resolve()
        self.external_etcd = etcd_endpoint
        self.faults = faults or []
        self.max_nodes = max_nodes
        # Off a terminal (CI, a pipe), lines are not wrapped at 80 columns.
        self.console = console or Console(soft_wrap=True, width=terminal_width())
        self.timeout = timeout
        self.log = get_logger("stalwart.run", job=job.name)
        self.etcd: EtcdServer | None = None
        self.controller: subprocess.Popen[bytes] | None = None
        self.diagnosis: subprocess.Popen[bytes] | None = None
        self.diagnosis_port: int | None = None
        self._diagnosis_token = new_token()  # the controller sends it; `stalwart diagnose` reads it from etcd
        self.metrics_port = metrics_port
        self.job_metrics: JobExporter | None = None
        self.console_port = console_port
        self.web_console: subprocess.Popen[bytes] | None = None
        self.controller_starts = 0
        self.agents_by_generation: dict[int, dict[str, int]] = {}
        self.role_pids: dict[str, dict[int, list[int]]] = {}
        self._interrupted: int | None = None
        self.etcd_faults = EtcdFaults(None)
        self._targets_due = 0.0

    # -- pieces ----------------------------------------------------------------------------------
    def _start_controller(self, endpoint: str) -> None:
        argv = [
            sys.executable,
            "-m",
            "stalwart.cli.main",
            "controller",
            "--job",
            self.job.name,
            "--etcd",
            endpoint,
            "--workdir",
            str(self.workdir),
            "--job-dir",
            str(self.job_dir),
        ]
        env = {
            **os.environ,
            DIAGNOSIS_TOKEN_ENV: self._diagnosis_token,
            PREFLIGHT_FAULTS_ENV: json.dumps(preflight_fault_env(self.faults)),
            NODE_FAULTS_ENV: json.dumps(node_fault_env(self.faults)),
        }
        if self.controller_starts == 0:
            env.update(controller_fault_env(self.faults))
        with open(self.workdir / "controller.log", "ab") as log:
            self.controller = spawn(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
        self.controller_starts += 1

    def _start_diagnosis(self, store: Store, endpoint: str) -> None:
        """Host the diagnosis service, as a cluster would run it, and publish its URL and token in etcd."""
        argv = [sys.executable, "-m", "stalwart.diagnosis.service", "--host", "127.0.0.1", "--etcd", endpoint]
        env = {**os.environ, DIAGNOSIS_TOKEN_ENV: self._diagnosis_token}
        with open(self.workdir / "diagnosis.log", "ab") as log:
            self.diagnosis, port = spawn_listening(argv, "127.0.0.1", env=env, stdout=log, stderr=subprocess.STDOUT)
        self.diagnosis_port = port
        publish_service_token(store, "diagnosis", self._diagnosis_token)
        store.put(
            keys.service("diagnosis"),
            ServiceEndpoint(name="diagnosis", url=f"http://127.0.0.1:{port}", registered_at=time.time()),
        )

    def _start_job_metrics(self, endpoint: str, store: Store) -> str:
        """Host the job-metrics exporter in this process (its own etcd client) and publish its URL."""
        self.job_metrics = JobExporter(Store(endpoint), [self.job.name])
        port = self.job_metrics.start(self.metrics_port, "127.0.0.1")
        url = f"http://127.0.0.1:{port}/metrics"
        store.put(keys.service("job-metrics"), ServiceEndpoint(name="job-metrics", url=url, registered_at=time.time()))
        return url

    def _write_scrape_targets(self, store: Store) -> None:
        services = {"diagnosis": f"127.0.0.1:{self.diagnosis_port}"} if self.diagnosis_port else {}
        if self.job_metrics is not None and self.job_metrics.port is not None:
            services["job-metrics"] = f"127.0.0.1:{self.job_metrics.port}"
        write_targets(self.workdir / TARGETS_FILE, target_groups(read_nodes(store, self.job.name), services))

    def _start_web_console(self, endpoint: str, port: int) -> None:
        """Serve the web console for this run on loopback; the person running the job may act in it."""
        argv = [sys.executable, "-m", "stalwart.cli.main", "console", "--etcd", endpoint, "--port", str(port)]
        with open(self.workdir / "console.log", "ab") as log:
            self.web_console = spawn([*argv, "--anonymous", "operator"], stdout=log, stderr=subprocess.STDOUT)

    def _kill_controller(self) -> int | None:
        if self.controller is None or self.controller.poll() is not None:
            return None
        pid = self.controller.pid
        os.kill(pid, signal.SIGKILL)
        self.controller.wait()
        return pid

    def _submit(self, store: Store) -> None:
        document = self.job.model_dump(mode="json", by_alias=True)
        state = store.get(keys.job_state(self.job.name), JobState)
        if state is not None and not state.phase.terminal:
            raise JobAlreadyExists(f"job {self.job.name!r} is already {state.phase.value} in etcd at {store.endpoint}")
        if state is not None:  # a finished job of the same name: start over
            store.delete_prefix(keys.job_prefix(self.job.name))
        replace_job_token(store, self.job.name)  # before the spec: whoever reads the spec finds the token
        store.put(keys.job_spec(self.job.name), json.dumps(document))

    def _on_signal(self, signum: int, _frame: object) -> None:
        self._interrupted = signum

    # -- the run ---------------------------------------------------------------------------------
    def run(self) -> RunResult:
        self.workdir.mkdir(parents=True, exist_ok=True)
        log_file = open(self.workdir / "run.log", "a")
        configure("INFO", stream=log_file)  # structured logs to the run folder; the terminal is for people
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        cluster: LocalCluster | None = None
        store: Store | None = None
        try:
            if self.external_etcd:
                endpoint = self.external_etcd
            else:
                self.etcd = EtcdServer(self.workdir / "etcd").start()
                self.etcd_faults = EtcdFaults(self.etcd)
                endpoint = self.etcd.endpoint
            store = Store(endpoint)
            self._submit(store)
            self._start_diagnosis(store, endpoint)
            metrics_url = self._start_job_metrics(endpoint, store)
            self._write_scrape_targets(store)
            if self.console_port:
                self._start_web_console(endpoint, self.console_port)
            cluster = LocalCluster(self.job.name, endpoint, self.workdir, self.job_dir)
            if self.max_nodes is not None:
                cluster.limit_machines(self.max_nodes)  # before the controller starts a node
            injector = FaultInjector(self.faults, cluster, self._kill_controller, self.etcd_faults)
            self._start_controller(endpoint)
            self.console.print(
                f"[bold]stalwart run[/] {self.job.name}: {self.job.spec.node_count} nodes × "
                f"{self.job.spec.world_size // max(1, self.job.spec.node_count)} workers, "
                f"etcd {endpoint}, logs in {self.workdir}"
                + (f", console http://127.0.0.1:{self.console_port}" if self.console_port else ""),
                highlight=False,
            )
            self.console.print(
                f"metrics: {metrics_url} (job), every exporter for Prometheus in {self.workdir / TARGETS_FILE}",
                highlight=False,
            )
            snap = self._supervise(store, endpoint, injector)
            phase = snap.phase if snap else JobPhase.FAILED
            if snap is not None:
                self.console.print(summary_view(snap))
            return RunResult(
                job=self.job.name,
                phase=phase,
                workdir=str(self.workdir),
                etcd=endpoint,
                snapshot=snap,
                faults=injector.fired,
                controller_starts=self.controller_starts,
                agents_by_generation=self.agents_by_generation,
                role_pids=self.role_pids,
            )
        finally:
            self.etcd_faults.close()  # a paused etcd answers again: the teardown needs it
            if self.controller is not None:
                stop_process(self.controller, grace=10.0)
            if self.job_metrics is not None:
                self.job_metrics.stop()
                self.job_metrics.collector.store.close()
                if store is not None:
                    try:
                        store.delete(keys.service("job-metrics"))
                    except Exception:
                        pass
            if self.web_console is not None:
                stop_process(self.web_console, grace=5.0)
            if self.diagnosis is not None:
                stop_process(self.diagnosis, grace=5.0)
                if store is not None:
                    try:
                        store.delete(keys.service("diagnosis"))  # the URL would point at nothing now
                        store.delete(keys.service_token("diagnosis"))
                    except Exception:
                        pass
            if cluster is not None:
                cluster.stop_all()
            if store is not None:
                store.close()
            if self.etcd is not None:
                self.etcd.stop()
            for s, handler in previous.items():
                signal.signal(s, handler)
            log_file.close()

    def _supervise(self, store: Store, endpoint: str, injector: FaultInjector) -> JobSnapshot | None:
        deadline = time.monotonic() + self.timeout
        snap: JobSnapshot | None = None
        with ProgressView(self.console) as view:
            limit = self.job.spec.fault_tolerance.etcd_outage_seconds
            outage = EtcdOutage(self.etcd, view.note, limit, may_restart=self.etcd_faults.may_restart)
            while time.monotonic() < deadline:
                if self._interrupted is not None:
                    view.note(f"interrupted (signal {self._interrupted}): stopping the job")
                    break
                try:
                    snap, done = self._watch(store, endpoint, injector, view, snap)
                except StoreUnavailable as exc:
                    if not outage.failed(exc):
                        break
                    done = False
                else:
                    outage.answered()
                if done:
                    break
                time.sleep(POLL_SECONDS)
            else:
                view.note(f"timed out after {self.timeout:.0f}s")
        try:
            snap = snapshot(store, self.job.name) or snap
        except StoreUnavailable:
            pass  # the last picture etcd gave
        if outage.gave_up is not None and snap is not None:  # etcd cannot record it: the summary says it
            update = {"phase": JobPhase.FAILED, "reason": "EtcdUnreachable", "message": outage.gave_up}
            snap = snap.model_copy(update=update)
        return snap

    def _watch(
        self, store: Store, endpoint: str, injector: FaultInjector, view: ProgressView, snap: JobSnapshot | None
    ) -> tuple[JobSnapshot | None, bool]:
        """One look at the job (faults fired, progress shown, the controller kept alive); True when
        the job is over or the controller cannot be kept up."""
        state = store.get(keys.job_state(self.job.name), JobState)
        nodes = read_nodes(store, self.job.name)
        for fired in injector.poll(state, nodes.heartbeats):
            verbs = {"hang": "hung", "slow": "slowed", "freeze": "froze", "pause": "paused"}
            verb = verbs.get(fired.fault.split("-")[0], "killed")
            view.note(f"[fault] {fired.fault}: {verb} {fired.target}")
        snap = snapshot(store, self.job.name, read=(state, nodes)) or snap
        if time.monotonic() >= self._targets_due:  # nodes come and go: keep Prometheus's list current
            self._write_scrape_targets(store)
            self._targets_due = time.monotonic() + TARGETS_SECONDS
        if snap is not None:
            view.update(snap)
            if snap.phase is JobPhase.RUNNING:
                seen = self.agents_by_generation.setdefault(snap.generation, {})
                seen.update({n: pid for n, pid in snap.agents.items() if n in snap.slots})
            for role in (r for r in snap.roles if r.generation and r.pids):
                pids = self.role_pids.setdefault(role.role, {}).setdefault(role.generation, [])
                pids.extend(p for p in role.pids if p not in pids)
        assert self.controller is not None
        if self.controller.poll() is not None:
            state = store.get(keys.job_state(self.job.name), JobState)  # as of now, not of the loop's start
            if state is not None and state.phase.terminal:
                return snap, True
            if self.controller_starts >= MAX_CONTROLLER_STARTS:
                view.note("the controller keeps exiting; giving up (see controller.log)")
                return snap, True
            self.log.warning("controller exited; starting a new one", fields={"code": self.controller.returncode})
            self._start_controller(endpoint)
        return snap, False
