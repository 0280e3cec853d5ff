"""Control-plane scale benchmark (issue 23): N simulated nodes against a real etcd and the real job
controller, on this machine.

    .venv/bin/python bench/bench_control_plane.py                          # 1,000, 3,000, 10,000 nodes
    .venv/bin/python bench/bench_control_plane.py --sizes 1000 --label before --steady 20

For each size, from scratch: a private etcd (stalwart.store.etcd_server, as `stalwart run` starts
it), a job spec of N nodes x 8 workers with 1 s heartbeats (the spec's defaults otherwise), a few
simulator processes holding the nodes (support.scale.simnodes: the real agent's etcd calls and
records, workers simulated by the clock), and the real JobController over a Cluster whose nodes are
those simulated ones (support.scale.controller_host, support.scale.sim_cluster). Then, each phase
bounded in time:

  startup   the controller starts every node; until the job runs and every node's workers step
  steady    a window: etcd's write rate, request mix, bytes, CPU and database growth (psutil and its
            /metrics), the controller's tick time (p50/p99) and memory, the simulators' own CPU,
            event-loop lag and heartbeat gaps (late beats, lapsed leases)
  cli       `stalwart jobs` and `stalwart incidents` against that etcd, timed
  kill      one node goes silent (no beats, lease left to lapse; the cluster still lists it): the
            time to the controller's eviction decision (the incident's detected_at), from the kill
            and from the lease's expiry (its registration's delete event)
  recovery  until the incident closes at the first step after the hot-swap
  hang      every node's progress stops (one node's stacks show the stuck rank): the time to the
            hang incident, beyond the adaptive timeout

Saturation is reported per size: heartbeats that no longer land within 1.5 intervals, leases that
lapsed without a kill, ticks longer than the heartbeat interval, controller crashes, and whether the
simulators themselves ran out of CPU (event-loop lag), so a saturated simulator is not mistaken for
a saturated control plane. Results are merged under --label into --out (JSON), beside the report
(docs/control-plane-scale.md). Every process is stopped at the end of each size.

The harness talks to the control plane only through etcd keys (stalwart.store.keys), records
(stalwart.store.records) and the Cluster interface, so it keeps working when both change.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from support.scale import etcd_metrics  # noqa: E402
from support.scale.hostlink import HostLink, host_for  # noqa: E402
from support.scale.read_probe import probe  # noqa: E402

from stalwart.processes import spawn, stop_process  # noqa: E402
from stalwart.spec import parse_job  # noqa: E402
from stalwart.spec.model import FailureEvent  # noqa: E402
from stalwart.store import Store, keys  # noqa: E402
from stalwart.store.etcd_server import EtcdServer  # noqa: E402
from stalwart.store.records import Incident, JobPhase, JobState  # noqa: E402

JOB = "scale"
OUT = REPO / "docs" / "control-plane-scale.json"
REPORT = REPO / "bench" / "results" / "bench_control_plane.md"


def say(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {message}", flush=True)


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def job_document(nodes: int, args: argparse.Namespace, interval: float, ttl: int) -> dict[str, Any]:
    """The job: N nodes x `procs` workers, 1 s heartbeats, the spec's defaults otherwise (memory
    checkpoints and standby pre-loading on, standbys sized by the binomial rule); the hang floor is
    lowered so that a hang is found within the phase's budget."""
    return {
        "apiVersion": "stalwart.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": JOB},
        "spec": {
            "roles": [
                {
                    "name": "trainer",
                    "replicas": nodes,
                    "processesPerNode": args.procs_per_node,
                    "command": ["python", "train.py"],
                }
            ],
            "faultTolerance": {
                "heartbeatIntervalSeconds": interval,
                "leaseTtlSeconds": ttl,
                "hangTimeoutFloorSeconds": args.hang_floor,
                "hangTimeoutMultiplier": args.hang_multiplier,
            },
        },
    }


class CpuClock:
    """CPU seconds of named processes between two readings, as cores used."""

    def __init__(self, pids: dict[str, list[int]]) -> None:
        self.pids = pids
        self.start = time.monotonic()
        self.base = {name: self._cpu(ps) for name, ps in pids.items()}

    @staticmethod
    def _cpu(pids: list[int]) -> float:
        total = 0.0
        for pid in pids:
            try:
                t = psutil.Process(pid).cpu_times()
                total += t.user + t.system
            except psutil.Error:
                pass
        return total

    def cores(self) -> dict[str, float]:
        elapsed = max(1e-9, time.monotonic() - self.start)
        return {name: round((self._cpu(ps) - self.base[name]) / elapsed, 3) for name, ps in self.pids.items()}


