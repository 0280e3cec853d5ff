"""A worker forked by the fork server: writes what it sees, then exits as WORKER_EXIT says."""

import inspect
import json
import os
import random
import sys
import time

from stalwart.dataloader import open_loader  # preloaded by the server: still the function, not its module

out = os.environ["WORKER_OUT"]
with open(out + ".tmp", "w") as f:  # renamed when whole: the driver kills this worker once it sees it
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
            "engine_preloaded": "stalwart.checkpoint.engine" in sys.modules,
            "grpc_loaded": "grpc" in sys.modules,
            "job_imports_preloaded": "wave" in sys.modules and "colorsys" in sys.modules,  # warmImports
            "open_loader_is_the_function": inspect.isfunction(open_loader),
            "random": random.random(),
        },
        f,
    )
os.replace(out + ".tmp", out)
print(f"rank {os.environ['RANK']} says hello")
if os.environ["WORKER_EXIT"] == "kill":
    time.sleep(120)
sys.exit(int(os.environ["WORKER_EXIT"]))
