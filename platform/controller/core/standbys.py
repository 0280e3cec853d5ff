"""The warm standby pool: how many standbys a job keeps, hot-swap of an evicted node's slot to one,
and the pool's upkeep.

How many: the 99th percentile of concurrent node failures. Each node fails within one replacement
window with probability p, independently, so the number of nodes down at once is Binomial(n, p).
Keeping its 99th percentile warm means a failure finds a standby 99% of the time, at the cost of
that many idle machines. ByteRobust's table (2 standbys for 128-256 nodes, 4 for 1,024) is what
p = 0.0012 gives.

Hot-swap: an evicted node's slot, and so its ranks, goes to a standby; the pool is topped up. Every
eviction is written in the decision that makes it, with its `Cordon` record and its incident: a
controller killed at any point has either evicted or not, never half.

Upkeep: drop standbys that died, report machine faults or fail their check; add new ones; check
newcomers (off the loop) before they may take a slot.
"""

from __future__ import annotations

import math
from collections.abc import Collection

from stalwart.controller.core.decision import Launch, Plan
from stalwart.controller.core.detectors.base import View
from stalwart.controller.core.work import NodeChecks, check_procs
from stalwart.spec.model import StandbySettings, TrainingJobSpec
from stalwart.store import keys
from stalwart.store.records import Cordon, Incident, JobState

# -- how many standbys -----------------------------------------------------------------------------------


def binomial_quantile(n: int, p: float, q: float) -> int:
    """Smallest k with P(X <= k) >= q for X ~ Binomial(n, p); exact, in log space (n up to 10^6)."""
    if not 0 <= p <= 1 or not 0 < q < 1 or n < 0:
        raise ValueError(f"bad binomial parameters n={n} p={p} q={q}")
    if n == 0 or p == 0:
        return 0
    if p == 1:
        return n
    log_p, log_q = math.log(p), math.log1p(-p)
    cdf = 0.0
    for k in range(n + 1):
        log_pmf = math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1) + k * log_p + (n - k) * log_q
        cdf += math.exp(log_pmf)
        if cdf >= q - 1e-12:
            return k
    return n


def standby_count(nodes: int, failure_probability: float, percentile: float = 0.99) -> int:
    """Standbys that cover `percentile` of the concurrent failures of `nodes` nodes."""
    return binomial_quantile(nodes, failure_probability, percentile)


def standbys_for(settings: StandbySettings, nodes: int) -> int:
    """The job's standby target: the explicit count, else the binomial size, never below the minimum."""
    if settings.count is not None:
        return settings.count
    return max(settings.minimum, standby_count(nodes, settings.node_failure_probability))


def role_standbys(spec: TrainingJobSpec) -> dict[str, int]:
    """Each role's standby target: its own `standbys`, else the job's settings sized from its replicas
    (for a one-role job, exactly the job's target)."""
    return {
        r.name: r.standbys if r.standbys is not None else standbys_for(spec.standbys, r.replicas) for r in spec.roles
    }


# -- hot-swap --------------------------------------------------------------------------------------------


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
    of a state written before roles had pools is counted towards the first role that lacks one.) A
    role that elastic data parallelism shrank also keeps asking for the nodes it lacks (the last
    resize says its declared replicas): they are what it grows back with."""
    targets = role_standbys(spec)
    declared = {r.role: r.replicas for r in state.resizes}
    for role, replicas in declared.items():
        if role in targets and role in state.roles:
            targets[role] += max(0, replicas - state.roles[role].nodes)
    for node in state.standbys:
        if node not in state.standby_roles:
            short = [r for r, n in targets.items() if sum(1 for v in state.standby_roles.values() if v == r) < n]
            state.standby_roles[node] = short[0] if short else spec.roles[0].name
    for role, target in targets.items():
        while sum(1 for v in state.standby_roles.values() if v == role) < target:
            node = new_node(state)
            state.standbys.append(node)
            state.standby_roles[node] = role


# -- upkeep ----------------------------------------------------------------------------------------------


def standby_check(node: str, view: View) -> NodeChecks:
    return NodeChecks("standby", node, (node,), check_procs(view.spec))


def apply_standby_checks(plan: Plan, view: View) -> None:
    """Standbys whose check came back: passed ones may take a slot first, failed ones leave."""
    state = plan.state
    for node in list(state.standbys):
        result = view.result(standby_check(node, view).key)
        if result is None:
            continue
        verdict = result.verdicts[0] if result.verdicts else None
        if result.error is None and verdict is not None and verdict.passed:
            state.standbys_checked = sorted({*state.standbys_checked, node})
        else:
            why = result.error or ("; ".join(verdict.reasons[:2]) if verdict else "") or "failed its check"
            drop(plan, node, f"check could not run: {why}" if result.error else why)


def drop(plan: Plan, node: str, why: str) -> None:
    state = plan.state
    state.standbys.remove(node)
    state.standby_roles.pop(node, None)
    state.evicted.append(node)
    plan.put(keys.cordon(node), Cordon(node=node, reason=f"standby {why}"[:300], cordoned_at=plan.now))
    plan.log("warning", "dropping a standby", node=node, why=why)


def upkeep(plan: Plan, view: View) -> None:
    """Once per heartbeat interval (it needs the cluster's listing)."""
    state, known = plan.state, view.cluster
    assert known is not None
    for node in list(state.standbys):
        beat = view.beats.get(node)
        if node in known and not known[node].alive and node not in view.registrations:
            drop(plan, node, "died")
        elif node in view.registrations and beat is not None and beat.machine_faults:
            drop(plan, node, "; ".join(beat.machine_faults[:2]))
    top_up_standbys(state, view.spec)
    if not view.spec.fault_tolerance.preflight:
        return
    for node in state.standbys:
        check = standby_check(node, view)
        if node in view.registrations and node not in state.standbys_checked and not view.busy(check.key):
            plan.effect(Launch(check))
