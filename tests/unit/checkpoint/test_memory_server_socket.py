"""The memory store serves on a socket its agent already bound (`--listen-fd`): the port is chosen by
binding it, so no other process can take it between the choice and the store's start (seen in a
loaded test suite: a store found its port taken, and the workers asked another program for their
checkpoints)."""

from __future__ import annotations

import http.client
import os
import subprocess
import sys
from pathlib import Path

from stalwart.handover import spawn_listening
from stalwart.processes import stop_process

TOKEN = "the-job-token"
STORE = [sys.executable, "-m", "stalwart.checkpoint.memory_server", "--capacity-gib", "0.1"]


def test_the_store_serves_on_the_socket_it_was_handed(tmp_path: Path) -> None:
    log = tmp_path / "store.log"
    with open(log, "wb") as out:  # as the agent starts it
        proc, port = spawn_listening(
            [*STORE, "--host", "127.0.0.1"],
            "127.0.0.1",
            env={**os.environ, "STALWART_CHECKPOINT_TOKEN": TOKEN},
            stdout=out,
        )
    try:
        # The socket listened before the store started: a request waits in its backlog, never refused.
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        conn.request("GET", "/dirs?prefix=", headers={"Authorization": f"Bearer {TOKEN}"})
        response = conn.getresponse()
        assert (response.status, response.read()) == (200, b"[]")
        conn.close()
        assert f"memory store listening on 127.0.0.1:{port}" in log.read_text()
    finally:
        stop_process(proc, grace=5)


def test_a_descriptor_that_is_not_a_listening_socket_is_refused(tmp_path: Path) -> None:
    with open(tmp_path / "a-file", "wb") as not_a_socket:
        fd = not_a_socket.fileno()
        done = subprocess.run(
            [*STORE, "--listen-fd", str(fd)],
            env={**os.environ, "STALWART_CHECKPOINT_TOKEN": TOKEN},
            pass_fds=[not_a_socket.fileno()],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert done.returncode == 2, done.stderr
    assert f"memory store: --listen-fd {fd}" in done.stderr and "Traceback" not in done.stderr
    neither = subprocess.run([*STORE], capture_output=True, text=True, timeout=120)
    assert neither.returncode == 2 and "--port" in neither.stderr and "--listen-fd" in neither.stderr
