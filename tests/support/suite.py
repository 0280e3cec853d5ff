"""`make test`'s runner: the type check and the unit tests run beside the end-to-end tests, at a
lower CPU priority, instead of before them; once the unit tests are done, a third lane runs the
end-to-end tests that mostly wait (LATE).

The end-to-end tests leave about a tenth of the two cores idle (their jobs wait on leases, hang
floors and step delays), which is about what mypy and the unit tests need: run beside them, niced,
they take that idle time instead of a minute and a half of their own, and take little from the
end-to-end tests when both want the CPU. After the unit
tests, the two end-to-end workers alone left a fifth of the cores idle: the late lane's tests,
which wait more than they compute, take it, and the two workers have that much less to do.

    .venv/bin/python tests/support/suite.py --workers 3 --e2e-workers 2

The end-to-end tests print to the terminal as usual. mypy's and the unit tests' output goes to
--logs (default .stalwart/test-logs/), with one line here when each ends and the end of its log
if it failed. The exit status is non-zero if any of the three failed. Each session gets its own
shared-memory folder (tests/conftest.py puts its workers' segments under STALWART_SHM_DIR) and
its own process tag (tests/support/orphans.py), so neither sees the other's processes or segments.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from machine import CpuTimes, probe_seconds

REPO = Path(__file__).resolve().parents[2]
LOG_TAIL_LINES = 60
# End-to-end modules that mostly wait (on leases, outages, timeouts, sleeping ranks): run alone they
# used 0.3-0.8 CPU-seconds a second. The late lane runs them, in one
# process at the usual priority, once the unit tests are done; the end-to-end workers skip them.
LATE = (
    "tests/e2e/jobs/test_etcd_outage.py",
    "tests/e2e/agents/test_agent_zygote.py",
    "tests/e2e/agents/test_fork_server.py",
    "tests/e2e/health/test_health_collectives.py",
    "tests/e2e/diagnosis/test_stuck_rank.py",
    "tests/e2e/checkpoint/test_checkpoint_safety.py",
    # Each of these waits out a lease, a restart or a kill.
    "tests/e2e/store/test_lease_expiry.py",
    "tests/e2e/store/test_watch_across_etcd_restarts.py",
    "tests/e2e/runner/test_etcd_supervision.py",
    "tests/e2e/diagnosis/test_diagnosis_service_guard.py",
)


@dataclass
class Phase:
    """One command of the suite: its output to a log (background) or to the terminal."""

    name: str
    argv: list[str]
    log: Path | None  # None: the terminal
    nice: int = 0
    shm_dir: Path | None = None
    after: Phase | None = None  # starts once that phase has ended
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    ended: float | None = None
    _out: IO[bytes] | None = field(default=None, repr=False)

    def start(self) -> None:
        env = dict(os.environ)
        if self.shm_dir is not None:
            self.shm_dir.mkdir(parents=True, exist_ok=True)
            env["STALWART_SHM_DIR"] = str(self.shm_dir)
        if self.log is not None:
            self.log.parent.mkdir(parents=True, exist_ok=True)
            self._out = open(self.log, "wb")
        nice = self.nice
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            self.argv,
            cwd=REPO,
            env=env,
            stdout=self._out,
            stderr=subprocess.STDOUT if self._out is not None else None,
            preexec_fn=(lambda: os.nice(nice)) if nice else None,
        )

    def poll(self) -> int | None:
        assert self.proc is not None
        code = self.proc.poll()
        if code is not None and self.ended is None:
            self.ended = time.monotonic()
            if self._out is not None:
                self._out.close()
        return code

    def wait(self) -> int:
        assert self.proc is not None
        self.proc.wait()
        code = self.poll()
        assert code is not None
        return code

    def stop(self) -> None:
        if self.proc is None:  # never started (the late lane, interrupted before its turn)
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # pytest stops its workers and fixtures on SIGINT
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.poll()

    def summary(self) -> str:
        assert self.proc is not None and self.ended is not None
        verdict = "passed" if self.proc.returncode == 0 else f"FAILED (exit {self.proc.returncode})"
        where = f", log {self.log.relative_to(REPO) if self.log.is_relative_to(REPO) else self.log}" if self.log else ""
        return f"{self.name}: {verdict} in {self.ended - self.started:.0f} s{where}"

    def tail(self) -> str:
        if self.log is None or not self.log.exists():
            return ""
        lines = self.log.read_text(errors="replace").splitlines()
        return "\n".join(lines[-LOG_TAIL_LINES:])


def xdist_args(workers: int) -> list[str]:
    return [] if workers == 0 else ["-n", str(workers), "--dist", "loadgroup"]


def phases(args: argparse.Namespace) -> tuple[list[Phase], Phase]:
    """The background phases (mypy, the unit tests, the late lane after them) and the end-to-end one."""
    bin_dir = Path(sys.executable).parent
    shm_base = Path(os.environ.get("STALWART_SHM_DIR", "/dev/shm"))
    pytest = [sys.executable, "-m", "pytest"]
    if args.record_durations is not None:
        pytest += ["--record-durations", str(args.record_durations)]
    background = [
        Phase("typecheck (mypy)", [str(bin_dir / "mypy")], args.logs / "mypy.log", nice=args.nice),
        Phase(
            "unit tests",
            [*pytest, "tests/unit", "-q", *xdist_args(args.workers)],
            args.logs / "unit.log",
            nice=args.nice,
            shm_dir=shm_base / "stalwart-suite-unit",
        ),
    ]
    late = Phase(
        "end-to-end tests that wait (the late lane)",
        [*pytest, *LATE, "-q"],
        args.logs / "e2e-late.log",
        shm_dir=shm_base / "stalwart-suite-e2e-late",
        after=background[1],
    )
    e2e = Phase(
        "end-to-end tests",
        [*pytest, "tests/e2e", *(f"--ignore={path}" for path in LATE), *xdist_args(args.e2e_workers)],
        None,
        shm_dir=shm_base / "stalwart-suite-e2e",
    )
    return [*background, late], e2e


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=3, help="unit-test workers (0: in one process)")
    parser.add_argument("--e2e-workers", type=int, default=2, help="end-to-end workers (0: in one process)")
    parser.add_argument("--nice", type=int, default=10, help="how much lower the background phases' priority is")
    parser.add_argument("--logs", type=Path, default=REPO / ".stalwart" / "test-logs", help="background logs")
    parser.add_argument(
        "--record-durations",
        metavar="PATH",
        type=Path,
        default=None,
        help="write the tests' durations to PATH (tests/durations.json orders xdist's work: support.schedule)",
    )
    args = parser.parse_args()
    if args.workers < 0 or args.e2e_workers < 0 or not 0 <= args.nice <= 19:
        parser.error("workers must be 0 or more, and --nice from 0 to 19")
    args.logs = args.logs.resolve()
    if args.record_durations is not None:
        args.record_durations = args.record_durations.resolve()

    background, e2e = phases(args)
    print(
        f"mypy and the unit tests run beside the end-to-end tests at nice {args.nice}; "
        f"their output goes to {args.logs}",
        flush=True,
    )
    # Comparable timings: how fast a core is now, and (at the end) how much of the cores the run had.
    print(f"[suite] machine: the speed probe took {probe_seconds():.2f} s (tests/support/machine.py)", flush=True)
    started, cpu_before = time.monotonic(), CpuTimes.now()
    reported: set[str] = set()
    try:
        for phase in [*background, e2e]:
            if phase.after is None:
                phase.start()
        # Bounded by the tests' own timeouts: every phase ends, and a phase waits only for an earlier one.
        while any(phase.proc is None or phase.poll() is None for phase in [*background, e2e]):
            for phase in background:
                if phase.proc is None and phase.after is not None and phase.after.ended is not None:
                    phase.start()
                elif phase.proc is not None and phase.name not in reported and phase.poll() is not None:
                    reported.add(phase.name)
                    print(f"\n[suite] {phase.summary()}", flush=True)
            time.sleep(1.0)
    except KeyboardInterrupt:
        for phase in [e2e, *background]:
            phase.stop()
        print("\n[suite] interrupted", file=sys.stderr)
        return 130

    print(f"\n[suite] {e2e.summary()}")
    for phase in background:
        print(f"[suite] {phase.summary()}")
    cpu_after = CpuTimes.now()
    if cpu_before is not None and cpu_after is not None:
        used = cpu_after.since(cpu_before).describe()
        print(f"[suite] machine: {time.monotonic() - started:.0f} s, {used}")
    failed = [p for p in [*background, e2e] if p.proc is not None and p.proc.returncode != 0]
    for phase in failed:
        if phase.log is not None:
            print(f"\n[suite] the end of {phase.log}:\n{phase.tail()}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
