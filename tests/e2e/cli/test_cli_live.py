"""The on-call CLI against a live local run: real etcd, controller, 2 agents × 2 gloo workers, a hang.

One run serves the whole module: `stalwart run tests/data/cli/hang-job.yaml --inject
hang-worker:rank=3,...` hangs rank 3 (on node-1) before its next collective; the job's hang timeout is
set high, so it stays hung while the tests list it, show it, diagnose it, read its logs, drive the
CLI in a real terminal (tmux), and run the README's on-call examples against it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
from support.cli_commands import check_command, stalwart_commands
from support.paths import REPO
from typer.testing import CliRunner

from stalwart.cli.main import app
from stalwart.net import free_port
from stalwart.processes import spawn, stop_process, wait_for
from stalwart.store import Store, credentials, keys
from stalwart.store.etcd_server import EtcdServer
from stalwart.store.nodes import read_nodes
from stalwart.store.records import Assignment, Cordon, JobState, ServiceEndpoint

JOB_FILE = REPO / "tests" / "data" / "cli" / "hang-job.yaml"
JOB = "cli-hang"
HUNG_RANK, HANG_STEP = 3, 8
runner = CliRunner()


@dataclass
class LiveRun:
    endpoint: str
    store: Store
    workdir: Path
    generation: int
    rank_nodes: dict[int, str]  # from the generation's assignment in etcd: what the CLI must agree with

    @property
    def hung_node(self) -> str:
        return self.rank_nodes[HUNG_RANK]


def hung(store: Store, run_output: Path) -> bool:
    """The injected hang has fired and holds: rank 3 stopped one step behind the others (it hangs
    before reporting its step; they report it, then wait for rank 3 in the next collective), and no
    rank has stepped for 3 seconds. A slow moment of a loaded machine is not mistaken for it."""
    if b"[fault] hang-worker" not in run_output.read_bytes():
        return False
    state = store.get(keys.job_state(JOB), JobState)
    if state is None:
        return False
    workers = {
        w.rank: w
        for b in read_nodes(store, JOB).heartbeats.values()
        if b.generation == state.generation
        for w in b.workers
    }
    if sorted(workers) != [0, 1, 2, 3] or any(w.step is None or w.exit_code is not None for w in workers.values()):
        return False
    now = time.time()
    others = max(w.step for r, w in workers.items() if r != HUNG_RANK)  # type: ignore[type-var]
    return (
        workers[HUNG_RANK].step == others - 1  # type: ignore[operator]
        and all(now - (w.last_progress_at or now) > 3 for w in workers.values())
    )


@pytest.fixture(scope="module")
def live_etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    """The live run's own etcd. The session's keeps every job its tests ran, and `node uncordon NODE`
    finds the node's job by itself only where no other job has a node of that name (seen: the
    stuck-rank test's e2e-tiny, run before this module on the same worker)."""
    with EtcdServer(tmp_path_factory.mktemp("cli-etcd") / "data") as server:
        yield server


@pytest.fixture(scope="module")
def live(live_etcd: EtcdServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveRun]:
    etcd = live_etcd
    store = Store(etcd.endpoint)
    store.delete_prefix(keys.job_prefix(JOB))
    workdir = tmp_path_factory.mktemp("cli-live")
    argv = [
        sys.executable,
        "-m",
        "stalwart.cli.main",
        "run",
        str(JOB_FILE),
        "--etcd",
        etcd.endpoint,
        "--workdir",
        str(workdir / "run"),
        "--inject",
        f"hang-worker:rank={HUNG_RANK},step={HANG_STEP}",
        "--timeout",
        "600",
    ]
    with open(workdir / "run.out", "wb") as output:
        proc = spawn(argv, stdout=output)
    try:

        def ready() -> bool:
            return hung(store, workdir / "run.out") or proc.poll() is not None

        if not wait_for(ready, 300, interval=0.5) or proc.poll() is not None:
            pytest.fail("the job never hung:\n" + (workdir / "run.out").read_text(errors="replace")[-3000:])
        state = store.get(keys.job_state(JOB), JobState)
        assert state is not None
        assignment = store.get(keys.generation(JOB, state.generation), Assignment)
        assert assignment is not None
        owners = {n.first_rank + i: n.node for n in assignment.nodes for i in range(n.local_world_size)}
        yield LiveRun(etcd.endpoint, store, workdir, state.generation, owners)
    finally:
        stop_process(proc, grace=60)  # SIGTERM: `stalwart run` stops its controller and agents itself
        store.close()


def stalwart(live: LiveRun, *args: str, etcd: bool = True):  # type: ignore[no-untyped-def]
    result = runner.invoke(app, [*args, *(["--etcd", live.endpoint] if etcd else [])], env={"COLUMNS": "160"})
    assert "Traceback" not in result.output
    return result


