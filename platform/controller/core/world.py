"""What the nodes should be doing, derived from the job's state alone, and the effects that make it so.

Level-triggered: every tick compares the wanted commands and nodes with what it observed and emits
only the difference. So nothing is lost when a controller dies between a commit and its effects:
the next one derives the same wants from the same state.
"""

from __future__ import annotations

from stalwart.controller.core.decision import CordonNode, Plan, SendCommand, StartNode, StopNode
from stalwart.controller.core.observation import Observation
from stalwart.store.records import AgentAction, JobStage, JobState

EVICTED_REASON = "evicted by the controller"


def commands(state: JobState) -> dict[str, tuple[int, AgentAction]]:
    """node -> (generation, action) its agent should hold. Standbys get none: they wait."""
    stage = state.stage
    if stage in (JobStage.RUNNING, JobStage.SAVING):  # (saving before a suspension: the workers run on)
        return {n: (state.running_generation(n), AgentAction.RUN) for n in state.slots}
    replay = state.replay
    if stage in (JobStage.REPLAY_HORIZONTAL, JobStage.REPLAY_VERTICAL) and replay and replay.generation is not None:
        groups = {n: (replay.generation, AgentAction.RUN) for g in replay.groups(stage) for n in g.nodes}
        # A role's replay: the other roles' nodes keep their command (their workers keep running).
        return groups if replay.role is None else {**_recovering(state), **groups}
    if stage in (
        JobStage.RESTARTING,
        JobStage.CHECKING,
        JobStage.REPLAY_HORIZONTAL,
        JobStage.REPLAY_VERTICAL,
        JobStage.SUSPENDING,
        JobStage.SUSPENDED,
    ):
        return _recovering(state)
    return {}  # starting: nothing runs yet; finished: the loop shuts the agents down


def _recovering(state: JobState) -> dict[str, tuple[int, AgentAction]]:
    """Stop the old generation's workers (they may be stuck in a collective). A role-scoped
    recovery stops only its roles: the other roles' nodes keep their command, so their workers
    keep their processes."""
    stopping = set(state.restarting_slots())
    return {
        n: (state.running_generation(n), AgentAction.STOP if n in stopping else AgentAction.RUN) for n in state.slots
    }


def wanted_nodes(state: JobState) -> set[str]:
    """Nodes that should exist; any other node the cluster runs for the job is stopped."""
    if state.stage in (JobStage.SUSPENDING, JobStage.SUSPENDED) or state.stage.terminal:
        return set()
    return {*state.slots, *state.standbys}


def startable(state: JobState) -> list[str]:
    """Wanted nodes to start when the cluster has none of that name. Standbys wait while a
    recovery is under way: a booting standby must not slow it down."""
    if not wanted_nodes(state):
        return []
    recovering = state.open_incident is not None and state.generation > 0
    return [*state.slots, *([] if recovering else state.standbys)]


def node_role(state: JobState, node: str, slot_roles: dict[str, str] | None = None) -> str | None:
    """The role a node to start serves: its slot's, or the pool it waits in. `slot_roles`:
    `state.slot_roles()`, computed once by a caller that asks for many nodes."""
    slot_role = state.role_of(node) if slot_roles is None else slot_roles.get(node)
    return slot_role or state.standby_roles.get(node)


def reconcile(plan: Plan, obs: Observation) -> None:
    """The effects that bring the nodes to what `plan.state` wants."""
    state = plan.state
    for node, (generation, action) in commands(state).items():
        current = obs.commands.get(node)
        if current is None or (current.generation, current.action) != (generation, action):
            plan.effect(SendCommand(node, generation, action))
    if state.stage.terminal or obs.cluster is None:
        return  # nodes are looked after when the cluster was listed (not every tick while running)
    for node in state.evicted:
        plan.effect(CordonNode(node, EVICTED_REASON))
    wanted = wanted_nodes(state)
    for name in sorted(obs.cluster):
        if name not in wanted:
            plan.effect(StopNode(name))
    slot_roles = state.slot_roles()
    for name in startable(state):
        if name not in obs.cluster:
            plan.effect(StartNode(name, standby=name in state.standbys, role=node_role(state, name, slot_roles)))
