"""The failure ladder as pure functions: what happened (an event and its suspects) and what to do.

The controller and the simulator both decide through `decide`, so the ETTR the simulator reports
is the ETTR of the policy the controller runs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from stalwart.runbooks import EVENT_RUNBOOKS
from stalwart.spec.model import INFRASTRUCTURE_EVENTS, FailureAction, FailureEvent, FailurePolicy, FaultTolerance
from stalwart.store.records import WorkerStatus

# Signature classes that condemn the machine they appear on (scope "node" in signatures.yaml).
MACHINE_CLASSES = frozenset({"xid", "ecc_error", "disk_full", "cuda_error", "gpu_lost", "nic_down"})
USER_CODE_SCOPE = "user_code"


@dataclass
class Classified:
    """What a failure is, who is suspected, and the lines that say so."""

    event: FailureEvent
    suspects: list[str] = field(default_factory=list)
    evidence: list[str] = field(default_factory=list)
    runbook: str = ""
    rank: int | None = None
    exit_code: int | None = None
    verdict: dict[str, Any] | None = None  # the diagnosis verdict, when one was asked
    diagnosed_at: float | None = None

    def __post_init__(self) -> None:
        self.runbook = self.runbook or EVENT_RUNBOOKS[self.event]


def classify_crash(crashed: Sequence[tuple[str, WorkerStatus]]) -> Classified:
    """Classify the workers that exited non-zero, from their agents' verdicts (signature classes).

    `crashed` is in exit order: the first is the root, the rest are usually its victims (peers
    that lost their connection to it). A machine signature anywhere names its node. NaN and loss
    spikes are the job's. A Python exception at the root, with no machine signature anywhere, is
    the user's code: never a machine's fault. Anything else (a SIGKILL, a segfault with no trace)
    is a plain worker crash.
    """
    if not crashed:
        raise ValueError("classify_crash needs at least one crashed worker")
    first_node, first = crashed[0]

    def lines(ws: Sequence[tuple[str, WorkerStatus]]) -> list[str]:
        return [f"rank {w.rank} on {n}: {w.failure_reason or f'exit {w.exit_code}'}" for n, w in ws][:20]

    machine = [(n, w) for n, w in crashed if w.failure_class in MACHINE_CLASSES]
    if machine:
        suspects = sorted({n for n, _ in machine})
        return Classified(
            FailureEvent.MACHINE_FAULT,
            suspects,
            lines(machine),
            machine[0][1].failure_class or "",
            machine[0][1].rank,
            machine[0][1].exit_code,
        )
    for cls, event in (("nan_loss", FailureEvent.NAN_LOSS), ("loss_spike", FailureEvent.LOSS_SPIKE)):
        hit = [(n, w) for n, w in crashed if w.failure_class == cls]
        if hit:
            return Classified(event, [], lines(hit), rank=hit[0][1].rank, exit_code=hit[0][1].exit_code)
    user = [(n, w) for n, w in crashed if w.blame_scope == USER_CODE_SCOPE]
    if first.blame_scope == USER_CODE_SCOPE:
        tail = list(user[0][1].log_tail[-12:])
        return Classified(
            FailureEvent.USER_CODE_ERROR,
            [],
            lines(user) + tail,
            "user_code_error",
            user[0][1].rank,
            user[0][1].exit_code,
        )
    return Classified(
        FailureEvent.WORKER_CRASH, [], lines(crashed) + first.log_tail[-8:], rank=first.rank, exit_code=first.exit_code
    )


@dataclass
class Counters:
    """What the budget decisions depend on (the controller keeps these in JobState)."""

    restarts: int = 0  # counted restarts so far
    user_code_failures: int = 0


@dataclass
class Decision:
    event: FailureEvent
    action: FailureAction
    counted: bool
    suspects: list[str]
    reason: str | None = None  # the job's failure reason when action is FAIL
    message: str = ""
    stop_time_checks: bool = False


def decide(
    classified: Classified, policy: FailurePolicy, counters: Counters, *, checks_enabled: bool = True
) -> Decision:
    """The rung of the ladder for this failure, after the budget and the user-code retry rule."""
    event = classified.event
    action = policy.action_for(event)
    counted = event not in INFRASTRUCTURE_EVENTS
    suspects = list(classified.suspects)
    unnamed = action is FailureAction.EVICT and not suspects
    if unnamed:
        # Nothing to evict (no machine named: a hang whose stacks blamed no group): restart, and let
        # the stop-time checks find a culprit; checks that find none count toward a replay.
        action = FailureAction.RESTART
    if action is FailureAction.FAIL:
        return Decision(event, action, counted, suspects, event.value, f"failure policy: {event.value} fails the job")
    if (
        event is FailureEvent.USER_CODE_ERROR
        and action is FailureAction.RESTART
        and counters.user_code_failures >= policy.user_code_retries
    ):
        return Decision(
            event,
            FailureAction.FAIL,
            counted,
            [],
            "UserCodeError",
            f"user code failed {counters.user_code_failures + 1} times ({policy.user_code_retries} retries allowed)",
        )
    if counted and action is not FailureAction.IGNORE and counters.restarts >= policy.max_restarts:
        return Decision(
            event,
            FailureAction.FAIL,
            counted,
            suspects,
            "RestartBudgetExhausted",
            f"{event.value} after {counters.restarts} counted restarts (maxRestarts {policy.max_restarts})",
        )
    checks = checks_enabled and (
        action is FailureAction.ROLLBACK
        or (
            action is FailureAction.RESTART
            and (unnamed or event in (FailureEvent.WORKER_CRASH, FailureEvent.MFU_DECLINE))
        )
    )
    return Decision(event, action, counted, suspects, stop_time_checks=checks)


def count(counters: Counters, decision: Decision) -> Counters:
    """The counters after `decision` is carried out: a counted restart spends the budget, and a
    user-code error that is retried spends one retry. Fail and Ignore spend nothing."""
    restarted = decision.action not in (FailureAction.FAIL, FailureAction.IGNORE)
    return Counters(
        restarts=counters.restarts + (1 if restarted and decision.counted else 0),
        user_code_failures=counters.user_code_failures
        + (1 if restarted and decision.event is FailureEvent.USER_CODE_ERROR else 0),
    )


def hang_timeout(step_times: Sequence[float], multiplier: float, floor: float) -> float:
    """No progress for this long is a hang: a multiple of the recent step time, never below `floor`
    (NCCL's 30-minute default would waste half an hour per hang)."""
    return max(floor, multiplier * _median([t for t in step_times if t and math.isfinite(t)]))


# A generation's pace: its first samples are warm-up; the most recent ones are compared with the
# median of everything between (the baseline), which needs a few samples of its own.
PACE_WARMUP_SAMPLES = 2
PACE_BASELINE_MIN_SAMPLES = 4
PACE_RECENT_SAMPLES = 5


def slowdown_onset(samples: Sequence[tuple[float, float]], factor: float) -> float | None:
    """When the job turned slow, or None: `samples` are (time, step time) in order, one per step
    seen. Slow is the median of the recent samples above `factor` times the baseline's median, and
    the onset is the first of the trailing run of slow samples."""
    body = samples[PACE_WARMUP_SAMPLES:]
    if len(body) < PACE_BASELINE_MIN_SAMPLES + PACE_RECENT_SAMPLES or factor <= 1:
        return None
    baseline = _median([t for _, t in body[:-PACE_RECENT_SAMPLES]])
    if baseline <= 0 or _median([t for _, t in body[-PACE_RECENT_SAMPLES:]]) <= factor * baseline:
        return None
    onset = body[-1][0]
    for at, step_time in reversed(body):
        if step_time <= factor * baseline:
            break
        onset = at
    return onset


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2] if ordered else 0.0


