"""Fault-injection specs: `KIND:key=value,...`, e.g. `kill-worker:rank=1,step=20`."""

from __future__ import annotations

from enum import Enum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from stalwart import worker_contract as contract
from stalwart.faults.worker_faults import WorkerFaults


class FaultKind(str, Enum):
    KILL_WORKER = "kill-worker"  # SIGKILL one worker process (rank=R)
    KILL_NODE = "kill-node"  # SIGKILL a node's agent and all its workers (node=N: name or slot index)
    # SIGSTOP them instead: a machine that goes silent (kernel hang, power loss) without closing a
    # socket; only its lease can tell.
    FREEZE_NODE = "freeze-node"
    KILL_CONTROLLER = "kill-controller"  # SIGKILL the controller process
    HANG_WORKER = "hang-worker"  # one rank stops before its next collective (worker SDK, SIGUSR2)
    # Every rank stops at `step` in the job's first generation only, waiting to receive from the next
    # rank, which never sends: no rank stands out, so nothing names a suspect (the stop-time checks run).
    HANG_JOB = "hang-job"
    SLOW_WORKER = "slow-worker"  # one rank turns slow: every later step takes longer (SIGRTMIN+1)
    SLOW_DATA = "slow-data"  # one rank's data loading alone turns slow: every later batch waits (SIGRTMIN+2)
    SLOW_OPTIMIZER = "slow-optimizer"  # one rank's optimizer step alone turns slow (SIGRTMIN+3)
    LOSS_SPIKE = "loss-spike"  # the rank's next reported loss is 100x what it computed (SIGRTMIN+4)
    CORRUPT_COMPUTE = "corrupt-compute"  # pre-flight: the node's compute check gives wrong bits
    COLLECTIVE_HANG = "collective-hang"  # pre-flight: the node never joins the collective test
    # A bad machine no check catches: its workers die, with no message, 5 steps into every run.
    BAD_NODE = "bad-node"
    # The first controller dies right after it commits an eviction, before it restarts anything.
    KILL_CONTROLLER_MID_RECOVERY = "kill-controller-mid-recovery"
    # etcd (the one `stalwart run` started) stops answering for `seconds` (SIGSTOP, then SIGCONT),
    # or is SIGKILLed and started again, on its port with its data, no sooner than `seconds` later.
    PAUSE_ETCD = "pause-etcd"
    KILL_ETCD = "kill-etcd"
    # A lost machine comes back (repaired, or one more joined the pool): under `stalwart run
    # --max-nodes`, one more node fits, so a job that shrank (minReplicas) can grow back.
    RESTORE_MACHINE = "restore-machine"

    @property
    def preflight(self) -> bool:
        return self in (FaultKind.CORRUPT_COMPUTE, FaultKind.COLLECTIVE_HANG)

    @property
    def on_etcd(self) -> bool:
        return self in (FaultKind.PAUSE_ETCD, FaultKind.KILL_ETCD)

    @property
    def through_environment(self) -> bool:
        """Faults that act through a process's environment, not through the injector's poll."""
        return self.preflight or self in (
            FaultKind.KILL_CONTROLLER_MID_RECOVERY,
            FaultKind.BAD_NODE,
            FaultKind.HANG_JOB,
        )


class FaultSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: FaultKind
    step: int = Field(default=1, ge=0, description="fire once the job has reached this step")
    rank: int | None = Field(default=None, ge=0)
    node: str | None = None
    seconds: float | None = Field(
        default=None,
        gt=0,
        le=600,
        description="slow-worker, slow-data, slow-optimizer: the delay; pause-etcd (default 10), kill-etcd: how long "
        "etcd is away",
    )
    factor: float | None = Field(
        default=None,
        gt=1,
        le=100,
        description="slow-worker, slow-data, slow-optimizer (instead of seconds): the rank's steps take this "
        "many times its own step time before the fault",
    )
    after: Literal["recovery"] | None = Field(
        default=None,
        description="recovery: fire only once the job has recovered from the faults fired before this "
        "one (their failure handled and its incident closed), so faults in one run never overlap "
        "however fast the steps go",
    )

    def describe(self) -> str:
        target = f" rank={self.rank}" if self.rank is not None else f" node={self.node}" if self.node else ""
        delay = f" +{self.seconds:g}s" if self.seconds is not None else f" x{self.factor:g}" if self.factor else ""
        after = " after recovery" if self.after else ""
        return f"{self.kind.value}{target}{delay} at step {self.step}{after}"


