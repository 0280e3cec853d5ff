"""Runs the GRPO example's roles as plain processes on loopback: each role its own world.

A stand-in for what the node agents will do (docs/rlhf.md, "Runtime integration"), kept in the
tests: it starts the relay, the reward, reference and rollout workers and the actor's DDP world,
gives each the torchrun variables and the data-plane contract, and lets a test kill and restart a
role's processes while the other roles keep theirs. Everything it waits for is a state (a ledger
step, a relay count, a process exit), with a bound.

    python -m support.rlhf_job --steps 150 --workdir /tmp/grpo   # (from tests/) the learning curve run
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stalwart.net import free_port
from stalwart.processes import spawn, stop_process
from stalwart.rlhf.contract import DataPlaneContext, dataplane_env
from stalwart.rlhf.ledger import LedgerRecord, StepRecord, history, read
from stalwart.rlhf.relay_client import RelayClient
from stalwart.spec.model import DataPlaneSettings
from support.paths import REPO
from support.ranks import torchrun_env

EXAMPLE = REPO / "examples" / "rlhf"
SCRIPTS = {"actor": "actor.py", "rollout": "rollout.py", "reward": "reward.py", "reference": "reference.py"}


class RoleFailed(RuntimeError):
    """A process the test expected to keep running (or to finish cleanly) did not."""


@dataclass
class RoleProcess:
    role: str
    rank: int
    proc: subprocess.Popen[bytes]
    log: Path


@dataclass
class LocalRlhfJob:
    workdir: Path
    etcd: str
    job: str = "grpo"
    steps: int = 40
    rollouts: int = 2
    actor_ranks: int = 2
    settings: DataPlaneSettings = field(default_factory=DataPlaneSettings)
    actor_args: list[str] = field(default_factory=list)
    checkpoint_interval: int = 5
    token: str = "test-token"
    hold_at: int | None = None  # the actor trains up to this step, then waits (None: runs free)
    procs: dict[tuple[str, int], RoleProcess] = field(default_factory=dict)
    restarts: dict[str, int] = field(default_factory=dict)

    @property
    def ledger(self) -> Path:
        return self.workdir / "ledger" / "actor.jsonl"

    @property
    def hold_file(self) -> Path:
        return self.workdir / "hold"

    @property
    def context(self) -> DataPlaneContext:
        return DataPlaneContext.from_env(dataplane_env(self.job, self.etcd, self.settings, self.token))

    # -- starting and stopping roles ---------------------------------------------------------------
    def start(self) -> LocalRlhfJob:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.hold(self.hold_at)
        self.start_worker("relay", 0)
        self.start_worker("reward", 0)
        self.start_worker("reference", 0)
        for rank in range(self.rollouts):
            self.start_worker("rollout", rank)
        self.start_actor()
        return self

    def start_worker(self, role: str, rank: int) -> None:
        """Workers of a role share no process group: each is its own world of one, RANK naming it."""
        if role == "relay":
            argv = [sys.executable, "-m", "stalwart.rlhf.relay_server", "--exit-grace", "30"]
        else:
            argv = [sys.executable, str(EXAMPLE / SCRIPTS[role])]
        self.start_role(role, rank, 1, argv)

    def start_actor(self) -> None:
        """The actor's DDP world: its own rendezvous (a fresh port each start), ranks from 0."""
        port = free_port()
        argv = [
            sys.executable,
            str(EXAMPLE / SCRIPTS["actor"]),
            "--steps",
            str(self.steps),
            "--checkpoint-interval",
            str(self.checkpoint_interval),
            "--hold-file",
            str(self.hold_file),
            *self.actor_args,
        ]
        for rank in range(self.actor_ranks):
            self.start_role("actor", rank, self.actor_ranks, argv, master_port=port)

    def start_role(
        self, role: str, rank: int, world: int, argv: list[str], *, master_port: int | None = None
    ) -> RoleProcess:
        env = {
            **torchrun_env(rank, world, master_port or free_port()),
            **dataplane_env(self.job, self.etcd, self.settings, self.token),
            "STALWART_CHECKPOINT_URI": str(self.workdir / "checkpoints"),
        }
        log_path = self.workdir / "logs" / f"{role}-{rank}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:
            proc = spawn(argv, env=env, cwd=self.workdir, stdout=log)
        self.procs[(role, rank)] = RoleProcess(role, rank, proc, log_path)
        return self.procs[(role, rank)]

    def kill(self, role: str, rank: int) -> int:
        """SIGKILL one process, as a machine failure would; returns its exit status."""
        entry = self.procs[(role, rank)]
        os.killpg(entry.proc.pid, signal.SIGKILL)
        return entry.proc.wait(timeout=30)

    def pause(self, role: str, rank: int) -> None:
        os.killpg(self.procs[(role, rank)].proc.pid, signal.SIGSTOP)

    def unpause(self, role: str, rank: int) -> None:
        os.killpg(self.procs[(role, rank)].proc.pid, signal.SIGCONT)

    def hold(self, step: int | None) -> None:
        """Let the actor train up to `step` and wait there (None: run free). Written atomically."""
        self.hold_at = step
        if step is None:
            self.hold_file.unlink(missing_ok=True)
            return
        tmp = self.hold_file.with_suffix(".tmp")
        tmp.write_text(str(step))
        tmp.replace(self.hold_file)

    def catch_holding(self, role: str, rank: int, attempts: int = 1000) -> int:
        """Freeze a worker at a moment it holds groups; returns how many. If the actor reaches its
        hold first (the worker was idle at every look), the hold moves on a step and we look again."""
        for _ in range(attempts):
            self.pause(role, rank)
            held = int(self.relay_stats()["holding"].get(f"{role}-{rank}", 0))
            if held:
                return held
            self.unpause(role, rank)
            if self.hold_at is not None and len(self.history()) >= self.hold_at:
                self.hold(self.hold_at + 1)
            time.sleep(0.02)
        raise RoleFailed(f"{role}-{rank} never held a group when looked at\n{self.tails()}")

    def restart_worker(self, role: str, rank: int) -> None:
        self.restarts[role] = self.restarts.get(role, 0) + 1
        self.start_worker(role, rank)

    def restart_actor(self) -> None:
        """A failed actor rank takes its world down: stop the survivors (as an agent does for a role
        restart), then start a new world that resumes from the newest checkpoint."""
        for rank in range(self.actor_ranks):
            entry = self.procs[("actor", rank)]
            stop_process(entry.proc, grace=2.0)
        self.restarts["actor"] = self.restarts.get("actor", 0) + 1
        self.start_actor()

    def stop(self) -> None:
        for entry in self.procs.values():
            stop_process(entry.proc, grace=3.0)

    # -- what the test waits for -------------------------------------------------------------------
    def pids(self, role: str) -> list[int]:
        return sorted(e.proc.pid for (r, _), e in self.procs.items() if r == role)

    def records(self) -> list[LedgerRecord]:
        return read(self.ledger)[0] if self.ledger.exists() else []

    def trained_steps(self) -> int:
        return len([r for r in self.records() if isinstance(r, StepRecord)])

    def history(self) -> list[StepRecord]:
        return history(self.records())

    def relay_stats(self) -> dict[str, Any]:
        client = RelayClient(self.context, "test-observer")
        try:
            return client.stats()
        finally:
            client.close()

    def wait_for(self, what: str, predicate: Callable[[], bool], timeout: float = 300.0) -> None:
        """Poll a state; fail with the roles' log tails if a process died or the bound passed."""
        deadline = time.monotonic() + timeout
        while not predicate():
            dead = [e for e in self.procs.values() if e.proc.poll() not in (None, 0)]
            if dead or time.monotonic() > deadline:
                why = f"died: {[(e.role, e.rank, e.proc.returncode) for e in dead]}" if dead else "timed out"
                raise RoleFailed(f"waiting for {what}: {why}\n{self.tails()}")
            time.sleep(0.2)

    def wait_finished(self, timeout: float = 300.0) -> None:
        """Every process exits 0: the actor after its last step, the others when the relay says done."""
        self.wait_for("every role to finish", lambda: all(e.proc.poll() == 0 for e in self.procs.values()), timeout)

    def tails(self, lines: int = 15) -> str:
        out = []
        for entry in self.procs.values():
            text = entry.log.read_text(errors="replace").splitlines()[-lines:] if entry.log.exists() else []
            out.append(f"--- {entry.role}-{entry.rank} (exit {entry.proc.poll()})\n" + "\n".join(text))
        return "\n".join(out)


def main() -> int:
    """Run the example end to end on a private etcd and print the learning curve's table."""
    from stalwart.store.etcd_server import EtcdServer

    parser = argparse.ArgumentParser(description="run examples/rlhf as local processes, as the tests do")
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--rollouts", type=int, default=2)
    parser.add_argument("--staleness", type=int, default=1)
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with EtcdServer(args.workdir / "etcd") as etcd:
        job = LocalRlhfJob(
            args.workdir,
            etcd.endpoint,
            steps=args.steps,
            rollouts=args.rollouts,
            settings=DataPlaneSettings(max_weight_staleness=args.staleness),
            checkpoint_interval=25,
        ).start()
        try:
            job.wait_finished(timeout=3600)
        finally:
            job.stop()
    print(f"finished {args.steps} steps in {time.monotonic() - started:.0f}s; ledger: {job.ledger}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
