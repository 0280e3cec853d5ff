"""A test worker: records its torchrun environment, reports a step, then sleeps or exits."""

import json
import os
import sys
import time

from stalwart.agents.worker_sdk import report_step

names = [
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "STALWART_GENERATION",
    "STALWART_NODE",
    "OMP_NUM_THREADS",
]
out = os.path.join(os.environ["OUT_DIR"], f"rank-{os.environ['RANK']}-gen-{os.environ['STALWART_GENERATION']}.json")
with open(out + ".tmp", "w") as f:
    json.dump({"pid": os.getpid(), **{n: os.environ.get(n) for n in names}}, f)
os.rename(out + ".tmp", out)
report_step(7, loss=1.5, tokens=100, step_time=0.5)
print(f"rank {os.environ['RANK']} says goodbye", flush=True)
code = int(os.environ.get("EXIT_CODE", "-1"))
if code >= 0 and os.environ["RANK"] == os.environ.get("EXIT_RANK", os.environ["RANK"]):
    sys.exit(code)
for _ in range(600):  # bounded: 60 s at most
    time.sleep(0.1)