def is_loss_spike(loss: float | None, history: Sequence[float], factor: float, min_history: int = 5) -> bool:
    """A finite loss `factor` times the recent mean (NaN is its own event, caught from the logs)."""
    if loss is None or not math.isfinite(loss) or len(history) < min_history:
        return False
    mean = sum(history) / len(history)
    return mean > 0 and loss > factor * mean


@dataclass
class NicHistory:
    down: bool = False
    downs: list[float] = field(default_factory=list)  # times the NIC went down


def machine_fault_suspects(
    faults: Mapping[str, Sequence[str]],
    nics: dict[str, NicHistory],
    now: float,
    *,
    nic_count: int,
    nic_window: float,
) -> dict[str, list[str]]:
    """Nodes to evict at once, with their evidence. A NIC that goes down is evicted on its
    `nic_count`-th down within `nic_window` seconds (one flap can be a reseated cable); any other
    machine fault at once. `nics` (node -> history) is updated in place: every heartbeat of a node
    whose NIC stays down repeats the fault, and that is one occurrence, not many."""
    out: dict[str, list[str]] = {}
    for node in set(faults) | set(nics):
        lines = list(faults.get(node, []))
        nic = [ln for ln in lines if _is_nic(ln)]
        other = [ln for ln in lines if not _is_nic(ln)]
        history = nics.setdefault(node, NicHistory())
        if nic and not history.down:
            history.downs.append(now)
        history.down = bool(nic)
        history.downs = [t for t in history.downs if now - t <= nic_window]
        if nic and len(history.downs) >= nic_count:
            other += [f"{ln} ({len(history.downs)} times in {nic_window:.0f}s)" for ln in nic]
        if other:
            out[node] = other
    return out


def _is_nic(line: str) -> bool:
    low = line.lower()
    return low.startswith("network") or "nic" in low or " port " in low


# -- etcd's outage: leases that lapsed while etcd was away -------------------------------------------

OUTAGE_GRACE_TTLS = 2  # after etcd's return, nodes have this many lease TTLs to register again


def outage_grace(ft: FaultTolerance) -> float:
    """How long after etcd's return a lapsed lease is still taken for the outage's, not the node's."""
    return OUTAGE_GRACE_TTLS * ft.lease_ttl_seconds
