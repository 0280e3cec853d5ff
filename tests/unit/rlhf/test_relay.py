"""The relay's rules, on its state machine alone (no sockets; a fake clock for lease expiry)."""

from __future__ import annotations

import pytest

from stalwart.rlhf.lineage import Lineage, WeightVersion
from stalwart.rlhf.messages import Demand, Group, Lease, PromptItem, Sample, Stage, Submit, Take
from stalwart.rlhf.relay import Relay, RelayError
from stalwart.spec.model import DataPlaneSettings

INC = "a"


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def prompt(position: int, step: int = 1) -> PromptItem:
    return PromptItem(sample_id=1000 + position, position=position, step=step, tokens=[position % 250, 7])


def relay(clock: Clock | None = None, **settings: float) -> Relay:
    r = Relay(DataPlaneSettings(**settings), clock=clock or Clock())  # type: ignore[arg-type]
    r.resume(Lineage().extend(INC, 0), watermark=0)
    return r


def v(step: int, incarnation: str = INC) -> WeightVersion:
    return WeightVersion(incarnation=incarnation, step=step)


def generated(p: PromptItem, version: WeightVersion, n: int = 2) -> Group:
    return Group(prompt=p, version=version, samples=[Sample(tokens=[48 + i], logprobs=[-1.0]) for i in range(n)])


def lease(r: Relay, stage: Stage, client: str = "w#1", n: int = 16, have: WeightVersion | None = None):  # type: ignore[no-untyped-def]
    return r.lease(client, Lease(stage=stage, max_groups=n, have_version=have, wait_seconds=0))


def through_all_stages(r: Relay, version: WeightVersion, client: str = "w#1") -> list[int]:
    """Run every waiting group through rollout, reward and reference; returns the positions generated."""
    out = lease(r, Stage.ROLLOUT, client, have=version)
    assert out.status == "ok", out
    r.submit(
        client, Submit(stage=Stage.ROLLOUT, lease_id=out.lease_id, groups=[generated(p, version) for p in out.prompts])
    )
    scored = lease(r, Stage.REWARD, client)
    r.submit(
        client,
        Submit(
            stage=Stage.REWARD,
            lease_id=scored.lease_id,
            groups=[g.model_copy(update={"rewards": [1.0] * len(g.samples)}) for g in scored.groups],
        ),
    )
    ref = lease(r, Stage.REFERENCE, client)
    r.submit(
        client,
        Submit(
            stage=Stage.REFERENCE,
            lease_id=ref.lease_id,
            groups=[g.model_copy(update={"ref_logprobs": [[-2.0]] * len(g.samples)}) for g in ref.groups],
        ),
    )
    return [p.position for p in out.prompts]


def test_groups_move_through_the_stages_and_are_taken_once_in_order() -> None:
    r = relay()
    items = [prompt(i) for i in range(4)]
    assert r.take(Take(incarnation=INC, items=items, wait_seconds=0)).ready is False  # demanded, nothing made yet
    assert through_all_stages(r, v(0)) == [0, 1, 2, 3]
    reply = r.take(Take(incarnation=INC, items=items, wait_seconds=0))
    assert reply.ready and [g.prompt.position for g in reply.groups] == [0, 1, 2, 3]
    assert all(g.rewards == [1.0, 1.0] and g.ref_logprobs == [[-2.0], [-2.0]] for g in reply.groups)
    assert r.stats()["held"] == {} and r.counts["taken"] == 4


