"""Run one test (or a few) many times, optionally under CPU load, to find flakes.

A test that passes alone and fails when the machine is busy depends on timing: that is a defect
(tests wait for states, never for time). Examples:

    .venv/bin/python tests/support/flakes.py tests/e2e/operator/test_operator_e2e.py --runs 5
    .venv/bin/python tests/support/flakes.py "tests/e2e/jobs/test_jobs.py::test_a_slow_rank_gets_its_node_evicted" \\
        --runs 10 --load 2

`--load N` keeps N busy-looping processes running beside the test (bounded: they stop with the
run). Each failing run's output is kept under --keep (default .stalwart/flakes/).
"""

from __future__ import annotations

import argparse
import multiprocessing
import subprocess
import sys
import time
from pathlib import Path


def _burn(stop_at: float) -> None:
    """Busy work until the deadline: a competing process that wants a whole core."""
    x = 0
    while time.time() < stop_at:
        for _ in range(100_000):
            x += 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("tests", nargs="+", help="pytest node ids or files")
    parser.add_argument("--runs", type=int, default=10, help="how many times to run them (default 10)")
    parser.add_argument("--load", type=int, default=0, help="busy processes beside the tests (default 0)")
    parser.add_argument("--stop-on-failure", action="store_true", help="stop at the first failing run")
    parser.add_argument("--keep", type=Path, default=Path(".stalwart/flakes"), help="where failing runs' output goes")
    parser.add_argument("--max-hours", type=float, default=4.0, help="the load stops after this long at most")
    args = parser.parse_args()
    if args.runs < 1 or args.load < 0:
        parser.error("--runs must be at least 1 and --load at least 0")
    args.keep.mkdir(parents=True, exist_ok=True)
    burners = [
        multiprocessing.Process(target=_burn, args=(time.time() + args.max_hours * 3600,), daemon=True)
        for _ in range(args.load)
    ]
    for b in burners:
        b.start()
    failures: list[int] = []
    try:
        for run in range(1, args.runs + 1):
            started = time.monotonic()
            proc = subprocess.run(
                [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args.tests],
                capture_output=True,
                text=True,
            )
            took = time.monotonic() - started
            verdict = "passed" if proc.returncode == 0 else f"FAILED (exit {proc.returncode})"
            print(f"run {run}/{args.runs}: {verdict} in {took:.0f}s", flush=True)
            if proc.returncode != 0:
                failures.append(run)
                log = args.keep / f"run-{run}.log"
                log.write_text(proc.stdout + proc.stderr)
                print(f"  output: {log}", flush=True)
                if args.stop_on_failure:
                    break
    finally:
        for b in burners:
            b.terminate()
            b.join(timeout=5)
    runs = failures[-1] if args.stop_on_failure and failures else args.runs
    print(f"{runs - len(failures)} passed, {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