class SizeRun:
    """One size, from a fresh etcd to the last process stopped."""

    def __init__(self, nodes: int, args: argparse.Namespace, root: Path, interval: float, ttl: int) -> None:
        self.n = nodes
        self.interval, self.ttl = interval, ttl
        self.args = args
        self.dir = root / f"n{nodes}"
        self.dir.mkdir(parents=True)
        self.result: dict[str, Any] = {
            "nodes": nodes,
            "heartbeat_interval_s": interval,
            "lease_ttl_s": ttl,
            "phases": {},
            "saturation": [],
            "load_at_start": load(),
        }
        self.etcd: EtcdServer | None = None
        self.store: Store | None = None
        self.sims: list[subprocess.Popen[bytes]] = []
        self.links: list[HostLink] = []
        self.controller: subprocess.Popen[bytes] | None = None
        self.stats_path = self.dir / "controller-stats.json"
        self.spec = parse_job(job_document(nodes, args, interval, ttl), "bench")

    # -- plumbing ------------------------------------------------------------------------------
    def log(self, message: str) -> None:
        say(f"[{self.n:>6} nodes] {message}")

    def env(self) -> dict[str, str]:
        path = os.pathsep.join([str(REPO / "tests"), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        return {**os.environ, "PYTHONPATH": path}

    def start(self) -> None:
        self.etcd = EtcdServer(self.dir / "etcd" / "data").start()
        self.store = Store(self.etcd.endpoint, timeout=30.0)
        self.store.put(keys.job_spec(JOB), json.dumps(self.spec.model_dump(mode="json", by_alias=True)))
        if not self.args.skip_probe:
            self.read_probe()
        if self.args.probe_only:
            return
        sockets = [str(self.dir / f"sim-{i}.sock") for i in range(self.args.sim_procs)]
        for i, sock in enumerate(sockets):
            argv = [
                sys.executable,
                "-m",
                "support.scale.simnodes",
                "--etcd",
                self.etcd.endpoint,
                "--job",
                JOB,
                "--socket",
                sock,
                "--nodes-per-channel",
                str(self.args.nodes_per_channel),
                "--step-time",
                str(self.args.step_time),
                "--first-step-after",
                str(self.args.first_step_after),
                "--bulk-reads",
                str(self.args.bulk_reads),
                "--start-rate",
                str(self.args.start_rate / self.args.sim_procs),
            ]
            with open(self.dir / f"sim-{i}.log", "ab") as out:
                self.sims.append(spawn(argv, env=self.env(), stdout=out))
        for sock, proc in zip(sockets, self.sims, strict=True):
            deadline = time.monotonic() + 60
            while not os.path.exists(sock):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"simulator did not start; see {self.dir}/sim-*.log")
                time.sleep(0.1)
            self.links.append(HostLink(sock, timeout=120.0))
        argv = [
            sys.executable,
            "-m",
            "support.scale.controller_host",
            "--etcd",
            self.etcd.endpoint,
            "--job",
            JOB,
            "--hosts",
            ",".join(sockets),
            "--stats",
            str(self.stats_path),
            *(["--profile-dir", str(self.dir / "tick-profiles")] if self.args.profile_ticks else []),
        ]
        with open(self.dir / "controller.log", "ab") as out:
            self.controller = spawn(argv, env=self.env(), stdout=out)

    def stop(self) -> None:
        if self.controller is not None:
            stop_process(self.controller, grace=5.0)
        for link in self.links:
            try:
                link.call("shutdown")
            except Exception:
                pass
            link.close()
        for proc in self.sims:
            stop_process(proc, grace=10.0)
        if self.store is not None:
            self.store.close()
        if self.etcd is not None:
            self.etcd.stop()
        left = [p for p in psutil.Process().children(recursive=True) if p.is_running()]
        self.result["orphans"] = [" ".join(p.cmdline()[:4]) for p in left if p.status() != psutil.STATUS_ZOMBIE]

    def pids(self) -> dict[str, list[int]]:
        assert self.etcd is not None and self.etcd.proc is not None and self.controller is not None
        return {
            "etcd": [self.etcd.proc.pid],
            "controller": [self.controller.pid],
            "simulators": [p.pid for p in self.sims],
            "bench": [os.getpid()],
        }

    def state(self) -> JobState | None:
        assert self.store is not None
        return self.store.get(keys.job_state(JOB), JobState)

    def incidents(self) -> list[Incident]:
        assert self.store is not None
        return self.store.get_prefix(keys.incidents_prefix(JOB), Incident)

    def summary(self) -> dict[str, Any]:
        total: dict[str, Any] = {
            "nodes": 0,
            "alive": 0,
            "registered": 0,
            "running": 0,
            "stepping": 0,
            "exits": {},
            "read_timeouts": {},
        }
        total["lag_s"] = 0.0
        for link in self.links:
            s = link.call("summary")
            total["lag_s"] = max(total["lag_s"], s["loop_lag_recent_max_s"])
            for k in ("nodes", "alive", "registered", "running", "stepping"):
                total[k] += s[k]
            for part in ("exits", "read_timeouts"):
                for k, v in s.get(part, {}).items():
                    total[part][k] = total[part].get(k, 0) + v
        return total

    def controller_stats(self) -> dict[str, Any]:
        try:
            stats: dict[str, Any] = json.loads(self.stats_path.read_text())
            return stats
        except (FileNotFoundError, json.JSONDecodeError):
            return {"ticks": [], "crashes": []}

    def status_line(self) -> str:
        st, s = self.state(), self.summary()
        cs = self.controller_stats()
        recent = [d for t, d, *_ in cs.get("ticks", []) if t > time.time() - 10]
        crashes = len(cs.get("crashes", []))
        return (
            f"phase {st.phase.value if st else '-'} gen {st.generation if st else '-'}; "
            f"nodes registered {s['registered']}/{s['nodes']}, running {s['running']}, stepping {s['stepping']}"
            + (f", exited {s['exits']}" if s["exits"] else "")
            + (f", reads retried {s['read_timeouts']}" if s["read_timeouts"] else "")
            + (
                f"; tick p50 {pct(recent, 0.5) or 0:.2f}s max {max(recent, default=0):.2f}s"
                if recent
                else "; no tick finished in 10s"
            )
            + f"; simulator lag {s['lag_s']:.2f}s"
            + (f"; controller crashes {crashes}" if crashes else "")
            + f"; load {load()[0]}"
        )

    def wait(self, what: str, done: Callable[[], bool], budget: float) -> bool:
        """Poll `done` until true or the budget is spent, with a progress line every 5 s."""
        start = last = time.monotonic()
        while time.monotonic() - start < budget:
            if done():
                return True
            if time.monotonic() - last >= 5.0:
                last = time.monotonic()
                self.log(f"{what} {time.monotonic() - start:.0f}s: {self.status_line()}")
            time.sleep(0.2)
        return done()

    # -- phases --------------------------------------------------------------------------------
    def read_probe(self) -> None:
        """Before any simulator: one tick's reads, a CLI listing and a generation start at this size."""
        assert self.store is not None
        self.log("read probe: seeding etcd with every node's records and timing the product's reads")
        phase = probe(self.store, self.spec, self.n)
        phase["load"] = load()
        self.result["phases"]["read_probe"] = phase
        for what in (
            "read_nodes",
            "cli_jobs_listing",
            "generation_commit",
            "hang_diagnosis_topology",
            "controller_view_start",
            "tick_observe_decide",
            "eviction_commit",
            "stack_collection",
        ):
            if what in phase and not phase[what]["ok"]:
                self.result["saturation"].append(f"{what} fails at this size: {phase[what]['error'][:160]}")
        unbounded = phase["read_nodes_without_reply_limit"]
        commands = phase["command_check_per_slot"]
        self.log(
            f"read probe: nodes prefix {phase['nodes_prefix_read_unbounded'].get('bytes', 0) / 1e6:.1f} MB, "
            f"read_nodes {'ok' if phase['read_nodes']['ok'] else 'FAILS'} "
            f"({unbounded.get('wall_s')}s without the reply limit); "
            f"per-slot command checks {commands.get('wall_s')}s; "
            f"`stalwart jobs` {'ok' if phase['cli_jobs_listing']['ok'] else 'FAILS'}; "
            f"generation commit {'ok' if phase['generation_commit']['ok'] else 'FAILS'}; "
            f"stack collection {phase['stack_collection_reply_bytes'] / 1e6:.1f} MB; "
            + (
                f"controller view start {phase['controller_view_start'].get('wall_s')}s, "
                f"tick (observe + decide) {phase['tick_observe_decide'].get('wall_s')}s "
                f"in {phase['tick_observe_decide'].get('etcd_calls')} etcd calls; "
                f"tick after {phase.get('tick_after_beats', {}).get('beats_per_tick')} heartbeats "
                f"{phase.get('tick_after_beats', {}).get('wall_s')}s "
                f"({phase.get('tick_after_beats', {}).get('cpu_s')}s of CPU); "
                f"eviction of {phase['eviction_commit'].get('evicted')} nodes "
                f"{'ok' if phase['eviction_commit']['ok'] else 'FAILS'}; "
                f"stack collection {'ok' if phase['stack_collection']['ok'] else 'FAILS'} "
                f"({phase['stack_collection'].get('wall_s')}s); "
                if "tick_observe_decide" in phase
                else ""
            )
            + f"load {load()[0]}"
        )

    def startup(self) -> bool:
        assert self.etcd is not None
        budget = self.args.startup_budget or 60 + 1.5 * self.n / self.args.start_rate
        t0 = time.time()
        before, clock = etcd_metrics.scrape(self.etcd.endpoint), CpuClock(self.pids())
        self.log(f"startup (budget {budget:.0f}s)")

        def running() -> bool:
            st = self.state()
            return bool(st and st.phase is JobPhase.RUNNING and self.summary()["stepping"] >= self.n)

        ok = self.wait("startup", running, budget)
        st, s = self.state(), self.summary()
        t1 = time.time()
        sims = [link.call("stats") for link in self.links]  # everything since the simulators started
        phase = {
            "completed": ok,
            "seconds": round(t1 - t0, 2),
            "budget_s": budget,
            "job_phase": st.phase.value if st else None,
            "generation": st.generation if st else None,
            "nodes": s,
            "etcd": etcd_metrics.window(before, etcd_metrics.scrape(self.etcd.endpoint), t1 - t0),
            "cpu_cores": clock.cores(),
            "simulator_loop_lag_p99_s": max((x["loop_lag_p99_s"] or 0 for x in sims), default=0),
            "simulator_loop_lag_max_s": max((x["loop_lag_max_s"] or 0 for x in sims), default=0),
            "simulator_keepalive_p99_s": max((x["keepalive_p99_s"] or 0 for x in sims), default=0),
            "simulator_put_p99_s": max((x["put_p99_s"] or 0 for x in sims), default=0),
            "simulator_calls": _merge([x["calls"] for x in sims]),
            "simulator_reply_bytes": _merge([x["reply_bytes"] for x in sims]),
            "simulator_errors": _merge([x["errors"] for x in sims]),
            "load": load(),
        }
        if not ok:
            phase["stopped_at"] = self.status_line()
            self.result["saturation"].append(f"startup did not finish in {budget:.0f}s: {phase['stopped_at']}")
        self.result["phases"]["startup"] = phase
        self.log(f"startup {'done' if ok else 'NOT done'} in {phase['seconds']}s")
        return ok

    def steady(self) -> None:
        assert self.etcd is not None
        seconds = self.args.steady
        self.log(f"steady window ({seconds:.0f}s)")
        la0 = load()
        for link in self.links:
            link.call("stats", reset=True)
        before, clock, t0 = etcd_metrics.scrape(self.etcd.endpoint), CpuClock(self.pids()), time.time()
        cs0 = self.controller_stats()
        self.wait("steady", lambda: False, seconds)
        after, t1 = etcd_metrics.scrape(self.etcd.endpoint), time.time()
        cores = clock.cores()
        sims = [link.call("stats") for link in self.links]
        cs = self.controller_stats()
        ticks = [(t, d, c) for t, d, c in cs.get("ticks", []) if t0 <= t <= t1]
        durations = [d for _, d, _ in ticks]
        cpu = [c for _, _, c in ticks]
        periods = [b[0] - a[0] for a, b in zip(ticks, ticks[1:], strict=False)]
        gaps_p99 = max((s["gap_p99_s"] or 0 for s in sims), default=0)
        lag_p99 = max((s["loop_lag_p99_s"] or 0 for s in sims), default=0)
        beats = sum(s["beats"] for s in sims)
        late = sum(s["late_beats"] for s in sims)
        lease_lost = [n for s in sims for n in s["lease_lost"]]
        st = self.state()
        etcd = etcd_metrics.window(before, after, t1 - t0)
        etcd["cpu_cores_psutil"] = cores["etcd"]
        listings = cs.get("listings", 0) - cs0.get("listings", 0)
        phase: dict[str, Any] = {
            "seconds": round(t1 - t0, 2),
            "load_before": la0,
            "load_after": load(),
            "job_phase": st.phase.value if st else None,
            "etcd": etcd,
            "controller": {
                "ticks": len(durations),
                "tick_p50_s": pct(durations, 0.5),
                "tick_p99_s": pct(durations, 0.99),
                "tick_max_s": max(durations, default=None),
                "tick_cpu_p50_s": pct(cpu, 0.5),  # the tick thread's own CPU (not the watches' threads)
                "tick_cpu_p99_s": pct(cpu, 0.99),
                "loop_period_p50_s": pct(periods, 0.5),
                "loop_period_p99_s": pct(periods, 0.99),
                "cpu_cores": cores["controller"],
                "rss_bytes": cs.get("rss_bytes"),
                "cluster_listings_per_second": listings / (t1 - t0),
                "nodes_per_listing": (cs.get("listed_nodes", 0) - cs0.get("listed_nodes", 0)) / listings
                if listings
                else None,
                "crashes": cs.get("crashes", [])[len(cs0.get("crashes", [])) :],
            },
            "simulators": {
                "cpu_cores": cores["simulators"],
                "processes": len(self.sims),
                "beats_per_second": sum(s["beats_per_second"] for s in sims),
                "cpu_ms_per_beat": 1000 * cores["simulators"] * (t1 - t0) / beats if beats else None,
                "late_beats": late,
                "late_fraction": late / beats if beats else None,
                "gap_p99_s": gaps_p99,
                "gap_max_s": max((s["gap_max_s"] or 0 for s in sims), default=0),
                "keepalive_p99_s": max((s["keepalive_p99_s"] or 0 for s in sims), default=0),
                "put_p99_s": max((s["put_p99_s"] or 0 for s in sims), default=0),
                "loop_lag_p99_s": lag_p99,
                "beat_errors": _merge([s["beat_errors"] for s in sims]),
                "errors": _merge([s["errors"] for s in sims]),
                "calls_per_second": {k: round(v / (t1 - t0), 1) for k, v in _merge([s["calls"] for s in sims]).items()},
                "reply_bytes_per_second": {
                    k: round(v / (t1 - t0)) for k, v in _merge([s["reply_bytes"] for s in sims]).items()
                },
                "exits": _merge([s["exits"] for s in sims]),
                "lease_lost": lease_lost[:20],
                "lease_lost_count": sum(s["lease_lost_count"] for s in sims),
            },
            "bench_cpu_cores": cores["bench"],
        }
        self.result["phases"]["steady"] = phase
        sat = self.result["saturation"]
        expected = self.n + len(st.standbys if st else [])
        if beats < 0.9 * expected * (t1 - t0) / self.interval:
            sat.append(
                f"heartbeats: {beats / (t1 - t0):.0f}/s landed, {expected / self.interval:.0f}/s due "
                f"(p99 gap {gaps_p99:.2f}s)"
            )
        if late:
            sat.append(f"{late} of {beats} heartbeats landed more than 1.5 intervals after the node's previous one")
        if lease_lost:
            sat.append(f"{len(lease_lost)} leases lapsed without a kill (e.g. {', '.join(lease_lost[:3])})")
        if durations and (pct(durations, 0.99) or 0) > self.interval:
            sat.append(f"controller tick p99 {pct(durations, 0.99):.2f}s > the {self.interval:g}s heartbeat interval")
        if not durations:
            sat.append("the controller finished no tick in the window")
        if lag_p99 > 0.5 * self.interval:
            sat.append(f"SIMULATOR saturated: its event loop lagged {lag_p99:.2f}s (p99)")
        if crashes := phase["controller"]["crashes"]:
            sat.append(f"controller crashed: {crashes[0]['error'][:200]}")
        self.log(
            f"steady: etcd {etcd['puts_per_second']:.0f} puts/s, {etcd['ranges_per_second']:.0f} ranges/s, "
            f"{etcd['bytes_out_per_second'] / 1e6:.1f} MB/s out, {cores['etcd']:.2f} cores; "
            f"tick p50 {pct(durations, 0.5) or 0:.3f}s p99 {pct(durations, 0.99) or 0:.3f}s; "
            f"controller {cores['controller']:.2f} cores, rss {(cs.get('rss_bytes') or 0) / 2**20:.0f} MiB; "
            f"simulators {cores['simulators']:.2f} cores, lag p99 {lag_p99:.3f}s; load {load()[0]}"
        )

    def cli(self) -> None:
        assert self.etcd is not None
        out: dict[str, Any] = {}
        stalwart = Path(sys.executable).parent / "stalwart"
        for name, argv in (("jobs", ["jobs"]), ("incidents", ["incidents", JOB])):
            t0 = time.monotonic()
            try:
                proc = subprocess.run(
                    [str(stalwart), *argv, "--etcd", self.etcd.endpoint, "-o", "json"],
                    capture_output=True,
                    text=True,
                    timeout=self.args.cli_timeout,
                )
                lines = (proc.stderr or proc.stdout).strip().splitlines()
                out[name] = {
                    "seconds": round(time.monotonic() - t0, 2),
                    "exit_code": proc.returncode,
                    "error": lines[-1][:300] if proc.returncode and lines else None,
                }
            except subprocess.TimeoutExpired:
                out[name] = {"seconds": None, "exit_code": None, "error": f"timed out after {self.args.cli_timeout}s"}
            self.log(f"cli `stalwart {' '.join(argv)}`: {out[name]}")
            if out[name]["exit_code"] != 0:
                self.result["saturation"].append(f"`stalwart {argv[0]}` failed: {out[name]['error']}")
        out["load"] = load()
        self.result["phases"]["cli"] = out

    def kill(self) -> Incident | None:
        assert self.store is not None
        st = self.state()
        if st is None or st.phase is not JobPhase.RUNNING:
            self.result["phases"]["kill"] = {"skipped": f"job is {st.phase.value if st else 'absent'}"}
            return None
        victim = st.slots[len(st.slots) // 2]
        known = {i.id for i in self.incidents()}
        expired: dict[str, float] = {}
        gone = threading.Event()

        def on_registration(_key: str, value: bytes | None) -> None:
            if value is None and "at" not in expired:
                expired["at"] = time.time()
                gone.set()

        self.store.watch_prefix(keys.node_registration(JOB, victim), on_registration)
        link = self.links[host_for(victim, len(self.links))]
        killed = link.call("kill", node=victim, exited=False)
        budget = self.ttl + 30 + 0.01 * self.n
        self.log(f"killed {victim} (silent; budget {budget:.0f}s)")
        found: list[Incident] = []

        def decided() -> bool:
            found[:] = [
                i
                for i in self.incidents()
                if i.id not in known and (i.node == victim or victim in i.suspects or victim in i.evicted)
            ]
            return bool(found)

        ok = self.wait("kill", decided, budget)
        seen = time.time()
        phase: dict[str, Any] = {"node": victim, "completed": ok, "budget_s": budget, "load": load()}
        expected_expiry = (killed["last_keepalive_sent"] or killed["killed_at"]) + self.ttl
        phase["lease_expected_expiry_after_kill_s"] = round(expected_expiry - killed["killed_at"], 3)
        if "at" in expired:
            phase["lease_expired_after_kill_s"] = round(expired["at"] - killed["killed_at"], 3)
        if ok:
            inc = found[0]
            expiry = expired.get("at", expected_expiry)
            phase.update(
                incident=inc.id,
                failure_class=inc.failure_class.value,
                evidence=inc.evidence[:2],
                kill_to_decision_s=round(inc.detected_at - killed["killed_at"], 3),
                expiry_to_decision_s=round(inc.detected_at - expiry, 3),
                expiry_source="registration delete event" if "at" in expired else "last keep-alive + TTL",
                kill_to_commit_seen_s=round(seen - killed["killed_at"], 3),
            )
            self.log(
                f"decision {inc.failure_class.value} on {victim}: {phase['kill_to_decision_s']}s after the kill, "
                f"{phase['expiry_to_decision_s']}s after the lease expired"
            )
            if phase["expiry_to_decision_s"] > 1.0:
                self.result["saturation"].append(
                    f"eviction decision {phase['expiry_to_decision_s']:.2f}s after the lease expired (> 1 s)"
                )
        else:
            phase["stopped_at"] = self.status_line()
            self.result["saturation"].append(f"no eviction decision within {budget:.0f}s of the kill")
        others = [i for i in self.incidents() if i.id not in known and i not in found]
        phase["other_incidents"] = [f"{i.failure_class.value} {i.node}" for i in others][:20]
        self.result["phases"]["kill"] = phase
        return found[0] if ok else None

    def recovery(self, incident: Incident) -> None:
        assert self.store is not None
        budget = 60 + 0.02 * self.n
        self.log(f"recovery (budget {budget:.0f}s)")
        latest: list[Incident | None] = [None]

        def recovered() -> bool:
            latest[0] = self.store.get(keys.incident(JOB, incident.id), Incident)  # type: ignore[union-attr]
            st = self.state()
            return (
                bool(latest[0] and latest[0].first_step_at is not None and st and st.phase is JobPhase.RUNNING)
                and self.summary()["stepping"] >= self.n
            )

        ok = self.wait("recovery", recovered, budget)
        inc = latest[0]
        phase: dict[str, Any] = {"completed": ok, "budget_s": budget, "load": load()}
        if inc is not None:
            phase["action"] = inc.action
            if inc.restarted_at:
                phase["decision_to_restart_s"] = round(inc.restarted_at - inc.detected_at, 3)
            if inc.first_step_at:
                phase["decision_to_first_step_s"] = round(inc.first_step_at - inc.detected_at, 3)
        if not ok:
            phase["stopped_at"] = self.status_line()
            self.result["saturation"].append(f"the job did not recover within {budget:.0f}s of the eviction")
        self.result["phases"]["recovery"] = phase
        self.log(f"recovery {'done' if ok else 'NOT done'}: {phase}")

    def hang(self) -> None:
        st = self.state()
        if st is None or st.phase is not JobPhase.RUNNING:
            self.result["phases"]["hang"] = {"skipped": f"job is {st.phase.value if st else 'absent'}"}
            return
        # Every node stepping (a node that applies its RUN after the freeze would not be frozen), then
        # a few steps, so the adaptive timeout has step times.
        if not self.wait("hang", lambda: self.summary()["stepping"] >= len(st.slots), 60 + 0.01 * self.n):
            self.result["phases"]["hang"] = {"skipped": "not every node was stepping"}
            return
        time.sleep(3 * self.args.step_time)
        culprit = st.slots[len(st.slots) // 3]
        known = {i.id for i in self.incidents()}
        frozen = [link.call("freeze", culprit=culprit) for link in self.links]
        last = max((f["last_progress_at"] for f in frozen if f["last_progress_at"]), default=None)
        ft = self.spec.spec.fault_tolerance
        timeout = max(ft.hang_timeout_floor_seconds, ft.hang_timeout_multiplier * self.args.step_time)
        budget = timeout + 60 + 0.01 * self.n
        self.log(f"hang: progress stopped, {culprit} stuck (timeout {timeout:g}s, budget {budget:.0f}s)")
        found: list[Incident] = []

        def detected() -> bool:
            found[:] = [i for i in self.incidents() if i.id not in known and i.failure_class is FailureEvent.HANG]
            return bool(found)

        ok = self.wait("hang", detected, budget)
        phase: dict[str, Any] = {"completed": ok, "culprit": culprit, "timeout_s": timeout, "load": load()}
        if ok and last is not None:
            inc = found[0]
            phase.update(
                stall_to_detection_s=round(inc.detected_at - last, 3),
                beyond_timeout_s=round(inc.detected_at - last - timeout, 3),
                detection_to_decision_s=round((inc.diagnosed_at or inc.detected_at) - inc.detected_at, 3),
                suspects=inc.suspects[:5],
                culprit_found=culprit in inc.suspects,
                action=inc.action,
            )
            self.log(
                f"hang detected {phase['stall_to_detection_s']}s after the last progress "
                f"({phase['beyond_timeout_s']}s beyond the timeout); suspects {inc.suspects[:3]}"
            )
        else:
            phase["stopped_at"] = self.status_line()
            self.result["saturation"].append(f"no hang incident within {budget:.0f}s of the stall")
        self.result["phases"]["hang"] = phase

    def run(self) -> dict[str, Any]:
        t0 = time.monotonic()
        try:
            self.start()
            started = False if self.args.probe_only else self.startup()
            if not self.args.probe_only:
                self.steady()
            if not self.args.skip_cli and not self.args.probe_only:
                self.cli()
            if started:
                incident = self.kill()
                if incident is not None:
                    self.recovery(incident)
                    self.hang()
        except Exception as exc:
            self.result["error"] = f"{type(exc).__name__}: {exc}"
            self.log(f"ERROR {self.result['error']}")
        finally:
            if self.links:
                try:  # exits since the steady window's reset (the startup phase holds the ones before)
                    after = self.summary()
                    self.result["exits_after_startup"] = after["exits"]
                    self.result["read_timeouts_after_startup"] = after["read_timeouts"]
                except Exception as exc:
                    self.result["exits_after_startup_error"] = f"{type(exc).__name__}: {exc}"
            cs = self.controller_stats()
            self.result["controller_crashes"] = cs.get("crashes", [])
            self.result["controller_rss_bytes"] = cs.get("rss_bytes")
            self.stop()
        self.result["seconds"] = round(time.monotonic() - t0, 1)
        self.result["load_at_end"] = load()
        if self.result["orphans"]:
            self.log(f"orphans left: {self.result['orphans']}")
        self.log(f"done in {self.result['seconds']}s; saturation: {self.result['saturation'] or 'none seen'}")
        return self.result


def _merge(dicts: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for d in dicts:
        for k, v in d.items():
            out[k] = out.get(k, 0) + v
    return out


def wait_for_load(limit: float, patience: float = 900.0) -> None:
    """On a shared machine: wait a while for a quieter moment (bounded), saying so."""
    if limit <= 0:
        return
    deadline = time.monotonic() + patience
    while os.getloadavg()[0] > limit and time.monotonic() < deadline:
        say(f"waiting for the load average to fall below {limit:g} (now {load()})")
        time.sleep(30)


def per_size(value: str, sizes: list[int], kind: type) -> list[Any]:
    """'1' -> the same for every size; '1,3,10' -> one per size."""
    values = [kind(v) for v in str(value).split(",") if v.strip()]
    if len(values) == 1:
        return values * len(sizes)
    if len(values) != len(sizes):
        raise SystemExit(f"{value!r}: give one value, or one per size ({len(sizes)})")
    return values


def commit() -> dict[str, Any]:
    """The checkout measured: HEAD, and the last commit that changed the product (platform/)."""

    def git(*argv: str) -> str:
        try:
            return subprocess.run(["git", *argv], cwd=REPO, capture_output=True, text=True).stdout.strip()
        except OSError:
            return "unknown"

    return {
        "head": git("rev-parse", "HEAD"),
        "platform": git("log", "-1", "--format=%H %s", "--", "platform"),
        "platform_dirty": bool(git("status", "--porcelain", "platform")),
    }


def _f(value: Any, digits: int = 2, scale: float = 1.0, suffix: str = "") -> str:
    return "-" if value is None else f"{value * scale:.{digits}f}{suffix}"


def short(error: str) -> str:
    """The gist of an error the product met, for a table cell."""
    if m := re.search(r"larger than max \((\d+) vs\. (\d+)\)", error):
        return f"reply {int(m[1]) / 1e6:.1f} MB > the {int(m[2]) / 2**20:.0f} MiB client limit"
    if "request is too large" in error:
        return "etcd: request is too large (> 1.5 MiB)"
    if "too many operations in txn" in error:
        return "etcd: too many operations in txn (> 128)"
    if m := re.search(r"less than or equal to (\d+) \[type=less_than_equal, input_value=(\d+)", error):
        return f"{int(m[2]):,} ranks > the {int(m[1]):,} bound"
    return error.splitlines()[0][:80]


# -- the verdict: bounds, load bands, a baseline -------------------------------------------------

# Issue 42's bounds, per size: (figure, what it is, the largest value that holds).
BOUNDS: tuple[tuple[str, str, float], ...] = (
    ("tick_p99_s", "controller tick p99 (s)", 1.0),
    ("expiry_to_decision_s", "LostNode decision after the lease expired (s)", 1.0),
    ("hang_beyond_timeout_s", "hang found beyond its timeout (s)", 2.0),
    ("agent_timeouts", "agents that timed out reading their assignment", 0.0),
)
AGENT_TIMEOUT = "crashed applying RUN"  # simnodes' exit reason when the RUN command's reads failed (older runs)
# The machine's load per core (1-minute average, the highest sampled during the size's phases):
# figures measured in different bands are not compared (a shared 2-core machine swings from 1 to 40).
LOAD_BANDS: tuple[tuple[str, float], ...] = (("quiet", 1.5), ("busy", 4.0), ("overloaded", float("inf")))


def load_of(size: dict[str, Any]) -> float | None:
    """The highest 1-minute load average recorded while this size's figures were measured."""
    p = size["phases"]
    seen = [p.get("steady", {}).get("load_before"), p.get("steady", {}).get("load_after")]
    seen += [p.get(phase, {}).get("load") for phase in ("read_probe", "startup", "kill", "recovery", "hang")]
    values = [x[0] for x in seen if x]
    return max(values) if values else None


def load_band(load_average: float | None, cpus: int) -> str:
    if load_average is None:
        return "unknown"
    per_core = load_average / max(1, cpus)
    return next(name for name, limit in LOAD_BANDS if per_core < limit)


def figures(size: dict[str, Any]) -> dict[str, float | None]:
    """The bounded figures of one size (None: not measured: the phase did not get there)."""
    p = size["phases"]
    exits: dict[str, int] = {}
    startup = p.get("startup", {}).get("nodes", {})
    for part in (startup.get("exits", {}), size.get("exits_after_startup", {})):
        for reason, count in part.items():
            exits[reason] = exits.get(reason, 0) + count
    # An agent whose assignment read timed out keeps the command and reads again: it timed out all the same.
    retried = sum(startup.get("read_timeouts", {}).values()) + sum(size.get("read_timeouts_after_startup", {}).values())
    # Only a run whose job started had a generation start for an agent to time out in.
    measured = bool(p.get("startup", {}).get("completed")) and "exits_after_startup" in size
    return {
        "tick_p99_s": p.get("steady", {}).get("controller", {}).get("tick_p99_s"),
        "expiry_to_decision_s": p.get("kill", {}).get("expiry_to_decision_s"),
        "hang_beyond_timeout_s": p.get("hang", {}).get("beyond_timeout_s"),
        "agent_timeouts": float(sum(c for r, c in exits.items() if r.startswith(AGENT_TIMEOUT)) + retried)
        if measured
        else None,
    }


def verdict(run: dict[str, Any]) -> list[str]:
    """Each bound a size broke, or could not show (a phase that never got there), as a sentence."""
    broken = []
    for size in run["sizes"]:
        band = load_band(load_of(size), run["machine"]["cpus"])
        for key, what, bound in BOUNDS:
            value = size.get("figures", {}).get(key)
            if value is None:
                broken.append(f"{size['nodes']} nodes: {what} not measured (the phase did not complete)")
            elif value > bound:
                broken.append(
                    f"{size['nodes']} nodes: {what} = {value:g}, over its bound {bound:g} "
                    f"(load {load_of(size)}, {band})"
                )
    return broken


def compare(run: dict[str, Any], baseline: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(ratios to the baseline, refusals): a size measured in another load band than the baseline's
    is refused, not compared."""
    ratios, refused = [], []
    base_sizes = {s["nodes"]: s for s in baseline["sizes"]}
    for size in run["sizes"]:
        base = base_sizes.get(size["nodes"])
        if base is None:
            refused.append(f"{size['nodes']} nodes: the baseline {baseline['label']!r} has no run at this size")
            continue
        now_load, base_load = load_of(size), load_of(base)
        now_band = load_band(now_load, run["machine"]["cpus"])
        base_band = load_band(base_load, baseline["machine"]["cpus"])
        if now_band != base_band or now_band == "unknown":
            refused.append(
                f"{size['nodes']} nodes: this run was measured at load {now_load} ({now_band}), the baseline "
                f"{baseline['label']!r} at load {base_load} ({base_band}): figures from different load bands "
                "are not compared; rerun when the machine's load matches (--wait-load)"
            )
            continue
        for key, what, _bound in BOUNDS:
            a, b = size.get("figures", {}).get(key), base.get("figures") or figures(base)
            was = b.get(key)
            if a is not None and was:
                ratios.append(f"{size['nodes']} nodes: {what} {a:g} vs {was:g} ({a / was:.2f}x the baseline)")
    return ratios, refused


def render_verdict(doc: dict[str, Any]) -> str:
    rows = [
        "| label | nodes | load (band) | tick p99 s | decision after lease expiry s | hang beyond timeout s "
        "| agent timeouts | bounds |",
        "|---|---:|---|---:|---:|---:|---:|---|",
    ]
    for label, run in doc["runs"].items():
        for size in run["sizes"]:
            f = size.get("figures") or figures(size)
            held = [
                "-" if f.get(k) is None else ("holds" if (f[k] or 0) <= bound else "BROKEN") for k, _w, bound in BOUNDS
            ]
            summary = (
                "all hold"
                if set(held) == {"holds"}
                else ", ".join(
                    f"{w.split(' (')[0]}: {h}" for (_k, w, _b), h in zip(BOUNDS, held, strict=True) if h != "holds"
                )
            )
            rows.append(
                f"| {label} | {size['nodes']} | {load_of(size)} ({load_band(load_of(size), run['machine']['cpus'])}) "
                f"| {_f(f.get('tick_p99_s'))} | {_f(f.get('expiry_to_decision_s'))} "
                f"| {_f(f.get('hang_beyond_timeout_s'))} | {_f(f.get('agent_timeouts'), 0)} | {summary} |"
            )
    return "\n".join(rows) + "\n"


def render(doc: dict[str, Any]) -> str:
    """Markdown tables of every label in the results file, side by side per size."""
    rows = [
        "| label | nodes | load | startup | etcd puts/s | etcd ranges/s | etcd MB/s out | etcd cores | db growth MB/s "
        "| tick p50 / p99 s | controller cores / RSS MiB | simulator cores / ms per beat / lag p99 s | late beats "
        "| kill -> decision s (after expiry) | hang beyond timeout s |",
        "|---|---:|---|---|---:|---:|---:|---:|---:|---|---|---|---:|---|---|",
    ]
    probe_rows = [
        "| label | nodes | nodes prefix MB | read_nodes (each tick) | per-slot command checks s (each tick) "
        "| keys-only listing s | `stalwart jobs` | generation commit | stack collection MB | hang topology "
        "| controller view start | tick: observe + decide (etcd calls) | tick after a tick's heartbeats (CPU s) "
        "| eviction of 300 | stack collection |",
        "|---|---:|---:|---|---:|---:|---|---|---:|---|---|---|---|---|---|",
    ]
    for label, run in doc["runs"].items():
        for size in run["sizes"]:
            p = size["phases"]
            st, steady = p.get("startup", {}), p.get("steady", {})
            etcd, ctrl, sims = steady.get("etcd", {}), steady.get("controller", {}), steady.get("simulators", {})
            kill, hang = p.get("kill", {}), p.get("hang", {})
            started = "done in " + _f(st.get("seconds"), 0) + " s" if st.get("completed") else "NOT done"
            rows.append(
                f"| {label} | {size['nodes']} | {steady.get('load_before', ['-'])[0]} | {started} "
                f"| {_f(etcd.get('puts_per_second'), 0)} | {_f(etcd.get('ranges_per_second'), 0)} "
                f"| {_f(etcd.get('bytes_out_per_second'), 1, 1e-6)} | {_f(etcd.get('cpu_cores'))} "
                f"| {_f(etcd.get('db_growth_bytes_per_second'), 2, 1e-6)} "
                f"| {_f(ctrl.get('tick_p50_s'))} / {_f(ctrl.get('tick_p99_s'))} "
                f"| {_f(ctrl.get('cpu_cores'))} / {_f(ctrl.get('rss_bytes'), 0, 2**-20)} "
                f"| {_f(sims.get('cpu_cores'))} / {_f(sims.get('cpu_ms_per_beat'))} / {_f(sims.get('loop_lag_p99_s'))} "
                f"| {_f(sims.get('late_fraction'), 0, 100, '%')} "
                f"| {_f(kill.get('kill_to_decision_s'))} ({_f(kill.get('expiry_to_decision_s'))}) "
                f"| {_f(hang.get('beyond_timeout_s'))} |"
            )
            rp = p.get("read_probe")
            if rp:

                def ok(entry: dict[str, Any]) -> str:
                    return f"ok, {_f(entry.get('wall_s'), 3)} s" if entry["ok"] else "FAILS: " + short(entry["error"])

                probe_rows.append(
                    f"| {label} | {size['nodes']} | {_f(rp['nodes_prefix_read_unbounded'].get('bytes'), 1, 1e-6)} "
                    f"| {ok(rp['read_nodes'])} | {_f(rp['command_check_per_slot'].get('wall_s'), 2)} "
                    f"| {_f(rp['nodes_prefix_keys_only'].get('wall_s'), 3)} | {ok(rp['cli_jobs_listing'])} "
                    f"| {ok(rp['generation_commit'])} | {_f(rp['stack_collection_reply_bytes'], 1, 1e-6)} "
                    f"| {ok(rp['hang_diagnosis_topology'])} "
                    f"| {ok(rp['controller_view_start']) if 'controller_view_start' in rp else '-'} "
                    + (
                        f"| {ok(rp['tick_observe_decide'])} ({rp['tick_observe_decide'].get('etcd_calls', '-')}) "
                        if "tick_observe_decide" in rp
                        else "| - "
                    )
                    + (
                        f"| {ok(rp['tick_after_beats'])} after {rp['tick_after_beats']['beats_per_tick']} "
                        f"({_f(rp['tick_after_beats'].get('cpu_s'), 3)}) "
                        if "tick_after_beats" in rp
                        else "| - "
                    )
                    + f"| {ok(rp['eviction_commit']) if 'eviction_commit' in rp else '-'} "
                    f"| {ok(rp['stack_collection']) if 'stack_collection' in rp else '-'} |"
                )
    return "\n".join(probe_rows) + "\n\n" + "\n".join(rows) + "\n\n" + render_verdict(doc)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description="Control-plane scale benchmark (see the module docstring).")
    parser.add_argument("--sizes", default="1000,3000,10000", help="node counts, comma-separated")
    parser.add_argument("--label", default="before", help="results are stored under this label in --out")
    parser.add_argument("--out", type=Path, default=OUT, help="JSON file the results are merged into")
    parser.add_argument("--procs-per-node", type=int, default=8, help="workers per node (GPUs)")
    parser.add_argument(
        "--interval", default="1", help="heartbeat interval, seconds; one value, or one per size (comma-separated)"
    )
    parser.add_argument(
        "--ttl", default="5", help="node lease TTL, seconds (the spec's default); one value, or one per size"
    )
    parser.add_argument("--step-time", type=float, default=1.0, help="simulated training step time, seconds")
    parser.add_argument(
        "--first-step-after", type=float, default=1.0, help="seconds from a generation's start to its first step"
    )
    parser.add_argument("--hang-floor", type=float, default=10.0, help="faultTolerance.hangTimeoutFloorSeconds")
    parser.add_argument("--hang-multiplier", type=float, default=10.0, help="faultTolerance.hangTimeoutMultiplier")
    parser.add_argument("--sim-procs", type=int, default=2, help="simulator processes")
    parser.add_argument("--nodes-per-channel", type=int, default=100, help="simulated nodes per gRPC channel")
    parser.add_argument(
        "--bulk-reads", type=int, default=4, help="whole-prefix reads each simulator keeps in flight at once"
    )
    parser.add_argument(
        "--start-rate", type=float, default=200.0, help="node agents started per second (machines coming up)"
    )
    parser.add_argument("--steady", type=float, default=30.0, help="steady window, seconds")
    parser.add_argument(
        "--startup-budget", type=float, default=0.0, help="seconds (default: 60 + 1.5 x the time to start every node)"
    )
    parser.add_argument("--cli-timeout", type=float, default=60.0)
    parser.add_argument("--skip-probe", action="store_true", help="do not time the reads on seeded records")
    parser.add_argument(
        "--probe-only", action="store_true", help="only the read probe (no simulators, no controller) at each size"
    )
    parser.add_argument(
        "--wait-load",
        type=float,
        default=0.0,
        help="before each size, wait (up to 15 minutes) for the 1-minute load average to fall below this",
    )
    parser.add_argument(
        "--profile-ticks",
        action="store_true",
        help="run the controller's ticks under cProfile and keep the slowest ones' profiles in the workdir",
    )
    parser.add_argument("--skip-cli", action="store_true", help="do not time `stalwart jobs` and `incidents`")
    parser.add_argument("--workdir", type=Path, default=None, help="keep logs here (default: a temporary folder)")
    parser.add_argument("--render", action="store_true", help="print --out's results as markdown tables and stop")
    parser.add_argument("--labels", default="", help="with --render: only these labels, comma-separated")
    parser.add_argument(
        "--baseline",
        default=None,
        metavar="FILE:LABEL",
        help="compare with a recorded run (ratios); refused, exit 2, when a size's load band differs",
    )
    parser.add_argument(
        "--no-bounds", action="store_true", help="record only: do not exit 1 when a figure is over its bound"
    )
    args = parser.parse_args(argv)
    if args.render:
        doc: dict[str, Any] = json.loads(args.out.read_text())
        if args.labels:
            wanted = [label.strip() for label in args.labels.split(",") if label.strip()]
            if missing := [label for label in wanted if label not in doc["runs"]]:
                raise SystemExit(f"--labels: {missing} not in {args.out} (it has {sorted(doc['runs'])})")
            doc = {"runs": {label: doc["runs"][label] for label in wanted}}
        print(render(doc), end="")
        if args.out == OUT and not args.labels:
            write_report(doc)
        return doc
    baseline = read_baseline(args.baseline) if args.baseline else None  # a bad reference fails before the run
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    intervals = per_size(args.interval, sizes, float)
    ttls = per_size(args.ttl, sizes, int)
    root = args.workdir or Path(tempfile.mkdtemp(prefix="stalwart-scale-"))
    say(f"control-plane scale: sizes {sizes}, label {args.label!r}, logs in {root}; load {load()}")
    results = []
    try:
        for n, interval, ttl in zip(sizes, intervals, ttls, strict=True):
            wait_for_load(args.wait_load)
            results.append(SizeRun(n, args, root, interval, ttl).run())
    finally:
        if args.workdir is None:
            shutil.rmtree(root, ignore_errors=True)
    run = {
        "label": args.label,
        "commit": commit(),
        "command": "python bench/bench_control_plane.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "when": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": {
            "cpus": os.cpu_count(),
            "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
            "python": platform.python_version(),
        },
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "sizes": results,
    }
    for size in results:
        size["figures"] = figures(size)
        size["load_band"] = load_band(load_of(size), run["machine"]["cpus"])
    run["bounds"] = {key: bound for key, _what, bound in BOUNDS}
    run["broken_bounds"] = verdict(run)
    doc = json.loads(args.out.read_text()) if args.out.exists() else {"runs": {}}
    doc["runs"][args.label] = run
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    if args.out == OUT:
        write_report(doc)
    say(f"results under {args.label!r} in {args.out}")
    print(render({"runs": {args.label: run}}), end="")
    failed = 0
    if baseline is not None:
        ratios, refused = compare(run, baseline)
        for line in ratios:
            say(f"against the baseline: {line}")
        if refused:
            for line in refused:
                say(f"REFUSED: {line}")
            failed = 2
    if run["broken_bounds"] and not args.no_bounds:
        for line in run["broken_bounds"]:
            say(f"BOUND BROKEN: {line}")
        failed = failed or 1
    if failed:
        raise SystemExit(failed)
    return run


def write_report(doc: dict[str, Any], path: Path = REPORT) -> None:
    """bench/results' dated report: each recorded run's command, date, load and checkout, then the
    tables (docs/control-plane-scale.md explains the harness and what the figures mean)."""
    lines = [
        "# bench_control_plane: the control plane at scale",
        "",
        f"Written {time.strftime('%Y-%m-%d %H:%M %Z')} from {OUT.relative_to(REPO)}; the harness and the figures are"
        " explained in docs/control-plane-scale.md. Load: the 1-minute load average, the highest seen during a"
        " size's phases (its band per core: quiet under 1.5, busy under 4, overloaded above).",
        "",
    ]
    for label, run in doc["runs"].items():
        cpus = run.get("machine", {}).get("cpus") or 1
        loads = ", ".join(
            f"{size['nodes']} nodes at {_f(load_of(size))} ({load_band(load_of(size), cpus)})"
            for size in run.get("sizes", [])
        )
        head = run.get("commit", {}).get("head", "")[:12] if isinstance(run.get("commit"), dict) else ""
        lines.append(
            f"- **{label}**: {run.get('when', 'date not recorded')}, `{run.get('command', '-')}`"
            + (f", checkout {head}" if head else "")
            + (f"; load {loads}" if loads else "")
        )
    lines += ["", render(doc)]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines))


def read_baseline(reference: str) -> dict[str, Any]:
    """FILE:LABEL (or FILE, when it holds one run) -> that recorded run."""
    path, _, label = reference.rpartition(":") if ":" in reference else (reference, "", "")
    try:
        runs: dict[str, Any] = json.loads(Path(path).read_text())["runs"]
    except (OSError, ValueError, KeyError) as exc:
        raise SystemExit(f"--baseline {reference!r}: cannot read a results file there ({exc})") from None
    if not label and len(runs) == 1:
        label = next(iter(runs))
    if label not in runs:
        raise SystemExit(f"--baseline {reference!r}: no run labelled {label!r} in {path} (it has {sorted(runs)})")
    return dict(runs[label], label=label)


if __name__ == "__main__":
    main()
