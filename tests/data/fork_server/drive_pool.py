"""Stands in for the agent: starts a WarmPool (the fork server), launches the workers named on the
command line through it, waits for each, and prints one JSON line of what it saw."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

from stalwart.agents.warm_pool import WarmPool
from stalwart.processes import wait_for

out = Path(sys.argv[1])
script = Path(__file__).with_name("report_worker.py")
pool = WarmPool(2, log=out / "fork-server.log")
results = []
try:
    for i, code in enumerate(sys.argv[2:]):
        env = {**os.environ, "RANK": str(i), "WORKER_EXIT": code, "WORKER_OUT": str(out / f"w{i}.json")}
        proc = pool.launch(["python", str(script)], env, out, out / f"w{i}.log")
        assert proc is not None, "the fork server gave no worker"
        if code == "kill":
            report = out / f"w{i}.json"
            assert wait_for(report.exists, 120, interval=0.01), "the worker never started"
            proc.send_signal(signal.SIGKILL)
        results.append({"pid": proc.pid, "returncode": proc.wait(timeout=60)})
finally:
    pool.close()
print(json.dumps({"agent": os.getpid(), "server_ready": pool.enabled, "workers": results}))
