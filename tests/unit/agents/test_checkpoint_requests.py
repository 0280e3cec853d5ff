"""The controller's "checkpoint now" from etcd to a worker: the agent's part (CheckpointRequests, on a
real etcd) writes the request file, and the SDK (worker_sdk.checkpoint_requested, in a real worker
process) says yes once, at the step asked for."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from stalwart import worker_contract as contract
from stalwart.agents.checkpoint_requests import CheckpointRequests
from stalwart.logs import get_logger
from stalwart.store import keys
from stalwart.store.client import Store
from stalwart.store.records import CheckpointRequest

WAIT = 60.0


def _until(what: str, served: CheckpointRequests, wake: threading.Event, done: Callable[[], bool]) -> None:
    """Serve on each wake (as the agent's loop does) until `done` holds."""
    deadline = time.monotonic() + WAIT
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        wake.wait(0.2)
        wake.clear()
        served.serve()


def test_the_agent_writes_the_request_for_its_workers_and_removes_it(store: Store, tmp_path: Path) -> None:
    job = f"ckreq-{os.getpid()}"
    early = CheckpointRequest(id="suspend-a", generation=3, step=40, reason="suspend", requested_at=time.time())
    store.put(keys.checkpoint_request(job), early)  # before the agent watches: read once at start
    wake = threading.Event()
    requests = CheckpointRequests(store, job, tmp_path / "node", get_logger("test"), wake=wake.set)
    try:
        requests.watch()
        _until("the early request's file", requests, wake, requests.path.exists)
        assert CheckpointRequest.loads(requests.path.read_bytes()) == early
        later = early.model_copy(update={"id": "suspend-b", "step": 90})
        store.put(keys.checkpoint_request(job), later)
        _until(
            "the newer request's file",
            requests,
            wake,
            lambda: CheckpointRequest.loads(requests.path.read_bytes()).id == "suspend-b",
        )
        store.delete(keys.checkpoint_request(job))  # committed, or the suspension withdrawn
        _until("the file removed", requests, wake, lambda: not requests.path.exists())
    finally:
        store.delete_prefix(keys.job_prefix(job))


WORKER = """
import sys
from stalwart.agents.worker_sdk import checkpoint_requested
print([step for step in range(1, 40) if checkpoint_requested(step)])
"""


def _worker(env: dict[str, str]) -> list[int]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("STALWART_")}
    out = subprocess.run(
        [sys.executable, "-c", WORKER], capture_output=True, text=True, timeout=60, env={**clean, **env}
    )
    assert out.returncode == 0, out.stderr
    return [int(s) for s in out.stdout.strip().strip("[]").split(",") if s.strip()]


def test_a_worker_is_asked_once_at_the_step_named_and_only_in_its_generation(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint-request.json"
    request = CheckpointRequest(id="suspend-c", generation=2, step=25, reason="suspend", requested_at=time.time())
    path.write_text(request.dumps())
    env = {contract.CHECKPOINT_REQUEST: str(path), contract.GENERATION: "2"}
    assert _worker(env) == [25]
    assert _worker({**env, contract.GENERATION: "1"}) == []  # an older generation's worker saves nothing
    assert _worker({contract.GENERATION: "2"}) == []  # outside Stalwart (no file named): never
    path.unlink()
    assert _worker(env) == []  # no request (none asked, or it was withdrawn)
