"""Keeping the warm standby pool at its target: drop standbys that died, report machine faults or
fail their check; add new ones; check newcomers (off the loop) before they may take a slot."""

from __future__ import annotations

from stalwart.controller.checks import check_procs
from stalwart.controller.decision import Launch, Plan
from stalwart.controller.detectors.base import View
from stalwart.controller.eviction import top_up_standbys
from stalwart.controller.work import NodeChecks
from stalwart.store import keys
from stalwart.store.records import Cordon


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
