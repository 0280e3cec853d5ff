"""The transition table: the only place a job's stage changes.

Each row is (from, trigger, to) and says in words when it fires; `enter` applies one and refuses
any pair the table does not hold, so a branch of the core can only take a documented edge. Every
row has a unit test through the pure core (tests/unit/controller/test_core_table.py) and one
through a controller tick (tests/unit/controller/test_transitions.py).

The stages (JobStage; JobPhase, what users see, groups them) and the transitions between them:

                          created
                             |
                             v
             +---------> Starting -------------------------+
             |              |                              | generation started
             |              | nodes ready                  | (no pre-flight)
             |              v                              v
             +-------- Preflight --generation started--> Running --workers succeeded--> Succeeded
          pre-flight again
                                                        |   ^   |
                         failure handled, checks due    |   |   | failure handled;
                     +----------------------------------+   |   | evict requested;
                     |                     generation started   | capacity back at a checkpoint
                     v                                      |   v
               StopTimeChecks ------checks done--------> Restarting --shrunk--> Restarting
                     |                                      ^
          replay due |                                      | replay concluded
                     v                                      |
               ReplayHorizontal --horizontal judged--> ReplayVertical
               (replay due, horizontal known: StopTimeChecks straight to ReplayVertical)

        to Failed:    Starting, Restarting --nodes never ready;  Preflight --pre-flight exhausted;
                      Starting, Restarting, StopTimeChecks, ReplayHorizontal, ReplayVertical --nodes keep dying;
                      Running --failure fatal
        suspend:      Starting, Preflight, Running, Restarting, StopTimeChecks, ReplayHorizontal,
                      ReplayVertical --suspend--> Suspending --nodes stopped--> Suspended
                      Running --suspend, checkpoint first--> SuspendSaving --checkpoint committed /
                      save grace passed--> Suspending
        resume:       Suspended --resumed--> Starting;  Suspending --resumed--> Starting;
                      SuspendSaving --resumed--> Running (the generation never stopped)

`TABLE` says when each edge fires, in words; docs/control-plane.md has both.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from stalwart.store.records import JobStage, JobState


class Trigger(str, Enum):
    CREATED = "created"
    NODES_READY = "nodes ready"
    GENERATION_STARTED = "generation started"
    NODES_NEVER_READY = "nodes never ready"
    NODES_KEEP_DYING = "nodes keep dying"
    PREFLIGHT_RETRY = "pre-flight again"
    PREFLIGHT_EXHAUSTED = "pre-flight exhausted"
    WORKERS_SUCCEEDED = "workers succeeded"
    FAILURE_HANDLED = "failure handled"
    FAILURE_CHECKED = "failure handled, checks due"
    FAILURE_FATAL = "failure fatal"
    EVICT_REQUESTED = "evict requested"
    CHECKS_DONE = "checks done"
    REPLAY_HORIZONTAL_DUE = "replay due"
    REPLAY_VERTICAL_DUE = "replay due, horizontal known"
    HORIZONTAL_JUDGED = "horizontal judged"
    REPLAY_CONCLUDED = "replay concluded"
    SUSPEND = "suspend"
    SUSPEND_SAVING = "suspend, checkpoint first"
    SAVE_COMMITTED = "checkpoint committed"
    SAVE_GRACE_PASSED = "save grace passed"
    NODES_STOPPED = "nodes stopped"
    RESUMED = "resumed"
    SHRUNK = "shrunk"
    GROW = "capacity back at a checkpoint"


@dataclass(frozen=True)
class Row:
    source: JobStage | None  # None: the job has no state yet
    trigger: Trigger
    target: JobStage
    when: str


S = JobStage
# Stages that wait for slot nodes to register, and replace one that dies before it does.
WAITING_FOR_NODES = (S.STARTING, S.RESTARTING, S.CHECKING, S.REPLAY_HORIZONTAL, S.REPLAY_VERTICAL)
# Stages a `suspend: true` in the spec takes the job out of.
ACTIVE = (S.STARTING, S.PREFLIGHT, S.RUNNING, S.RESTARTING, S.CHECKING, S.REPLAY_HORIZONTAL, S.REPLAY_VERTICAL)

TABLE: tuple[Row, ...] = (
    Row(
        None, Trigger.CREATED, S.STARTING, "the controller writes the job's first state; slot nodes and standbys start"
    ),
    Row(
        S.STARTING,
        Trigger.NODES_READY,
        S.PREFLIGHT,
        "every slot node registered (and the standbys, or 30 s passed); pre-flight checks start off the loop",
    ),
    Row(S.STARTING, Trigger.GENERATION_STARTED, S.RUNNING, "every slot node registered, no pre-flight: generation + 1"),
    Row(S.STARTING, Trigger.NODES_NEVER_READY, S.FAILED, "a slot node did not register within the startup timeout"),
    *(
        Row(
            stage,
            Trigger.NODES_KEEP_DYING,
            S.FAILED,
            "over 3 slot nodes per slot died before joining since a generation last began: the start cannot succeed",
        )
        for stage in WAITING_FOR_NODES
    ),
    Row(
        S.PREFLIGHT,
        Trigger.GENERATION_STARTED,
        S.RUNNING,
        "every slot node passed (a failed one's standby passed with it): generation + 1",
    ),
    Row(
        S.PREFLIGHT,
        Trigger.PREFLIGHT_RETRY,
        S.STARTING,
        "nodes failed and were evicted (incidents, not counted); their fresh replacements must register and be checked",
    ),
    Row(S.PREFLIGHT, Trigger.PREFLIGHT_EXHAUSTED, S.FAILED, "nodes still failed after the last pre-flight round"),
    Row(S.RUNNING, Trigger.WORKERS_SUCCEEDED, S.SUCCEEDED, "every worker of the generation exited 0"),
    Row(
        S.RUNNING,
        Trigger.FAILURE_HANDLED,
        S.RESTARTING,
        "a detector's failure, the ladder's rung (restart, evict, roll back), committed with its incident",
    ),
    Row(
        S.RUNNING,
        Trigger.FAILURE_CHECKED,
        S.CHECKING,
        "a failure with no machine named (a crash, a NaN): the rung, then stop-time checks",
    ),
    Row(S.RUNNING, Trigger.FAILURE_FATAL, S.FAILED, "the ladder fails the job (budget spent, user code, a Fail rule)"),
    Row(S.RUNNING, Trigger.EVICT_REQUESTED, S.RESTARTING, "an operator evicted a slot node; a standby takes its ranks"),
    Row(
        S.RESTARTING,
        Trigger.GENERATION_STARTED,
        S.RUNNING,
        "every slot node registered (old workers are stopped by their agents): generation + 1",
    ),
    Row(
        S.RESTARTING,
        Trigger.NODES_NEVER_READY,
        S.FAILED,
        "a slot node did not register within restartTimeoutSeconds (no standby left, no machine free)",
    ),
    Row(
        S.RESTARTING,
        Trigger.SHRUNK,
        S.RESTARTING,
        "a slot node is missing, no machine is free for it and its role has minReplicas: the role drops to fewer "
        "data-parallel replicas; the restart goes on with the nodes it keeps",
    ),
    Row(
        S.RUNNING,
        Trigger.GROW,
        S.RESTARTING,
        "a role runs below replicas, standbys for more of its nodes registered and a checkpoint was just "
        "committed (asked for early once they registered): they take slots, generation + 1 at the larger size",
    ),
    Row(S.CHECKING, Trigger.CHECKS_DONE, S.RESTARTING, "the checks came back; nodes that failed were evicted"),
    Row(
        S.CHECKING,
        Trigger.REPLAY_HORIZONTAL_DUE,
        S.REPLAY_HORIZONTAL,
        "the checks explained nothing, replayAfter times in a row: the horizontal groups replay",
    ),
    Row(
        S.CHECKING,
        Trigger.REPLAY_VERTICAL_DUE,
        S.REPLAY_VERTICAL,
        "as above, but the horizontal phase is the whole job, which just failed: the vertical groups replay",
    ),
    Row(S.REPLAY_HORIZONTAL, Trigger.HORIZONTAL_JUDGED, S.REPLAY_VERTICAL, "every horizontal group passed or failed"),
    Row(
        S.REPLAY_VERTICAL,
        Trigger.REPLAY_CONCLUDED,
        S.RESTARTING,
        "every vertical group judged: the node in both failing groups is evicted (or none: inconclusive)",
    ),
    *(
        Row(stage, Trigger.SUSPEND, S.SUSPENDING, "spec.suspend is true: workers and nodes stop, no incident")
        for stage in ACTIVE
    ),
    Row(
        S.RUNNING,
        Trigger.SUSPEND_SAVING,
        S.SAVING,
        "spec.suspend is true, workers are stepping and checkpoint.saveBeforeSuspendSeconds > 0: every rank is "
        "asked to checkpoint at a step just ahead (CheckpointRequest); the workers keep running",
    ),
    Row(
        S.SAVING,
        Trigger.SAVE_COMMITTED,
        S.SUSPENDING,
        "a node reports the asked-for checkpoint committed: workers and nodes stop, no incident",
    ),
    Row(
        S.SAVING,
        Trigger.SAVE_GRACE_PASSED,
        S.SUSPENDING,
        "no checkpoint committed within saveBeforeSuspendSeconds: workers and nodes stop anyway (a warning)",
    ),
    Row(S.SAVING, Trigger.RESUMED, S.RUNNING, "spec.suspend unset before the save committed: the generation goes on"),
    Row(S.SUSPENDING, Trigger.NODES_STOPPED, S.SUSPENDED, "the cluster reports none of the job's nodes alive"),
    Row(S.SUSPENDING, Trigger.RESUMED, S.STARTING, "spec.suspend unset before every node stopped"),
    Row(
        S.SUSPENDED,
        Trigger.RESUMED,
        S.STARTING,
        "spec.suspend unset: nodes start again, then a new generation from the newest checkpoint (no restart counted)",
    ),
)

_ROWS: dict[tuple[JobStage | None, Trigger], Row] = {(r.source, r.trigger): r for r in TABLE}
assert len(_ROWS) == len(TABLE), "two rows share a (stage, trigger)"


class IllegalTransition(RuntimeError):
    """A branch of the core asked for an edge the table does not have: a bug, never bad input."""


def row(source: JobStage | None, trigger: Trigger) -> Row:
    found = _ROWS.get((source, trigger))
    if found is None:
        where = source.value if source is not None else "no state"
        raise IllegalTransition(f"no transition {trigger.value!r} from {where}")
    return found


def enter(state: JobState, trigger: Trigger, now: float) -> Row:
    """Move `state` along the table's row for (its stage, trigger)."""
    taken = row(state.stage, trigger)
    state.stage, state.stage_since = taken.target, now
    if taken.target.terminal:
        state.finished_at = now
    return taken


def begin(state: JobState, now: float) -> Row:
    """A new job's first stage (the table's only row without a source)."""
    taken = row(None, Trigger.CREATED)
    state.stage, state.stage_since = taken.target, now
    return taken