def test_a_dead_workers_groups_go_back_to_its_stage_and_its_late_results_are_dropped() -> None:
    r = relay()
    r.demand(Demand(incarnation=INC, items=[prompt(0), prompt(1)]))
    first = lease(r, Stage.ROLLOUT, "rollout-1#1", have=v(0))
    assert [p.position for p in first.prompts] == [0, 1]
    assert r.stats()["holding"] == {"rollout-1": 2}
    assert r.release("rollout-1#1") == 2  # its connection closed
    again = lease(r, Stage.ROLLOUT, "rollout-0#2", have=v(0))
    assert [p.position for p in again.prompts] == [0, 1]  # the same prompts, for another worker
    late = r.submit(
        "rollout-1#1", Submit(stage=Stage.ROLLOUT, lease_id=first.lease_id, groups=[generated(prompt(0), v(0))])
    )
    assert (late.accepted, late.dropped) == (0, 1)
    ok = r.submit(
        "rollout-0#2",
        Submit(stage=Stage.ROLLOUT, lease_id=again.lease_id, groups=[generated(p, v(0)) for p in again.prompts]),
    )
    assert ok.accepted == 2
    assert r.counts["released.rollout"] == 2 and r.counts["late.rollout"] == 1 and r.counts["done.rollout"] == 2


def test_a_lease_held_too_long_expires_and_its_results_no_longer_count() -> None:
    clock = Clock()
    r = relay(clock, lease_seconds=10)
    r.demand(Demand(incarnation=INC, items=[prompt(0)]))
    hung = lease(r, Stage.ROLLOUT, "slow#1", have=v(0))
    clock.now = 11
    other = lease(r, Stage.ROLLOUT, "fast#2", have=v(0))
    assert other.status == "ok" and other.prompts == hung.prompts
    assert r.counts["expired.rollout"] == 1
    assert (
        r.submit(
            "slow#1", Submit(stage=Stage.ROLLOUT, lease_id=hung.lease_id, groups=[generated(prompt(0), v(0))])
        ).accepted
        == 0
    )


def test_rollouts_only_get_prompts_their_weights_are_fresh_enough_for() -> None:
    r = relay(max_weight_staleness=1)
    r.resume(Lineage().extend(INC, 0), watermark=0)
    r.demand(Demand(incarnation=INC, items=[prompt(0, step=1), prompt(1, step=3), prompt(2, step=4)]))
    # step 3 needs the weights of step 1 or newer; step 4 those of step 2
    assert [p.position for p in lease(r, Stage.ROLLOUT, have=v(0)).prompts] == [0]
    assert lease(r, Stage.ROLLOUT, "w#2", have=v(0)).status == "need-newer-weights"
    got = lease(r, Stage.ROLLOUT, "w#3", have=v(1))
    assert [p.position for p in got.prompts] == [1] and got.min_versions == [1]


def test_a_group_made_with_weights_too_old_is_refused_and_generated_again() -> None:
    r = relay(max_weight_staleness=0)
    r.demand(Demand(incarnation=INC, items=[prompt(0, step=3)]))
    out = lease(r, Stage.ROLLOUT, have=v(2))
    reply = r.submit("w#1", Submit(stage=Stage.ROLLOUT, lease_id=out.lease_id, groups=[generated(prompt(0, 3), v(1))]))
    assert reply.stale_weights and reply.accepted == 0
    assert r.stats()["held"] == {"rollout": 1} and r.counts["stale"] == 1


def test_a_restarted_actor_invalidates_groups_made_after_its_checkpoint() -> None:
    r = relay()
    r.demand(Demand(incarnation=INC, items=[prompt(i, step=12) for i in range(4)]))
    through_all_stages(r, v(11))  # made by incarnation a with the weights of step 11
    lineage = Lineage().extend(INC, 0).extend("b", 10)  # b resumed from the checkpoint of step 10
    r.resume(lineage, watermark=0)
    assert r.stats()["held"] == {"rollout": 4} and r.counts["invalidated"] == 4
    assert lease(r, Stage.ROLLOUT, have=v(11)).status == "need-newer-weights"  # a@11 is no longer history
    assert lease(r, Stage.ROLLOUT, "w#2", have=v(10, "b")).status == "ok"


