"""A trivial training worker for the operator tests: reports a step every STEP_SECONDS through the
worker SDK, like a real training script, and exits 0 after --steps steps (bounded either way).
With --checkpoint it keeps a small state where the agent says (STALWART_CHECKPOINT_URI, every
STALWART_CHECKPOINT_INTERVAL steps, through Stalwart's checkpoint engine), resumes from the newest
one, and writes the step it resumed from to <--resumed-to>.g<generation> for the test to read. It
also saves when the platform asks (worker_sdk.checkpoint_requested: the controller does before it
suspends the job), and has no SIGTERM handler of its own: a stopped worker saves nothing."""

import argparse
import os
import time
from pathlib import Path

from stalwart.agents.worker_sdk import checkpoint_requested, report_save, report_step

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=100_000)
parser.add_argument("--step-seconds", type=float, default=0.2)
parser.add_argument(
    "--crash-when",
    default=None,
    help="rank 1 exits 3 once the file <this>.g<generation> exists (the test decides when to crash)",
)
parser.add_argument("--checkpoint", action="store_true", help="save and resume through the checkpoint engine")
parser.add_argument("--resumed-to", default=None, help="file prefix: <this>.g<generation> gets the resumed step")
args = parser.parse_args()
rank = int(os.environ.get("RANK", "0"))
generation = os.environ.get("STALWART_GENERATION")
print(
    f"rank {rank} of {os.environ.get('WORLD_SIZE')} on {os.environ.get('STALWART_NODE')}",
    flush=True,
)
start, state, uri, interval = 0, None, "", 0
if args.checkpoint:
    import torch

    from stalwart import worker_contract as contract
    from stalwart.checkpoint import NoCheckpoint, api

    uri = os.environ[contract.CHECKPOINT_URI]
    interval = contract.int_var(contract.CHECKPOINT_INTERVAL) or 5
    state = {"model": {"w": torch.zeros(64)}}
    try:
        start = api.load(state, uri)
    except NoCheckpoint:
        start = 0
    print(f"resuming from step {start} ({uri})", flush=True)
if args.resumed_to and rank == 0:
    Path(f"{args.resumed_to}.g{generation}").write_text(str(start))
deadline = time.monotonic() + 300  # never outlive a test run
for step in range(start + 1, args.steps + 1):
    if time.monotonic() > deadline:
        break
    time.sleep(args.step_seconds)
    if state is not None:
        state["model"]["w"] += 1.0
        asked = checkpoint_requested(step)
        if step % interval == 0 or asked:
            result = api.save(state, uri, step, blocking=True).wait()
            assert result.committed, result.error
            report_save(result)  # the controller's catalog, and its wait for the asked-for save
            if asked:
                print(f"checkpoint at step {step}, as the platform asked: committed={result.committed}", flush=True)
    report_step(step, loss=1.0 / step, tokens=128, step_time=args.step_seconds)
    trigger = f"{args.crash_when}.g{generation}" if args.crash_when else None
    if rank == 1 and trigger and os.path.exists(trigger):
        print(f"RuntimeError: injected crash at step {step} ({trigger})", flush=True)
        raise SystemExit(3)
