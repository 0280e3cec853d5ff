"""Hot-swap: an evicted node's slot, and so its ranks, goes to a standby; the pool is topped up.

Every eviction is written in the decision that makes it, with its `Cordon` record and its incident:
a controller killed at any point has either evicted or not, never half.
"""

from __future__ import annotations

from collections.abc import Collection

from stalwart.controller.decision import Plan
from stalwart.controller.standby_pool import role_standbys
from stalwart.spec import TrainingJobSpec
from stalwart.store import keys
from stalwart.store.records import Cordon, Incident, JobState


def new_node(state: JobState) -> str:
    """A node name never used by this job before."""
    name = f"node-{state.next_node_index}"
    state.next_node_index += 1
    return name


def evict(
    plan: Plan,
    nodes: list[str],
    incident: Incident,
    registered: Collection[str],
    spec: TrainingJobSpec,
    exclude: Collection[str] = (),
) -> None:
    """Take `nodes` out of the job: a slot goes to the readiest standby (checked, then registered)
    not in `exclude`, or to a new node when the pool is empty; a standby just leaves the pool. The
    incident records who replaced whom."""
    state = plan.state
    for node in nodes:
        if node in state.evicted:
            continue
        state.evicted.append(node)
        plan.evicted.append(node)
        reason = f"{incident.failure_class.value}: {'; '.join(incident.evidence[:1])}"[:300]
        plan.put(keys.cordon(node), Cordon(node=node, reason=reason, incident=incident.id, cordoned_at=plan.now))
        if node in state.standbys:
            state.standbys.remove(node)
            state.standby_roles.pop(node, None)
            continue
        if node not in state.slots:
            continue
        role = state.role_of(node)
        ready = sorted(
            (
                s
                for s in state.standbys
                if s not in exclude and s not in nodes and (role is None or state.standby_roles.get(s, role) == role)
            ),
            key=lambda s: (s not in state.standbys_checked, s not in registered),
        )
        if ready:
            replacement = ready[0]
            state.standbys.remove(replacement)
            state.standby_roles.pop(replacement, None)
        else:
            replacement = new_node(state)
        state.slots = [replacement if s == node else s for s in state.slots]
        incident.replacements[node] = replacement
        incident.evicted.append(node)
    top_up_standbys(state, spec)  # new standbys start while the job restarts


def top_up_standbys(state: JobState, spec: TrainingJobSpec) -> None:
    """Each role's pool back to its target; a new standby is started for one role only. (A standby
    of a state written before roles had pools is counted towards the first role that lacks one.)"""
    targets = role_standbys(spec)
    for node in state.standbys:
        if node not in state.standby_roles:
            short = [r for r, n in targets.items() if sum(1 for v in state.standby_roles.values() if v == r) < n]
            state.standby_roles[node] = short[0] if short else spec.roles[0].name
    for role, target in targets.items():
        while sum(1 for v in state.standby_roles.values() if v == role) < target:
            node = new_node(state)
            state.standbys.append(node)
            state.standby_roles[node] = role
