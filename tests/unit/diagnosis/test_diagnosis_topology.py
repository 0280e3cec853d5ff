"""Topology: Megatron's rank order, every rank's parallel groups, the smallest group holding a set of ranks."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from stalwart.diagnosis.models import Coords, Topology
from stalwart.diagnosis.parallel_groups import build_layout, smallest_group


def topo(tp: int, pp: int, dp: int, rpn: int = 4, **kw: object) -> Topology:
    world = tp * pp * dp
    return Topology(world_size=world, tp=tp, pp=pp, dp=dp, rank_nodes={r: f"n{r // rpn}" for r in range(world)}, **kw)


def test_megatron_default_order_tp_fastest_then_dp_then_pp() -> None:
    t = topo(2, 4, 4)
    assert t.coords(0) == Coords(tp=0, pp=0, dp=0)
    assert t.coords(1) == Coords(tp=1, pp=0, dp=0)
    assert t.coords(2) == Coords(tp=0, pp=0, dp=1)
    assert t.coords(8) == Coords(tp=0, pp=1, dp=0)
    assert t.coords(31) == Coords(tp=1, pp=3, dp=3)
    assert all(t.rank_of(t.coords(r)) == r for r in range(32))


def test_another_order_and_context_parallel() -> None:
    t = Topology(world_size=16, tp=2, pp=2, dp=2, cp=2, order="tp-pp-dp")  # cp goes right after tp
    assert [n for n, _ in t.dims()] == ["tp", "cp", "pp", "dp"]
    assert t.coords(2) == Coords(tp=0, pp=0, dp=0, cp=1)
    assert t.coords(4) == Coords(tp=0, pp=1, dp=0, cp=0)
    assert t.coords(8) == Coords(tp=0, pp=0, dp=1, cp=0)


def test_groups_of_every_kind() -> None:
    layout = build_layout(topo(2, 4, 4))
    assert list(layout.peers("tp", 5)) == [4, 5]
    assert list(layout.peers("dp", 1)) == [1, 3, 5, 7]
    assert list(layout.peers("pp", 3)) == [3, 11, 19, 27]
    assert list(layout.peers("mp", 2)) == [2, 3, 10, 11, 18, 19, 26, 27]  # DP replica 1: its whole pipeline
    assert list(layout.peers("node", 5)) == [4, 5, 6, 7]
    assert layout.neighbour(3, "pp", +1) == 11 and layout.neighbour(27, "pp", +1) is None
    assert layout.neighbour(3, "pp", -1) is None


def test_expert_parallel_groups_are_runs_of_dp_ranks() -> None:
    layout = build_layout(topo(1, 1, 8, ep=4))
    assert list(layout.peers("ep", 5)) == [4, 5, 6, 7]


def test_the_smallest_group_explaining_the_outliers() -> None:
    layout = build_layout(topo(2, 4, 4, rpn=2))
    # one pipeline (DP replica 1, both TP ranks of every stage) is stuck: the replica explains it
    stuck = np.array([2, 3, 10, 11, 18, 19, 26, 27])
    assert smallest_group(layout, stuck) == ("mp", 1)
    assert smallest_group(layout, np.array([10, 11])) == ("tp", 5)  # a TP group (= node here: TP wins ties)
    assert smallest_group(layout, np.array([11])) == ("rank", 11)
    assert smallest_group(layout, np.array([3, 11])) == ("pp", 3)
    assert smallest_group(layout, np.array([0, 31])) is None  # only the whole job would do


def test_node_when_no_parallel_group_fits() -> None:
    layout = build_layout(topo(1, 2, 4, rpn=4))  # node n0 holds stage 0 of all replicas
    assert smallest_group(layout, np.array([1, 2])) == ("dp", 0)
    layout = build_layout(
        Topology(world_size=8, tp=2, pp=2, dp=2, rank_nodes={r: ["a", "b"][r in (1, 2, 5, 6)] for r in range(8)})
    )
    assert smallest_group(layout, np.array([1, 2, 5])) == ("node", layout.nodes.index("b"))


def test_invalid_topologies_say_what_is_wrong() -> None:
    with pytest.raises(ValidationError, match="does not equal world_size"):
        Topology(world_size=10, tp=2, pp=2, dp=2)
    with pytest.raises(ValidationError, match="must name each of tp, dp, pp"):
        Topology(world_size=8, tp=2, pp=2, dp=2, order="tp-pp")
    with pytest.raises(ValidationError, match="outside"):
        Topology(world_size=2, dp=2, rank_nodes={5: "n0"})
    with pytest.raises(ValidationError, match="ep"):
        Topology(world_size=6, dp=6, ep=4)
    assert Topology(world_size=12, tp=2).dp == 6  # a world size alone is data parallel
