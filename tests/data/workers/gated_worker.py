"""A test worker: prints and reports its steps; at each hold step it waits for that step's gate file
(GATES/open-STEP) before going on.

The gates let a test act while the job is known to be at a step (start a follower, read what it
printed) and then let it go on, instead of racing a job of fixed length."""

import sys
import time
from pathlib import Path

from stalwart.agents.worker_sdk import report_step

gates, steps, holds = Path(sys.argv[1]), int(sys.argv[2]), {int(s) for s in sys.argv[3].split(",")}
for step in range(1, steps + 1):
    if step in holds:
        for _ in range(3000):  # bounded: 300 s at most
            if (gates / f"open-{step}").exists():
                break
            time.sleep(0.1)
    loss = 4.0 / step
    print(f"step {step} loss {loss:.3f}", flush=True)
    report_step(step, loss=loss, tokens=128, step_time=0.05)
    time.sleep(0.05)