_REQUIRED = {
    FaultKind.KILL_WORKER: "rank",
    FaultKind.KILL_NODE: "node",
    FaultKind.FREEZE_NODE: "node",
    FaultKind.HANG_WORKER: "rank",
    FaultKind.SLOW_WORKER: "rank",
    FaultKind.SLOW_DATA: "rank",
    FaultKind.SLOW_OPTIMIZER: "rank",
    FaultKind.LOSS_SPIKE: "rank",
    FaultKind.CORRUPT_COMPUTE: "node",
    FaultKind.COLLECTIVE_HANG: "node",
    FaultKind.BAD_NODE: "node",
}
_PREFLIGHT_ENV = {
    FaultKind.CORRUPT_COMPUTE: {"STALWART_FAULT_CORRUPT_COMPUTE": "1"},
    FaultKind.COLLECTIVE_HANG: {"STALWART_FAULT_COLLECTIVE_HANG": "1"},
}
BAD_NODE_CRASH_AFTER_STEPS = 5
# Faults the injector fires with a signal that the worker's hooks answer (stalwart.faults.worker_faults).
_WORKER_SIGNAL_FAULTS = (
    FaultKind.HANG_WORKER,
    FaultKind.SLOW_WORKER,
    FaultKind.SLOW_DATA,
    FaultKind.SLOW_OPTIMIZER,
    FaultKind.LOSS_SPIKE,
)
_SLOW_FAULTS = (FaultKind.SLOW_WORKER, FaultKind.SLOW_DATA, FaultKind.SLOW_OPTIMIZER)


def _node_name(node: str) -> str:
    return f"node-{node}" if node.isdigit() else node


def _per_node(faults: list[FaultSpec], table: dict[FaultKind, dict[str, str]]) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for f in faults:
        if f.kind in table and f.node is not None:
            out.setdefault(_node_name(f.node), {}).update(table[f.kind])
    return out


def preflight_fault_env(faults: list[FaultSpec]) -> dict[str, dict[str, str]]:
    """Pre-flight faults as environment for the named nodes' check processes (node index -> node-N)."""
    return _per_node(faults, _PREFLIGHT_ENV)


def node_fault_env(faults: list[FaultSpec]) -> dict[str, dict[str, str]]:
    """Environment for the nodes' agents, whose workers inherit it (node index -> node-N; "*": every
    node, standbys included): the worker faults to arm through the SDK's hook module."""
    signals = any(f.kind in _WORKER_SIGNAL_FAULTS for f in faults)
    hang_at = min((f.step for f in faults if f.kind is FaultKind.HANG_JOB), default=None)
    delays = {f.kind: f.seconds for f in faults if f.seconds is not None}
    factors = {f.kind: f.factor for f in faults if f.factor is not None}
    armed = WorkerFaults(
        signals=signals,
        hang_at_step=hang_at,
        **({"slow_step_seconds": delays[FaultKind.SLOW_WORKER]} if FaultKind.SLOW_WORKER in delays else {}),
        **({"slow_data_seconds": delays[FaultKind.SLOW_DATA]} if FaultKind.SLOW_DATA in delays else {}),
        **({"slow_step_factor": factors[FaultKind.SLOW_WORKER]} if FaultKind.SLOW_WORKER in factors else {}),
        **({"slow_data_factor": factors[FaultKind.SLOW_DATA]} if FaultKind.SLOW_DATA in factors else {}),
        **({"slow_optimizer_seconds": delays[FaultKind.SLOW_OPTIMIZER]} if FaultKind.SLOW_OPTIMIZER in delays else {}),
        **({"slow_optimizer_factor": factors[FaultKind.SLOW_OPTIMIZER]} if FaultKind.SLOW_OPTIMIZER in factors else {}),
    )
    bad = {_node_name(f.node) for f in faults if f.kind is FaultKind.BAD_NODE and f.node is not None}
    out: dict[str, dict[str, str]] = {}
    if signals or hang_at is not None:
        out["*"] = {contract.FAULT_HOOKS: armed.model_dump_json()}
    for node in sorted(bad):
        crashing = armed.model_copy(update={"crash_after_steps": BAD_NODE_CRASH_AFTER_STEPS})
        out[node] = {contract.FAULT_HOOKS: crashing.model_dump_json()}
    return out


CONTROLLER_CRASH_ENV = "STALWART_FAULT_CONTROLLER_CRASH"  # "after-evict"


def controller_fault_env(faults: list[FaultSpec]) -> dict[str, str]:
    """Environment for the first controller process only (the one meant to die)."""
    if any(f.kind is FaultKind.KILL_CONTROLLER_MID_RECOVERY for f in faults):
        return {CONTROLLER_CRASH_ENV: "after-evict"}
    return {}


def parse_fault(text: str) -> FaultSpec:
    """Parse one --inject value; raises ValueError naming the problem."""
    kind, _, params = text.partition(":")
    kinds = ", ".join(k.value for k in FaultKind)
    if kind not in {k.value for k in FaultKind}:
        raise ValueError(f"--inject {text!r}: unknown fault kind {kind!r} (one of: {kinds})")
    fields: dict[str, str] = {}
    for item in filter(None, params.split(",")):
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise ValueError(f"--inject {text!r}: expected key=value, got {item!r}")
        fields[key.strip()] = value.strip()
    try:
        spec = FaultSpec(kind=FaultKind(kind), **fields)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise ValueError(f"--inject {text!r}: {problems}") from None
    if spec.factor is not None and spec.kind not in _SLOW_FAULTS:
        raise ValueError(f"--inject {text!r}: factor= is for slow-worker, slow-data and slow-optimizer only")
    if spec.factor is not None and spec.seconds is not None:
        raise ValueError(f"--inject {text!r}: give seconds= or factor=, not both")
    needed = _REQUIRED.get(spec.kind)
    if needed and getattr(spec, needed) is None:
        raise ValueError(f"--inject {text!r}: {spec.kind.value} needs {needed}=...")
    return spec
