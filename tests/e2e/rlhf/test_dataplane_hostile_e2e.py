"""Hostile peers against a live GRPO job's data plane (`stalwart run`, its own etcd): while the job
runs, every data-plane server (the relay process and the actor's weights publisher) gets
unauthenticated connections claiming a 16 GiB payload, a 1 GiB payload and a 64 MiB header, then 200
that never speak. Each server's RSS (psutil, on the pid its endpoint names) stays within a few MiB,
its thread count within its greeting cap, and the job succeeds with every prompt trained on once."""

from __future__ import annotations

import json
import socket
import struct
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml
from support.orphans import cmdline, started_since, tagged_processes
from support.paths import REPO

from stalwart.rlhf.contract import RELAY_CHANNEL, WEIGHTS_CHANNEL
from stalwart.rlhf.endpoints import DataPlaneEndpoint
from stalwart.rlhf.ledger import history, problems, read
from stalwart.rlhf.server import MAX_GREETING
from stalwart.store import keys
from stalwart.store.client import Store
from stalwart.store.etcd_server import EtcdServer

pytestmark = pytest.mark.timeout(900)
GRPO = REPO / "examples" / "rlhf" / "grpo.yaml"
STEPS = 60
STEP_DELAY = 1.0  # seconds per step on top of the work: the job outlasts the attack (~10 s per server)
WARM_STEPS = 5  # the attack starts once the actor has trained this many steps (its memory has settled)
PREFIX = struct.Struct("!IQ")
MIB = 1 << 20
RSS_SLACK = 16 * MIB  # the actor trains while it is attacked: its own allocations move its RSS a little
THREAD_SLACK = 8  # threads the servers' own work may start meanwhile (etcd clients, torch)
CLAIMS = (PREFIX.pack(200, 16 << 30), PREFIX.pack(200, 1 << 30), PREFIX.pack(64 << 20, 0)) * 3
SILENT = 200


def grpo_job(tmp_path: Path) -> Path:
    doc = yaml.safe_load(GRPO.read_text())
    for role in doc["spec"]["roles"]:
        role["workingDir"] = str(GRPO.parent)
        role["restartScope"] = "Job"
        if role["name"] == "actor":
            role["command"] = ["python", "actor.py", "--steps", str(STEPS), "--step-delay", str(STEP_DELAY)]
        if role["name"] == "rollout":
            role["replicas"], role["standbys"] = 1, 0
    path = tmp_path / "grpo.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def wait_for_endpoint(store: Store, job: str, channel: str, limit: float = 600) -> DataPlaneEndpoint:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        endpoint = store.get(keys.dataplane_endpoint(job, channel), DataPlaneEndpoint)
        if endpoint is not None:
            return endpoint
        time.sleep(0.2)
    pytest.fail(f"no {channel} endpoint within {limit:.0f}s")


def wait_for_steps(ledger: Path, proc: subprocess.Popen[bytes], steps: int, limit: float = 600) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the job ended before the attack"
        if ledger.exists() and len(history(read(ledger)[0])) >= steps:
            return
        time.sleep(0.2)
    pytest.fail(f"the actor did not train {steps} steps within {limit:.0f}s")


def closed(sock: socket.socket) -> None:
    """Until the server closes this connection (bounded by the socket's timeout)."""
    try:
        while sock.recv(65536):
            pass
    except ConnectionResetError:
        pass


def attack(endpoint: DataPlaneEndpoint) -> dict[str, Any]:
    """The attack on one server, with its process's RSS and threads before and at their peak."""
    server = psutil.Process(endpoint.pid)
    rss, threads = server.memory_info().rss, server.num_threads()
    peak = {"rss": rss, "threads": threads}
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak["rss"] = max(peak["rss"], server.memory_info().rss)
            peak["threads"] = max(peak["threads"], server.num_threads())
            stop.wait(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        for claim in CLAIMS:
            with socket.create_connection((endpoint.address, endpoint.port), timeout=60) as sock:
                sock.sendall(claim + b"x" * 4096)
                closed(sock)
        silent = [socket.create_connection((endpoint.address, endpoint.port), timeout=60) for _ in range(SILENT)]
        try:
            for sock in silent:  # beyond the cap at once, the others at the greeting deadline
                closed(sock)
        finally:
            for sock in silent:
                sock.close()
    finally:
        stop.set()
        sampler.join()
    return {"rss": rss, "threads": threads, "peak_rss": peak["rss"], "peak_threads": peak["threads"]}


def test_hostile_peers_leave_every_data_plane_server_bounded_and_the_job_succeeds(
    tmp_path: Path, etcd: EtcdServer
) -> None:
    job = grpo_job(tmp_path)
    name = f"grpo-hostile-{tmp_path.name[-12:].lower().replace('_', '-')}"
    doc = yaml.safe_load(job.read_text())
    doc["metadata"]["name"] = name  # the test's etcd is shared: a name of its own
    job.write_text(yaml.safe_dump(doc))
    summary = tmp_path / "summary.json"
    argv = [sys.executable, "-m", "stalwart.cli.main", "run", str(job), "--workdir", str(tmp_path / "run")]
    argv += ["--summary-json", str(summary), "--timeout", "700", "--etcd", etcd.endpoint]
    before = {p.pid for p in tagged_processes()}
    store = Store(etcd.endpoint)
    with open(tmp_path / "run.out", "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for_steps(tmp_path / "run" / "ledger" / "actor.jsonl", proc, WARM_STEPS)
        endpoints = {channel: wait_for_endpoint(store, name, channel) for channel in (RELAY_CHANNEL, WEIGHTS_CHANNEL)}
        with ThreadPoolExecutor(len(endpoints)) as pool:  # both servers at once
            measured = dict(zip(endpoints, pool.map(attack, endpoints.values()), strict=True))
        code = proc.wait(timeout=800)
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=120)
        store.close()
    output = (tmp_path / "run.out").read_text(errors="replace")
    assert not [cmdline(p) for p in started_since(before)], "stalwart run left processes behind"
    result = json.loads(summary.read_text())
    assert code == 0 and result["snapshot"]["phase"] == "Succeeded", output[-3000:]
    records, _torn = read(tmp_path / "run" / "ledger" / "actor.jsonl")
    assert problems(records) == [] and [r.step for r in history(records)] == list(range(1, STEPS + 1))
    for channel, m in measured.items():
        assert m["peak_rss"] - m["rss"] < RSS_SLACK, (channel, m)
        assert m["peak_threads"] - m["threads"] <= MAX_GREETING + THREAD_SLACK, (channel, m)