def test_the_buffer_is_bounded_and_keeps_the_lowest_positions() -> None:
    r = relay(relay_capacity=4)
    reply = r.demand(Demand(incarnation=INC, items=[prompt(i) for i in range(4, 10)]))
    assert (reply.accepted, reply.refused) == (4, 2)
    r.take(Take(incarnation=INC, items=[prompt(0), prompt(1)], wait_seconds=0))  # the actor's current step comes first
    assert sorted(r._entries) == [0, 1, 4, 5] and r.counts["evicted"] == 2
    with pytest.raises(RelayError, match="relayCapacity is 4"):
        r.take(Take(incarnation=INC, items=[prompt(i) for i in range(5)], wait_seconds=0))


def test_nothing_before_the_watermark_is_demanded_or_taken_again() -> None:
    r = relay()
    r.advance(INC, 8)
    assert r.demand(Demand(incarnation=INC, items=[prompt(7), prompt(8)])).refused == 1
    with pytest.raises(RelayError, match="trained on already"):
        r.take(Take(incarnation=INC, items=[prompt(7)], wait_seconds=0))
    r.resume(Lineage().extend(INC, 0).extend("b", 0), watermark=0)  # a restart moves it back
    assert r.demand(Demand(incarnation="b", items=[prompt(7)])).accepted == 1


def test_every_rank_of_one_incarnation_may_resume_without_moving_the_watermark_back() -> None:
    r = relay()
    r.advance(INC, 16)  # rank 0 is a step ahead of rank 1, which reaches a new relay's twin later
    r.resume(Lineage().extend(INC, 0), watermark=8)
    assert r.watermark == 16
    r.finish()
    r.resume(Lineage().extend(INC, 0), watermark=16)  # a late rank does not reopen a finished actor
    assert r.done


def test_a_superseded_actor_incarnation_can_no_longer_take_demand_advance_or_resume() -> None:
    r = relay()
    r.resume(Lineage().extend(INC, 0).extend("b", 0), watermark=0)  # b replaced a; a rank of a lingers
    with pytest.raises(RelayError, match="not the current one"):
        r.take(Take(incarnation=INC, items=[prompt(0)], wait_seconds=0))
    with pytest.raises(RelayError, match="not the current one"):
        r.demand(Demand(incarnation=INC, items=[prompt(0)]))
    with pytest.raises(RelayError, match="not the current one"):
        r.advance(INC, 16)
    with pytest.raises(RelayError, match="superseded"):
        r.resume(Lineage().extend(INC, 0), watermark=0)
    assert r.watermark == 0 and r.lineage.current is not None and r.lineage.current.incarnation == "b"


def test_a_worker_fills_in_only_its_own_stage() -> None:
    r = relay()
    r.demand(Demand(incarnation=INC, items=[prompt(0)]))
    out = lease(r, Stage.ROLLOUT, have=v(0))
    r.submit("w#1", Submit(stage=Stage.ROLLOUT, lease_id=out.lease_id, groups=[generated(prompt(0), v(0))]))
    scored = lease(r, Stage.REWARD)
    with pytest.raises(RelayError, match="must fill in rewards"):
        r.submit("w#1", Submit(stage=Stage.REWARD, lease_id=scored.lease_id, groups=scored.groups))
    forged = scored.groups[0].model_copy(update={"rewards": [1.0, 1.0], "version": v(99)})
    r.submit("w#1", Submit(stage=Stage.REWARD, lease_id=scored.lease_id, groups=[forged]))
    assert r._entries[0].group is not None and r._entries[0].group.version == v(0)


def test_demand_for_a_held_position_must_name_the_same_prompt() -> None:
    r = relay()
    r.demand(Demand(incarnation=INC, items=[prompt(0)]))
    with pytest.raises(RelayError, match="held for sample 1000"):
        r.demand(Demand(incarnation=INC, items=[prompt(0).model_copy(update={"sample_id": 5})]))


def test_after_the_finish_workers_are_told_to_stop() -> None:
    r = relay()
    r.finish()
    assert lease(r, Stage.REWARD).status == "done"
    with pytest.raises(RelayError, match="the actor's"):
        lease(r, Stage.READY)
