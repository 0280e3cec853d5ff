"""One agent zygote per pytest worker, shared by every local cluster its tests start
(STALWART_AGENT_ZYGOTE=PATH: `python -m stalwart.cli.zygote --listen PATH`, docs/recovery.md).

Each `stalwart run` otherwise starts a zygote of its own: 3.5 CPU-seconds of imports, which its first
node waits for, about fifty times in the end-to-end suite. Attached, a run's zygote is a fork."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from stalwart.cluster.local import agent_env
from stalwart.processes import PipeLines, spawn, stop_process

READY_SECONDS = 300.0  # its imports, on a loaded machine


@contextmanager
def shared_zygote(log: Path) -> Iterator[Path]:
    """A shared zygote, its output to `log`; yields the socket to attach to."""
    folder = Path(tempfile.mkdtemp(prefix="stalwart-zygote-"))  # short: a socket's path has 107 bytes
    socket_path = folder / "zygote.sock"
    with open(log, "ab") as out:
        proc = spawn(
            [sys.executable, "-m", "stalwart.cli.zygote", "--listen", str(socket_path)],
            env=agent_env(),
            stdout=subprocess.PIPE,
            stderr=out,
        )
    try:
        assert proc.stdout is not None
        ready = PipeLines(proc.stdout.fileno()).read(READY_SECONDS)
        assert ready == "ready", f"the shared agent zygote did not start ({ready!r}): {log.read_text()[-2000:]}"
        yield socket_path
    finally:
        stop_process(proc, grace=5.0)
        shutil.rmtree(folder, ignore_errors=True)
