"""Fault-injection specs: `KIND:key=value,...`, e.g. `kill-worker:rank=1,step=20`."""

from __future__ import annotations

from enum import Enum

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from stalwart.agents.worker_sdk import CRASH_AFTER_STEPS_ENV


class FaultKind(str, Enum):
    KILL_WORKER = "kill-worker"  # SIGKILL one worker process (rank=R)
    KILL_NODE = "kill-node"  # SIGKILL a node's agent and all its workers (node=N: name or slot index)
    # SIGSTOP them instead: a machine that goes silent (kernel hang, power loss) without closing a
    # socket; only its lease can tell.
    FREEZE_NODE = "freeze-node"
    KILL_CONTROLLER = "kill-controller"  # SIGKILL the controller process
    HANG_WORKER = "hang-worker"  # one rank stops before its next collective (worker SDK, SIGUSR2)
    SLOW_WORKER = "slow-worker"  # one rank turns slow: every later step takes longer (worker SDK, SIGRTMIN+1)
    CORRUPT_COMPUTE = "corrupt-compute"  # pre-flight: the node's compute check gives wrong bits
    COLLECTIVE_HANG = "collective-hang"  # pre-flight: the node never joins the collective test
    # A bad machine no check catches: its workers die, with no message, 5 steps into every run.
    BAD_NODE = "bad-node"
    # The first controller dies right after it commits an eviction, before it restarts anything.
    KILL_CONTROLLER_MID_RECOVERY = "kill-controller-mid-recovery"

    @property
    def preflight(self) -> bool:
        return self in (FaultKind.CORRUPT_COMPUTE, FaultKind.COLLECTIVE_HANG)

    @property
    def through_environment(self) -> bool:
        """Faults that act through a process's environment, not through the injector's poll."""
        return self.preflight or self in (FaultKind.KILL_CONTROLLER_MID_RECOVERY, FaultKind.BAD_NODE)


class FaultSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: FaultKind
    step: int = Field(default=1, ge=0, description="fire once the job has reached this step")
    rank: int | None = Field(default=None, ge=0)
    node: str | None = None

    def describe(self) -> str:
        target = f" rank={self.rank}" if self.rank is not None else f" node={self.node}" if self.node else ""
        return f"{self.kind.value}{target} at step {self.step}"


_REQUIRED = {
    FaultKind.KILL_WORKER: "rank",
    FaultKind.KILL_NODE: "node",
    FaultKind.FREEZE_NODE: "node",
    FaultKind.HANG_WORKER: "rank",
    FaultKind.SLOW_WORKER: "rank",
    FaultKind.CORRUPT_COMPUTE: "node",
    FaultKind.COLLECTIVE_HANG: "node",
    FaultKind.BAD_NODE: "node",
}
_PREFLIGHT_ENV = {
    FaultKind.CORRUPT_COMPUTE: {"STALWART_FAULT_CORRUPT_COMPUTE": "1"},
    FaultKind.COLLECTIVE_HANG: {"STALWART_FAULT_COLLECTIVE_HANG": "1"},
}
# Set on the node's agent, whose workers inherit it (the worker SDK acts on it).
_NODE_ENV = {FaultKind.BAD_NODE: {CRASH_AFTER_STEPS_ENV: "5"}}


def _per_node(faults: list[FaultSpec], table: dict[FaultKind, dict[str, str]]) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for f in faults:
        if f.kind in table and f.node is not None:
            node = f"node-{f.node}" if f.node.isdigit() else f.node
            out.setdefault(node, {}).update(table[f.kind])
    return out


def preflight_fault_env(faults: list[FaultSpec]) -> dict[str, dict[str, str]]:
    """Pre-flight faults as environment for the named nodes' check processes (node index -> node-N)."""
    return _per_node(faults, _PREFLIGHT_ENV)


def node_fault_env(faults: list[FaultSpec]) -> dict[str, dict[str, str]]:
    """Machine faults as environment for the named nodes' agents (node index -> node-N)."""
    return _per_node(faults, _NODE_ENV)


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
    needed = _REQUIRED.get(spec.kind)
    if needed and getattr(spec, needed) is None:
        raise ValueError(f"--inject {text!r}: {spec.kind.value} needs {needed}=...")
    return spec
