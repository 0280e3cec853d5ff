"""A trivial training worker for the operator tests: reports a step every STEP_SECONDS through the
worker SDK, like a real training script, and exits 0 after --steps steps (bounded either way)."""

import argparse
import os
import time

from stalwart.agents.worker_sdk import report_step

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=100_000)
parser.add_argument("--step-seconds", type=float, default=0.2)
parser.add_argument(
    "--crash-when",
    default=None,
    help="rank 1 exits 3 once the file <this>.g<generation> exists (the test decides when to crash)",
)
args = parser.parse_args()
rank = int(os.environ.get("RANK", "0"))
print(
    f"rank {rank} of {os.environ.get('WORLD_SIZE')} on {os.environ.get('STALWART_NODE')}",
    flush=True,
)
deadline = time.monotonic() + 300  # never outlive a test run
for step in range(1, args.steps + 1):
    if time.monotonic() > deadline:
        break
    time.sleep(args.step_seconds)
    report_step(step, loss=1.0 / step, tokens=128, step_time=args.step_seconds)
    trigger = f"{args.crash_when}.g{os.environ.get('STALWART_GENERATION')}" if args.crash_when else None
    if rank == 1 and trigger and os.path.exists(trigger):
        print(f"RuntimeError: injected crash at step {step} ({trigger})", flush=True)
        raise SystemExit(3)
