"""A worker forked by the fork server: writes what it sees, then exits as WORKER_EXIT says."""

import json
import os
import random
import sys
import time

with open(os.environ["WORKER_OUT"], "w") as f:
    json.dump(
        {
            "pid": os.getpid(),
            "ppid": os.getppid(),
            "pgid": os.getpgid(0),
            "rank": os.environ["RANK"],
            "cwd": os.getcwd(),
            "argv0": sys.argv[0],
            "main": __name__,
            "torch_preloaded": "torch" in sys.modules,
            "random": random.random(),
        },
        f,
    )
print(f"rank {os.environ['RANK']} says hello")
if os.environ["WORKER_EXIT"] == "kill":
    time.sleep(120)
sys.exit(int(os.environ["WORKER_EXIT"]))
