"""The parallel layout: per-role `parallelism` in the spec, validated against the role's world, and
the one Topology made from it (coordinates, groups, placement, the replay grid)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from support.paths import REPO

from stalwart.diagnosis.models import Topology as EngineTopology
from stalwart.diagnosis.parallel_groups import build_layout
from stalwart.spec import Parallelism, Role, SpecError, TrainingJobSpec, load_job
from stalwart.spec.topology import GROUP_KINDS, RoleLayout, Topology, stage_major


def role(replicas: int = 4, procs: int = 2, name: str = "trainer", **parallelism: int) -> Role:
    return Role(
        name=name,
        replicas=replicas,
        processes_per_node=procs,
        command=["python"],
        parallelism=Parallelism(**parallelism),
    )


def three_d() -> Topology:
    """The example's layout: 4 nodes x 2 workers, TP 2 x PP 2 x DP 2."""
    spec = TrainingJobSpec(roles=[role(tensor=2, pipeline=2)])
    return Topology.from_spec(spec, {r: f"node-{r // 2}" for r in range(8)})


def test_parallelism_is_camel_case_on_the_wire_and_defaults_to_plain_data_parallelism(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(
        textwrap.dedent(
            """\
            apiVersion: stalwart.dev/v1alpha1
            kind: TrainingJob
            metadata: {name: j}
            spec:
              roles:
                - {name: trainer, replicas: 4, processesPerNode: 2, command: [python],
                   parallelism: {tensor: 2, pipeline: 2}}
                - {name: reward, replicas: 1, command: [python]}
            """
        )
    )
    trainer, reward = load_job(path).spec.roles
    assert (trainer.parallelism.tensor, trainer.parallelism.pipeline, trainer.data_parallel) == (2, 2, 2)
    assert reward.parallelism == Parallelism() and reward.data_parallel == 1
    wire = trainer.model_dump(mode="json", by_alias=True)["parallelism"]
    assert wire == {"tensor": 2, "pipeline": 2, "context": 1, "expert": 1}


@pytest.mark.parametrize(
    ("parallelism", "expected"),
    [
        ("{tensor: 3}", "role 'trainer': parallelism does not fit its 8 ranks (4 replicas x 2 processesPerNode)"),
        ("{tensor: 3}", "tensor 3 x context 1 x pipeline 1 = 3 does not divide the world of 8 ranks"),
        ("{tensor: 2, pipeline: 2, expert: 4}", "expert 4 does not divide the data-parallel size 2"),
        ("{tensor: 0}", "spec.roles[0].parallelism.tensor"),
        ("{tensr: 2}", "spec.roles[0].parallelism.tensr: unknown field"),
    ],
)
def test_a_layout_that_does_not_fit_the_world_is_refused_naming_the_role_and_the_numbers(
    tmp_path: Path, parallelism: str, expected: str
) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(
        "apiVersion: stalwart.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: j}\nspec:\n  roles:\n"
        f"    - {{name: trainer, replicas: 4, processesPerNode: 2, command: [python], parallelism: {parallelism}}}\n"
    )
    with pytest.raises(SpecError) as info:
        load_job(path)
    assert expected in str(info.value) and str(path) in str(info.value)


def test_megatron_order_coordinates_and_every_kind_of_group() -> None:
    t = three_d()
    assert t.world_size == 8 and t.describe() == "trainer: tp 2 x pp 2 x dp 2"
    c = t.coords(5)
    assert (c.role, c.tp, c.dp, c.pp) == ("trainer", 1, 0, 1)
    assert t.groups("tp") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert t.groups("dp") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert t.groups("pp") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert t.groups_of(5) == {"tp": [4, 5], "cp": [5], "ep": [5], "dp": [5, 7], "pp": [1, 5]}
    assert len(t.parallel_groups()) == 12  # tp, dp and pp groups of 2; cp and ep are single ranks
    assert t.nodes() == ["node-0", "node-1", "node-2", "node-3"] and t.ranks_on("node-2") == [4, 5]
    assert t.group_nodes([1, 5]) == ["node-0", "node-2"]


def test_the_diagnosis_engine_reads_the_same_layout() -> None:
    """The engine's models.Topology is made from the job's Topology: same coordinates, same groups."""
    job = three_d()
    engine = EngineTopology.of(job)
    assert (engine.tp, engine.pp, engine.dp, engine.rank_nodes) == (2, 2, 2, dict(job.rank_nodes))
    layout = build_layout(engine)
    for rank in range(job.world_size):
        mine = job.coords(rank)
        assert engine.coords(rank) == (mine.tp, mine.pp, mine.dp, mine.cp)
        for kind in ("tp", "dp", "pp"):
            assert sorted(int(r) for r in layout.peers(kind, rank)) == job.groups_of(rank)[kind]  # type: ignore[index]


def test_context_and_expert_parallel_groups() -> None:
    layout = RoleLayout.of(role(replicas=8, procs=2, tensor=2, context=2, expert=2))  # dp = 4
    assert (layout.tp, layout.cp, layout.dp, layout.pp, layout.ep) == (2, 2, 4, 1, 2)
    assert layout.coords(5) == ("trainer", 1, 0, 1, 0, 1)  # rank 5 = tp 1 + 2 * (cp 0 + 2 * dp 1)
    assert layout.groups("cp")[0] == [0, 2]
    assert layout.groups("ep")[:2] == [[0, 4], [1, 5]]  # dp 0 and 1 with the same tp, cp
    assert layout.groups("dp")[0] == [0, 4, 8, 12]


def test_roles_take_consecutive_ranks_each_with_its_own_groups() -> None:
    spec = TrainingJobSpec(roles=[role(replicas=2, procs=2, tensor=2), role(replicas=2, procs=1, name="reward")])
    t = Topology.from_spec(spec)
    assert [(r.role, r.first_rank, r.world_size) for r in t.roles] == [("trainer", 0, 4), ("reward", 4, 2)]
    assert t.coords(4).role == "reward" and t.coords(5).dp == 1
    assert [4, 5] in t.groups("dp") and [0, 1] in t.groups("tp")
    assert all(max(g) < 4 or min(g) >= 4 for kind in GROUP_KINDS for g in t.groups(kind))  # no group spans roles
    engine = EngineTopology.of(t)  # the engine reads one layout: several roles are one DP world
    assert (engine.world_size, engine.tp, engine.dp) == (6, 1, 6)


def test_the_replay_grid_is_stages_by_blocks_of_replicas() -> None:
    grid = three_d().machine_grid()
    assert (grid.pp, grid.dp, grid.replicas_per_machine) == (2, 2, 1)
    assert grid.machines == ["node-0", "node-1", "node-2", "node-3"]  # stage-major
    spec = TrainingJobSpec(roles=[role(replicas=4, procs=4, tensor=2, pipeline=2)])  # dp 4, 2 replicas a node
    wide = Topology.from_spec(spec, {r: f"n{r // 4}" for r in range(16)}).machine_grid()
    assert (wide.pp, wide.dp, wide.replicas_per_machine, wide.machines) == (2, 2, 2, ["n0", "n1", "n2", "n3"])
    assert stage_major([["a", "b"], ["c", "d"]]) == ["a", "c", "b", "d"]


@pytest.mark.parametrize(
    ("replicas", "procs", "parallelism", "why"),
    [
        (4, 2, {"tensor": 4}, "do not hold whole tensor x context slices"),
        (2, 8, {"tensor": 2, "pipeline": 4}, "does not divide DP 2"),
    ],
)
def test_a_node_that_is_not_a_replay_unit_is_said_so(
    replicas: int, procs: int, parallelism: dict[str, int], why: str
) -> None:
    spec = TrainingJobSpec(roles=[role(replicas=replicas, procs=procs, **parallelism)])
    t = Topology.from_spec(spec, {r: f"n{r // procs}" for r in range(replicas * procs)})
    with pytest.raises(ValueError, match=why):
        t.machine_grid()


def test_the_example_job_has_a_real_layout() -> None:
    job = load_job(REPO / "examples" / "pretrain-3d.yaml")
    t = Topology.from_spec(job.spec)
    assert t.describe() == "trainer: tp 2 x pp 2 x dp 2"


def test_the_crd_refuses_a_layout_that_does_not_fit() -> None:
    """The CRD's CEL rules say what the model says, for API servers that check them."""
    celpy = pytest.importorskip("celpy")
    from stalwart_operator import crd

    env = celpy.Environment()
    rules = [env.program(env.compile(r["rule"])) for r in crd._parallelism_rules()]

    def accepted(doc: dict[str, object]) -> bool:
        return all(bool(p.evaluate({"self": celpy.json_to_cel(doc)})) for p in rules)

    base = {"name": "t", "replicas": 4, "processesPerNode": 2}
    assert accepted({**base, "parallelism": {"tensor": 2, "pipeline": 2}}) and accepted(base)
    assert not accepted({**base, "parallelism": {"tensor": 3}})
    assert not accepted({**base, "parallelism": {"tensor": 2, "expert": 3}})