def test_jobs_lists_the_running_job(live: LiveRun) -> None:
    # The listing reads no heartbeat: the step is the one the controller copies into the state every few
    # seconds (PROGRESS_PERSIST_SECONDS). Wait for that copy of the hung step, not for time.
    def noted() -> bool:
        state = live.store.get(keys.job_state(JOB), JobState)
        return state is not None and (state.last_step or 0) >= HANG_STEP - 1

    assert wait_for(noted, 120, interval=0.5), live.store.get(keys.job_state(JOB), JobState)
    result = stalwart(live, "jobs", "-o", "json")
    assert result.exit_code == 0, result.output
    row = next(r for r in json.loads(result.stdout) if r["job"] == JOB)
    state = live.store.get(keys.job_state(JOB), JobState)
    assert state is not None
    assert row["phase"] == "Running" and row["generation"] == live.generation and row["restarts"] == state.restarts
    assert (row["nodes_up"], row["nodes_total"]) == (2, 2) and row["step"] >= HANG_STEP - 1
    table = stalwart(live, "jobs").stdout
    assert re.search(rf"{JOB}\s+Running\s+{live.generation}\s+\d+\s+{state.restarts}\s", table), table


def test_status_shows_every_rank_stalled_and_the_one_behind(live: LiveRun) -> None:
    result = stalwart(live, "status", JOB, "-o", "json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    nodes = {n["node"]: n for n in report["nodes"]}
    first, second = live.rank_nodes[0], live.hung_node
    assert nodes[first]["state"] == "up" and nodes[first]["ranks"] == [0, 1]
    assert nodes[second]["state"] == "up" and nodes[second]["ranks"] == [2, 3]
    ranks = {r["rank"]: r for r in report["ranks"]}
    assert {k: r["node"] for k, r in ranks.items()} == live.rank_nodes
    # The hung rank stopped before reporting its last step; the others reported it, then waited for it.
    others = max(r["step"] for k, r in ranks.items() if k != HUNG_RANK)
    assert ranks[HUNG_RANK]["step"] == others - 1
    table = stalwart(live, "status", JOB).stdout
    assert "ranks" in table and "nodes" in table and second in table


def test_diagnose_names_the_node_of_the_hung_rank(live: LiveRun) -> None:
    pytest.importorskip("stalwart.diagnosis.engine", reason="the diagnosis engine is not in this tree yet")
    result = stalwart(live, "diagnose", JOB, "-o", "json", "--timeout", "60")
    assert result.exit_code == 0, result.output
    verdict = json.loads(result.stdout)
    assert verdict["suspects"], verdict
    assert verdict["suspects"][0]["node"] == live.hung_node, verdict["suspects"]
    outliers = [g for g in verdict["stack_groups"] if g["outlier"]]
    assert any(HUNG_RANK in g["ranks"] for g in outliers), verdict["stack_groups"]
    # The same, as a person reads it: the verdict panel, the suspect, the outlier group's node.
    table = stalwart(live, "diagnose", JOB, "--timeout", "60").stdout
    assert live.hung_node in table and "outlier" in table and "stack groups" in table
    published = live.store.get(keys.service("diagnosis"), ServiceEndpoint)  # `stalwart run` hosts the service
    by = f"the diagnosis service at {published.url.rstrip('/')}" if published else "the local engine"
    assert f"diagnosed by {by}" in " ".join(table.split()), table


def test_diagnose_falls_back_to_the_local_engine_when_the_service_is_down(live: LiveRun) -> None:
    pytest.importorskip("stalwart.diagnosis.engine", reason="the diagnosis engine is not in this tree yet")
    down = f"http://127.0.0.1:{free_port('127.0.0.1')}"
    bundle_file = live.workdir / "bundle.json"
    result = stalwart(
        live,
        "diagnose",
        JOB,
        "--diagnosis-url",
        down,
        "-o",
        "json",
        "--timeout",
        "60",
        "--save-bundle",
        str(bundle_file),
    )
    assert result.exit_code == 0, result.output
    assert "diagnosing here" in result.stderr
    assert json.loads(result.stdout)["suspects"][0]["node"] == live.hung_node
    # The evidence it diagnosed, as saved for a ticket: every rank's stack, and where each rank runs.
    bundle = json.loads(bundle_file.read_text())
    assert {int(r): n for r, n in bundle["topology"]["rank_nodes"].items()} == live.rank_nodes
    assert sorted(s["rank"] for s in bundle["stacks"]) == [0, 1, 2, 3] and all(s["text"] for s in bundle["stacks"])
    assert "_injected_hang" in next(s["text"] for s in bundle["stacks"] if s["rank"] == HUNG_RANK)


def test_logs_fetch_a_ranks_output_from_its_node(live: LiveRun) -> None:
    result = stalwart(live, "logs", JOB, "--rank", "0", "--tail", "5", "-o", "json")
    assert result.exit_code == 0, result.output
    [rank0] = json.loads(result.stdout)
    assert rank0["rank"] == 0 and rank0["node"] == live.rank_nodes[0] and rank0["source"] == "agent"
    assert any(line.startswith("step ") for line in rank0["lines"]), rank0["lines"]
    every = json.loads(stalwart(live, "logs", JOB, "-o", "json").stdout)
    assert sorted(r["rank"] for r in every) == [0, 1, 2, 3]


def test_tokens_stay_out_of_listings_and_logs_and_services_listen_on_loopback(live: LiveRun) -> None:
    """The job's token and the diagnosis service's exist (etcd), and no listing, JSON output or log
    of the run shows either; the agents' /metrics and memory stores and the diagnosis service listen
    on 127.0.0.1, not on every interface."""
    job_token = credentials.job_token(live.store, JOB)
    service_token = credentials.service_token(live.store, "diagnosis")
    assert job_token and service_token and job_token != service_token
    outputs = [
        stalwart(live, *args).output
        for args in (("jobs", "-o", "json"), ("status", JOB, "-o", "json"), ("incidents", "-o", "json"), ("jobs",))
    ]
    logs = [f.read_bytes() for f in live.workdir.rglob("*") if f.is_file() and f.stat().st_size < 64 << 20]
    assert len(logs) > 5
    for secret in (job_token, service_token):
        assert not any(secret in out for out in outputs)
        assert not any(secret.encode() in data for data in logs)
    registrations = read_nodes(live.store, JOB).registrations
    published = live.store.get(keys.service("diagnosis"), ServiceEndpoint)
    assert published is not None
    service_port = int(published.url.rsplit(":", 1)[1])
    pids = {r.agent_pid for r in registrations.values()}
    for pid in list(pids):
        pids |= {
            p.pid for p in psutil.Process(pid).children(recursive=True) if "memory_server" in " ".join(p.cmdline())
        }
    pids |= {c.pid for c in psutil.net_connections("tcp") if c.status == "LISTEN" and c.laddr.port == service_port}
    listening = [
        (pid, c.laddr) for pid in pids for c in psutil.Process(pid).net_connections("tcp") if c.status == "LISTEN"
    ]
    ports = {a.port for _, a in listening}
    assert service_port in ports and {r.metrics_port for r in registrations.values()} <= ports
    assert {r.memory_port for r in registrations.values() if r.memory_port} <= ports
    assert {a.ip for _, a in listening} == {"127.0.0.1"}, listening


# -- a real terminal ----------------------------------------------------------------------------


class Tmux:
    """A tmux server of our own (its own socket), one session of a fixed size; killed at the end."""

    def __init__(self, width: int, height: int, env: dict[str, str]) -> None:
        self.socket = f"stalwart-test-{uuid.uuid4().hex[:8]}"
        exports = [f"-e{k}={v}" for k, v in env.items()]
        self.run(
            "new-session", "-d", "-s", "cli", "-x", str(width), "-y", str(height), *exports, "bash --noprofile --norc"
        )
        self.socket_path = Path(self.run("display-message", "-p", "#{socket_path}").strip())

    def run(self, *args: str) -> str:
        proc = subprocess.run(
            ["tmux", "-L", self.socket, *args], capture_output=True, text=True, timeout=30, check=True
        )
        return proc.stdout

    def type(self, line: str) -> None:
        self.run("send-keys", "-t", "cli", line, "Enter")

    def screen(self, colours: bool = False) -> str:
        return self.run("capture-pane", "-t", "cli", "-p", *(["-e"] if colours else []))

    def run_and_read(self, command: str, timeout: float = 60.0) -> str:
        """Clear, run `command`, wait (bounded) for its end marker, return the screen."""
        marker = f"END-{uuid.uuid4().hex[:6]}"
        self.type("clear")
        self.type(f"{command}; echo {marker}-$?")
        assert wait_for(
            lambda: re.search(rf"^{marker}-\d+", self.screen(), re.MULTILINE) is not None, timeout, interval=0.2
        ), self.screen()
        return self.screen()

    def kill(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True, timeout=30, check=False)
        self.socket_path.unlink(missing_ok=True)  # tmux leaves its socket file behind


def test_tables_render_in_a_real_terminal(live: LiveRun) -> None:
    env = {
        "STALWART_ETCD": live.endpoint,
        "TERM": "xterm-256color",
        "PS1": "$ ",
        "STALWART_TEST_SESSION": os.environ["STALWART_TEST_SESSION"],
    }
    cli = f"{shlex.quote(sys.executable)} -m stalwart.cli.main"
    tmux = Tmux(120, 60, env)
    try:
        jobs = tmux.run_and_read(f"{cli} jobs")
        assert re.search(
            r"^\s*job\s+phase\s+gen\s+step\s+restarts\s+ETTR\s+nodes\s+incidents\s+age\s*$", jobs, re.MULTILINE
        ), jobs
        assert re.search(rf"^\s*{JOB}\s+Running\s+{live.generation}\s", jobs, re.MULTILINE), jobs
        assert "━━━━" in jobs and re.search(r"END-\w+-0", jobs)
        status = tmux.run_and_read(f"{cli} status {JOB}")
        assert re.search(r"^\s*rank\s+node\s+health\s+step\s+loss\s+step time\s+last step\s*$", status, re.MULTILINE), (
            status
        )
        rows = re.findall(r"^\s*(\d)\s+(node-\d+)\s+(\w+)\s+(\d+)\s", status, re.MULTILINE)
        assert {int(r): n for r, n, _, _ in rows} == live.rank_nodes, status
        assert "…" not in status  # 120 columns: nothing cut
        # A terminal gets colours: the health column is styled (rich saw a terminal, not a pipe).
        coloured = tmux.screen(colours=True)
        assert re.search(r"\x1b\[[0-9;]*m(stalled|ok)", coloured), coloured[:2000]
    finally:
        tmux.kill()


# -- the README's examples ----------------------------------------------------------------------


def readme_on_call_commands() -> list[list[str]]:
    text = (REPO / "README.md").read_text()
    section = text.split("\n## On call\n", 1)[1].split("\n## ", 1)[0]
    return stalwart_commands(section)


def test_readme_on_call_examples_are_real_commands() -> None:
    commands = readme_on_call_commands()
    assert len(commands) >= 6
    problems = [f"stalwart {' '.join(c)}: {why}" for c in commands if (why := check_command(c))]
    assert not problems, problems


READ_ONLY = {"jobs", "status", "incidents", "incident", "diagnose", "logs", "runbook"}


def test_readme_on_call_examples_run_against_a_live_job(live: LiveRun) -> None:
    """Each example that only reads (the README's job name swapped for the live one) exits 0."""
    ran = []
    for words in readme_on_call_commands():
        if words[0] not in READ_ONLY:
            continue  # evict and check act through the controller; their syntax is checked above
        if words[0] == "diagnose" and importlib.util.find_spec("stalwart.diagnosis.engine") is None:
            continue  # the diagnosis engine is not in this tree yet
        args = [JOB if w == "pretrain-tiny" else w for w in words]
        result = stalwart(live, *args, etcd=words[0] != "runbook")  # runbooks are files, not etcd
        assert result.exit_code == 0, (args, result.output)
        assert result.stdout.strip(), args
        ran.append(words[0])
    assert {"jobs", "status", "incidents", "logs", "runbook"} <= set(ran)


# -- acting through the controller (last: it changes the job) ----------------------------------


def test_on_call_cordons_and_evicts_through_the_controller(live: LiveRun) -> None:
    """Cordon and uncordon a node of the job, then evict the node the diagnosis blames."""
    healthy = live.rank_nodes[0]
    cordoned = stalwart(live, "node", "cordon", healthy, "--job", JOB, "--reason", "on-call test", "--yes")
    assert cordoned.exit_code == 0, cordoned.output
    assert "Done" in cordoned.stdout and live.store.get(keys.cordon(healthy), Cordon) is not None
    uncordoned = stalwart(live, "node", "uncordon", healthy, "--yes")  # the job is found by itself
    assert uncordoned.exit_code == 0, uncordoned.output
    assert live.store.get(keys.cordon(healthy), Cordon) is None

    evicted = stalwart(live, "node", "evict", live.hung_node, "--reason", "hang: outlier stack", "--yes", "-o", "json")
    assert evicted.exit_code == 0, evicted.output
    request = json.loads(evicted.stdout)
    assert request["status"] == "Done" and request["kind"] == "evict" and request["node"] == live.hung_node
    incident_id = request["result"]["incident"]
    shown = json.loads(stalwart(live, "incident", incident_id, "-o", "json").stdout)
    assert shown["node"] == live.hung_node and shown["runbook"] == "machine_fault"
    assert any("hang: outlier stack" in line for line in shown["evidence"])
    listed = json.loads(stalwart(live, "incidents", JOB, "-o", "json").stdout)
    assert incident_id in [i["id"] for i in listed]
