"""One controller tick's decision at N nodes, in process: the core's CPU per tick, without etcd.

The controller's core (`ReconcileCore.decide`) over observations of a running job of N nodes x
`--procs` stepping workers, with the records the scale harness's simulated agents write
(support.scale.simnodes). Before each tick, the heartbeats a tick brings at the job's progress
interval arrive (N x 0.5 s / interval: 250 at 10,000 nodes) and the observation logs them
(`BeatChanges`); the catalog writes each decision makes are applied, as a commit would. The
controller loop's collector pacing runs between ticks, as in the loop. CPU seconds per tick are
the figure: they hold on a loaded machine, where wall time does not.

    .venv/bin/python bench/bench_controller_decide.py --nodes 10000 --ticks 42

A run on an older checkout gives the figures to compare with (a `git worktree` of it, the same
command); docs/control-plane-scale.md has such a pair. The report goes to
bench/results/bench_controller_decide.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from support.scale.simnodes import (  # noqa: E402
    advance_workers,
    heartbeat_record,
    registration_record,
    running_workers,
)

from stalwart.cluster.base import NodeInfo  # noqa: E402
from stalwart.controller.core.decision import Decision, Needs  # noqa: E402
from stalwart.controller.core.detectors import default_detectors  # noqa: E402
from stalwart.controller.core.observation import BeatChanges, Observation  # noqa: E402
from stalwart.controller.core.reconcile import ReconcileCore  # noqa: E402
from stalwart.controller.shell.loop import CollectorPacing  # noqa: E402
from stalwart.spec import parse_job  # noqa: E402
from stalwart.store import keys  # noqa: E402
from stalwart.store.heartbeat_budget import job_progress_interval  # noqa: E402
from stalwart.store.records import (  # noqa: E402
    AgentAction,
    AgentCommand,
    CheckpointEntry,
    Heartbeat,
    JobPhase,
    JobStage,
    JobState,
)

REPORT = REPO / "bench" / "results" / "bench_controller_decide.md"
JOB = "scale"


def measure(nodes: int, procs: int, ticks: int, history: int = 30) -> dict[str, Any]:
    spec = parse_job(
        {
            "apiVersion": "stalwart.dev/v1alpha1",
            "kind": "TrainingJob",
            "metadata": {"name": JOB},
            "spec": {
                "roles": [{"name": "trainer", "replicas": nodes, "processesPerNode": procs, "command": ["x"]}],
                "faultTolerance": {"heartbeatIntervalSeconds": 1, "leaseTtlSeconds": 5, "hangTimeoutFloorSeconds": 10},
            },
        },
        "bench",
    )
    t0 = time.time() - 1000
    now = t0 + 700  # (room for the metric history inside the generation)
    slots = [f"node-{i}" for i in range(nodes)]
    standbys = [f"node-{nodes + i}" for i in range(4)]

    def beat(i: int, at: float) -> Heartbeat:
        workers = running_workers(i * procs, procs, t0, slots[i])
        advance_workers(
            workers,
            t0,
            at,
            first_step_after=1.0,
            step_time=1.0,
            checkpoint_interval=spec.spec.checkpoint.interval_steps,
        )
        return heartbeat_record(slots[i], 1, workers, at)

    beats = {n: beat(i, now) for i, n in enumerate(slots)}
    registrations = {n: registration_record(n, JOB, 1000 + i, i, True) for i, n in enumerate(slots + standbys)}
    commands = {n: AgentCommand(generation=1, action=AgentAction.RUN, issued_at=t0) for n in slots + standbys}
    # Each node's metric history, as the controller holds it after `history` progress intervals: the
    # node's vector of each (its time and step moved back), then the current one.
    every = job_progress_interval(spec.spec)
    vectors = {n: deque(maxlen=120) for n in beats}
    for n, b in beats.items():
        for k in range(history, 0, -1):
            vectors[n].append({**b.vector, "at": now - k * every, "step": int(b.vector["step"] - k * every)})
        vectors[n].append(b.vector)
    cluster = {n: NodeInfo(name=n, alive=True) for n in slots + standbys}
    state = JobState(
        job=JOB,
        phase=JobPhase.RUNNING,
        stage=JobStage.RUNNING,
        generation=1,
        slots=slots,
        standbys=standbys,
        next_node_index=nodes + 4,
        created_at=t0,
        updated_at=t0,
        generation_started_at=t0,
    )
    per_tick = max(1, math.ceil(nodes * 0.5 / job_progress_interval(spec.spec)))
    core, pacing = ReconcileCore(JOB, default_detectors()), CollectorPacing()
    log: list[str] = []
    catalog: dict[int, CheckpointEntry] = {}

    def tick(at: float) -> None:
        nonlocal state
        obs = Observation(
            now=at,
            state=state,
            revision=1,
            spec=spec,
            registrations=dict(registrations),
            beats=dict(beats),
            commands=dict(commands),
            vectors=vectors,
            request=None,
            incident=None,
            beat_changes=BeatChanges(log, 0, len(log)),
            cluster=cluster,
            catalog=dict(catalog),
        )
        decision = core.decide(obs)
        while isinstance(decision, Needs):
            decision = core.decide(obs)
        assert isinstance(decision, Decision)
        if decision.state is not None:
            state = decision.state
        prefix = keys.checkpoints_prefix(JOB)
        for key, value in decision.puts.items():
            if key.startswith(prefix) and isinstance(value, CheckpointEntry):
                catalog[value.step] = value
        for key in decision.deletes:
            if key.startswith(prefix):
                catalog.pop(int(key[len(prefix) :]), None)

    tick(now)  # the first look digests every node
    cursor, cpus = 0, []
    for _ in range(ticks):
        now += 0.5
        for _ in range(per_tick):
            i, cursor = cursor, (cursor + 1) % nodes
            beats[slots[i]] = beat(i, now)
            vectors[slots[i]].append(beats[slots[i]].vector)
            log.append(slots[i])
        c0 = time.process_time()
        tick(now)
        cpus.append(time.process_time() - c0)
        pacing.after_tick()
    ordered = sorted(cpus)
    return {
        "nodes": nodes,
        "procs_per_node": procs,
        "ticks": ticks,
        "heartbeats_per_tick": per_tick,
        "cpu_p50_s": round(ordered[len(ordered) // 2], 4),
        "cpu_p90_s": round(ordered[int(0.9 * len(ordered))], 4),
        "cpu_max_s": round(ordered[-1], 4),
        "cpu_s": [round(c, 4) for c in cpus],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--procs", type=int, default=8, help="workers per node")
    parser.add_argument("--ticks", type=int, default=42, help="ticks timed (42: one straggler evaluation at 10,000)")
    parser.add_argument(
        "--history", type=int, default=30, help="metric samples each node already has (one per progress interval)"
    )
    args = parser.parse_args()
    before = os.getloadavg()
    result = measure(args.nodes, args.procs, args.ticks, args.history)
    result["load"] = [round(before[0], 2), round(os.getloadavg()[0], 2)]
    result["cpus"] = os.cpu_count()
    print(json.dumps(result))
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    REPORT.write_text(
        "# bench_controller_decide: one tick's decision, in process\n\n"
        f"Written {time.strftime('%Y-%m-%d %H:%M %Z')}: `python bench/bench_controller_decide.py --nodes {args.nodes}"
        f" --procs {args.procs} --ticks {args.ticks} --history {args.history}`, {result['cpus']} CPUs,"
        f" 1-minute load {result['load'][0]} before"
        f" and {result['load'][1]} after. CPU seconds per tick of `ReconcileCore.decide` at {args.nodes} nodes x"
        f" {args.procs} workers, {args.history} metric samples per node to start with,"
        f" {result['heartbeats_per_tick']} new heartbeats before each tick"
        " (docs/control-plane-scale.md compares it with the code before the digests).\n\n"
        "| nodes | ticks | p50 | p90 | max |\n|---:|---:|---:|---:|---:|\n"
        f"| {args.nodes} | {args.ticks} | {result['cpu_p50_s']} | {result['cpu_p90_s']} | {result['cpu_max_s']} |\n"
    )


if __name__ == "__main__":
    main()
