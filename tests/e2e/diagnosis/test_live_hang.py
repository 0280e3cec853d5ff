"""Stack aggregation: parsing real py-spy and faulthandler dumps, classifying ranks, grouping them, and
localizing a hang; plus one small live capture of a real hung gloo job."""

from __future__ import annotations

import sys
from pathlib import Path

from support.paths import REPO

from stalwart.diagnosis import EvidenceBundle, RankStack, Topology, diagnose

CORPUS = REPO / "tests" / "data" / "diagnosis" / "corpus"
sys.path.insert(0, str(REPO / "tests" / "data" / "diagnosis"))


def test_a_live_hang_is_localized(tmp_path: Path) -> None:
    """Four real gloo ranks (TP=1 PP=2 DP=2, two per node); rank 3 stalls in user code; its stacks are
    captured with the agent's capture code and diagnosed."""
    from capture import Run, Scenario, stack_rows  # tests/data/diagnosis/capture.py

    sc = Scenario(
        name="live", kind="hang", description="live", tp=1, pp=2, dp=2, rpn=2, fault="sleep-forward", rank=3, step=3
    )
    run = Run(sc, tmp_path, timeout=120)
    try:
        run.wait_stalled(sc.step - 1, quiet=2.0, timeout=150)
        dumps = run.stacks(native=False)
    finally:
        run.stop()
    assert all(p.poll() is not None for p in run.procs)
    topology = Topology(world_size=4, tp=1, pp=2, dp=2, rank_nodes={r: sc.node_of(r) for r in range(4)})
    bundle = EvidenceBundle(
        job="live",
        kind="hang",
        topology=topology,
        stacks=[
            RankStack(rank=d.rank or 0, node=sc.node_of(d.rank or 0), text=d.text, method=d.method.value) for d in dumps
        ],
    )
    v = diagnose(bundle)
    assert v.flagged == ["node-1"], v.summary
    assert stack_rows  # the capture script's own recording helper is importable too
