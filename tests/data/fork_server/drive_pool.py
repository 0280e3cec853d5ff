"""Stands in for the agent: starts a WarmPool (the fork server), launches the workers named on the
command line through it, waits for each, and prints one JSON line of what it saw. With `spare` as
the first worker argument, it then waits for the server's spares and launches one more worker (exit
0), which a spare runs; after the pool closes it says which spares are still there. With `prefork`
before that, it does what an agent forked from the agent zygote does: it imports what the zygote
does, then forks its fork server from itself (warm_pool.prefork_server), which the pool takes. With
`helper` after that, it also has the pool fork `python -m report_worker` (exit 5), as the agent has it
fork its shadow loader and its check ranks (WarmPool.launch_module). WARM_IMPORTS (comma-separated)
are the job's warmImports the pool hands its server."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

from stalwart.agents import warm_start
from stalwart.agents.warm_pool import PreforkedServer, WarmPool, prefork_server
from stalwart.cli import zygote
from stalwart.processes import wait_for

out = Path(sys.argv[1])
script = Path(__file__).with_name("report_worker.py")
codes = sys.argv[2:]
preforked = bool(codes) and codes[0] == "prefork"
codes = codes[1:] if preforked else codes
if preforked:
    warm_start.preload(zygote.PRELOAD)
    prefork_server()
with_helper = bool(codes) and codes[0] == "helper"
codes = codes[1:] if with_helper else codes
with_spare = bool(codes) and codes[0] == "spare"
codes = codes[1:] if with_spare else codes
pool = WarmPool(2, log=out / "fork-server.log", imports=[m for m in os.environ.get("WARM_IMPORTS", "").split(",") if m])
took_preforked = isinstance(pool.server, PreforkedServer)
results = []
spares: list[int] = []


def launch(i: int, code: str) -> None:
    env = {**os.environ, "RANK": str(i), "WORKER_EXIT": code, "WORKER_OUT": str(out / f"w{i}.json")}
    proc = pool.launch(["python", str(script)], env, out, out / f"w{i}.log")
    assert proc is not None, "the fork server gave no worker"
    if code == "kill":
        report = out / f"w{i}.json"
        assert wait_for(report.exists, 120, interval=0.01), "the worker never started"
        proc.send_signal(signal.SIGKILL)
    results.append({"pid": proc.pid, "returncode": proc.wait(timeout=60)})


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


try:
    for i, code in enumerate(codes):
        launch(i, code)
    if with_spare:

        def spares_ready() -> bool:
            pool.maintain()
            return len(pool.spares) == pool.size

        assert wait_for(spares_ready, 60, interval=0.05), "the server forked no spares"
        spares = sorted(pool.spares)
        launch(len(codes), "0")
    if with_helper:
        os.chdir(script.parent)  # where `-m report_worker` is found, as `python -m` would
        i = len(results)
        env = {**os.environ, "RANK": str(i), "WORKER_EXIT": "5", "WORKER_OUT": str(out / f"w{i}.json")}
        helper = pool.launch_module("report_worker", [], env, out / f"w{i}.log")
        assert helper is not None, "the fork server gave no helper"
        results.append({"pid": helper.pid, "returncode": helper.wait(timeout=60)})
finally:
    pool.close()
left = [pid for pid in spares if alive(pid)]  # reaped by close(), not zombies
print(
    json.dumps(
        {
            "agent": os.getpid(),
            "server_ready": pool.enabled,
            "preforked": took_preforked,
            "workers": results,
            "spares": spares,
            "left": left,
        }
    )
)
