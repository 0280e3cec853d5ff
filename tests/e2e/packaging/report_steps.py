"""A training script with nothing but the worker side installed: it reports a few steps to its node
agent with the worker SDK, then writes what it ran under (interpreter, where stalwart came from,
whether torch and the control plane were importable) for the test to read."""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from pathlib import Path

from stalwart.agents import worker_sdk
from stalwart.agents.worker_sdk import StepTimer, report_step

STEPS = int(sys.argv[1])
CONTROL_PLANE = ("torch", "fastapi", "uvicorn", "grpc", "pyetcd", "jinja2", "typer", "rich", "boto3")

timer = StepTimer()
for step in range(1, STEPS + 1):
    with timer.phase("data"):
        batch = list(range(step))
    with timer.phase("compute"):
        loss = 1.0 / (step + sum(batch))
    if step == STEPS:
        report_step(step, loss=loss, tokens=16, step_time=timer.step_time())  # the plain call too
    else:
        timer.report(step, loss=loss, tokens=16)
    time.sleep(0.05)  # paces the steps as training would; the test waits for the run's end, not for this

Path("worker-evidence.json").write_text(
    json.dumps(
        {
            "python": list(sys.version_info[:2]),
            "executable": sys.executable,
            "stalwart": worker_sdk.__file__,
            "importable": [name for name in CONTROL_PLANE if importlib.util.find_spec(name) is not None],
            "loaded": [name for name in CONTROL_PLANE if name in sys.modules],
        }
    )
)
