"""Running the collective and compute checks as real processes, and judging which node failed.

`run_collective_check` starts nodes x procs_per_node processes on loopback with the torchrun
environment, waits for them within a deadline (a rank that hangs is stopped and reported as timed
out, never waited on forever), reads each rank's report and names the nodes that failed:

- a rank whose compute result differs from the majority's: silent data corruption on its node;
- a rank that never finished while others did, or that stalled behind its peers (fewer phases):
  the hung participant (its peers' collective timeouts are its victims, not suspects);
- a bitwise mismatch in a collective with no other explanation: every node in that collective.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from stalwart.health.bandwidth import slow_links
from stalwart.health.collective_records import (
    BACKEND_ENV,
    NUMEL_ENV,
    RENDEZVOUS_TIMEOUT_ENV,
    RESULT_ENV,
    TIMEOUT_ENV,
    CollectiveCheckReport,
    NodeVerdict,
    RankReport,
)
from stalwart.net import free_port
from stalwart.processes import ChildProcess, spawn, stop_process

_POLL = 0.1
EXIT_GRACE_S = 3.0
# A check is several ops (warm-up, timed, latency), each allowed `collective_timeout`: reports that
# stop changing for this many collective timeouts mean a hang the process group did not catch.
STALL_FACTOR = 10
WORKER_MODULE = "stalwart.health.collective_worker"
WORKER_ENTRY = f"{WORKER_MODULE}:main"  # the same, for a process forked from one that has torch

# How a rank starts, from its environment and log file: `start_cold` unless its caller has a faster way.
RankStarter = Callable[[dict[str, str], Path], ChildProcess]
# The compute check's right answer for these ranks, where it can be known (None where it cannot):
# asked only when the ranks' answers disagree.
Reference = Callable[[list[RankReport]], str | None]


def cpu_reference(ranks: list[RankReport]) -> str | None:
    """When every rank ran on CPU, this process can compute the right answer (with two nodes a
    majority cannot say which one is wrong); on GPUs the majority decides. Imports torch: asked only
    when the ranks disagree, so a control plane that never sees a disagreement never loads it."""
    if {r.device for r in ranks if r.compute_digest} != {"cpu"}:
        return None
    import torch

    from stalwart.health.compute_check import compute_digest

    return compute_digest(torch.device("cpu"), env={})


def start_cold(env: dict[str, str], log: Path) -> ChildProcess:
    with open(log, "ab") as out:
        return spawn([sys.executable, "-m", WORKER_MODULE], env=env, stdout=out)


def _read_report(path: Path, rank: int, per_node: int) -> RankReport:
    try:
        return RankReport.loads(path.read_text())
    except (OSError, ValidationError):
        return RankReport(rank=rank, node=rank // per_node, local_rank=rank % per_node, phase="not started")


def judge(
    reports: list[RankReport], procs_per_node: int, timed_out: list[int], reference: Reference | None = None
) -> list[NodeVerdict]:
    """Which nodes failed, and why (tested on constructed reports as well as real runs).

    With a `reference` (the compute check's result computed where it is known to be right, on the
    same kind of device), ranks that disagree are judged against it rather than by majority: with
    two nodes a majority cannot tell which one is wrong. It only decides between the ranks' own
    answers: ranks that all agree are right (the reference is not even asked), and a reference that
    matches none of them is not trusted over their majority (a local cluster computed it in the
    controller's process, got another answer than four agreeing check ranks, and had both healthy
    nodes evicted, while the check still summed floats in an order MKL chose; it is exact now).
    """
    by_rank = {r.rank: r for r in reports}
    nodes = sorted({r.node for r in reports})
    reasons: dict[int, list[str]] = {n: [] for n in nodes}
    suspects: set[int] = set()

    # Silent data corruption: the majority view of the gathered digests, from any finished rank.
    views: list[list[int]] = [r.compute_mismatch_ranks for r in reports if r.phase == "done"]
    mismatched = set(sorted(views, key=len, reverse=True)[0]) if views else set()
    digests = {r.rank: r.compute_digest for r in reports if r.compute_digest}
    answers = set(digests.values())
    asked = reference if len(answers) > 1 else None  # the ranks disagree: the reference decides
    right = asked(reports) if asked is not None else None
    decides = right is not None and right in answers
    if decides:
        mismatched = {rank for rank, d in digests.items() if d != right}
    elif len(answers) == 1:
        mismatched = set()
    against = "the reference" if decides else "the other ranks'"
    # Where a reference was asked and did not decide, say what it gave: a tie then evicts both sides.
    said = f"; the reference gave {right[:12] if right else 'nothing'}" if asked is not None and not decides else ""
    for rank in sorted(mismatched):
        suspects.add(rank)
        reasons[by_rank[rank].node].append(
            f"rank {rank}: compute result differs from {against} (digest {str(digests.get(rank))[:12]}{said})"
        )

    # Hangs: unfinished ranks while others finished, or the ranks at the earliest phase.
    hung: set[int] = set()
    unfinished = [r for r in reports if not r.finished]
    if unfinished:
        if len(unfinished) < len(reports):
            laggards = unfinished
        else:
            lowest = min(r.progress for r in unfinished)
            laggards = [r for r in unfinished if r.progress == lowest]
        for r in laggards:
            hung.add(r.rank)
            how = "timed out" if r.rank in timed_out else "exited without finishing"
            reasons[r.node].append(f"rank {r.rank}: {how} at phase {r.phase!r}, never completing the collectives")
    suspects |= hung

    # Collectives: wrong data blames every node in the collective (corruption in transit has two
    # ends); a failure without wrong data is a victim of a hung peer when one is in the group, else
    # this rank's own failure.
    for r in reports:
        for c in r.checks:
            if c.passed:
                continue
            if c.mismatches:
                for m in c.group:
                    if m in by_rank:
                        suspects.add(m)
                reasons[r.node].append(f"rank {r.rank}: {c.name} over {c.group} returned {c.mismatches} wrong elements")
                continue
            waiting = sorted(h for h in hung if h in c.group and h != r.rank)
            if waiting:
                reasons[r.node].append(
                    f"rank {r.rank}: {c.name} over {c.group} failed (waiting for rank "
                    f"{', '.join(map(str, waiting))}): {c.error}"
                )
            elif hung - {r.rank}:
                # A timeout in a group without the hung ranks is still theirs: the group's other
                # members were stuck in an earlier collective with them and never came.
                reasons[r.node].append(
                    f"rank {r.rank}: {c.name} over {c.group} failed, after ranks "
                    f"{', '.join(map(str, sorted(hung)))} hung: {c.error}"
                )
            elif r.rank not in hung:
                suspects.add(r.rank)
                reasons[r.node].append(f"rank {r.rank}: {c.name} over {c.group} failed: {c.error}")
        if r.error and r.rank not in suspects and not (hung - {r.rank}):
            suspects.add(r.rank)
            reasons[r.node].append(f"rank {r.rank}: {r.error}")

    verdicts = []
    for n in nodes:
        ranks = sorted(r.rank for r in reports if r.node == n)
        verdicts.append(
            NodeVerdict(node=n, ranks=ranks, passed=not any(x in suspects for x in ranks), reasons=reasons[n])
        )
    return verdicts


@dataclass
class RanksOutcome:
    """What a set of check ranks left behind: their reports (as far as each got), the ranks stopped
    as hung, and their exit codes."""

    reports: list[RankReport]
    timed_out: list[int]
    exit_codes: dict[int, int | None]


def run_ranks(
    workdir: Path | str,
    *,
    ranks: Sequence[int],
    world: int,
    procs_per_node: int,
    master_addr: str,
    master_port: int,
    timeout: float,
    collective_timeout: float,
    backend: str = "auto",
    numel: int = 1 << 16,
    rank_env: Mapping[int, Mapping[str, str]] | None = None,
    start: RankStarter = start_cold,
) -> RanksOutcome:
    """Start `ranks` of a `world`-rank check (this machine's share of it: all of them locally, one
    node's on a node agent), wait for them within `timeout` and read their reports.

    `collective_timeout` is the process group's timeout: a healthy rank stuck waiting for a hung
    peer fails its collective after it and reports. Ranks whose reports stop changing (for
    STALL_FACTOR x `collective_timeout` + 5 s, or EXIT_GRACE_S once another rank exited) are stopped
    as timed out.
    """
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    procs: dict[int, ChildProcess] = {}
    paths = {r: workdir / f"rank-{r}.json" for r in ranks}
    try:
        for rank in ranks:
            env = {
                **os.environ,
                "RANK": str(rank),
                "LOCAL_RANK": str(rank % procs_per_node),
                "WORLD_SIZE": str(world),
                "LOCAL_WORLD_SIZE": str(procs_per_node),
                "GROUP_RANK": str(rank // procs_per_node),
                "MASTER_ADDR": master_addr,
                "MASTER_PORT": str(master_port),
                "OMP_NUM_THREADS": "1",
                "PYTHONUNBUFFERED": "1",
                RESULT_ENV: str(paths[rank]),
                NUMEL_ENV: str(numel),
                TIMEOUT_ENV: str(collective_timeout),
                RENDEZVOUS_TIMEOUT_ENV: str(timeout),
                BACKEND_ENV: backend,
                **(rank_env or {}).get(rank, {}),
            }
            procs[rank] = start(env, workdir / f"rank-{rank}.log")
        stall = STALL_FACTOR * collective_timeout + 5.0
        timed_out = _wait(procs, paths, deadline=time.monotonic() + timeout, stall=stall)
    finally:
        for p in procs.values():
            stop_process(p, grace=1.0)
    reports = [_read_report(paths[r], r, procs_per_node) for r in ranks]
    for r in reports:
        if r.rank in timed_out:
            r.finished = False
    return RanksOutcome(reports, timed_out, {r: p.returncode for r, p in procs.items()})


def assemble(
    reports: list[RankReport],
    procs_per_node: int,
    timed_out: list[int],
    exit_codes: Mapping[int, int | None],
    *,
    backend: str,
    started_at: float,
    reference: Reference | None = None,
    bandwidth_floors: Mapping[int, float] | None = None,
) -> CollectiveCheckReport:
    """Judge every rank's report (however they were gathered) into the run's report; bus bandwidth
    against `bandwidth_floors` (per node index) or the peers' median (stalwart.health.bandwidth)."""
    verdicts = with_slow_links(judge(reports, procs_per_node, timed_out, reference), reports, bandwidth_floors)
    passed = (
        all(v.passed for v in verdicts)
        and all(r.finished and r.phase == "done" for r in reports)
        and all(c.passed for r in reports for c in r.checks)
    )
    return CollectiveCheckReport(
        passed=passed,
        backend=next((r.backend for r in reports if r.backend), backend),
        nodes=verdicts,
        ranks=reports,
        timed_out_ranks=sorted(timed_out),
        exit_codes=dict(exit_codes),
        started_at=started_at,
        finished_at=time.time(),
    )


def with_slow_links(
    verdicts: list[NodeVerdict], reports: list[RankReport], floors: Mapping[int, float] | None
) -> list[NodeVerdict]:
    slow = slow_links(reports, floors)
    return [
        v.model_copy(update={"passed": False, "reasons": v.reasons + slow[v.node]}) if v.node in slow else v
        for v in verdicts
    ]


def run_collective_check(
    workdir: Path | str,
    *,
    nodes: int = 2,
    procs_per_node: int = 1,
    timeout: float = 120.0,
    collective_timeout: float = 20.0,
    backend: str = "auto",
    numel: int = 1 << 16,
    rank_env: Mapping[int, Mapping[str, str]] | None = None,
    master_port: int | None = None,
    reference: Reference | None = None,
    start: RankStarter = start_cold,
    bandwidth_floor_gbps: float | None = None,
) -> CollectiveCheckReport:
    """Run the checks on `nodes` x `procs_per_node` local processes; never longer than `timeout`.
    `rank_env` adds environment variables to single ranks (fault injection in tests);
    `bandwidth_floor_gbps` is every node's floor (None: the peers' median, on GPUs)."""
    started = time.time()
    world = nodes * procs_per_node
    outcome = run_ranks(
        workdir,
        ranks=range(world),
        world=world,
        procs_per_node=procs_per_node,
        master_addr="127.0.0.1",
        master_port=master_port or free_port(),
        timeout=timeout,
        collective_timeout=collective_timeout,
        backend=backend,
        numel=numel,
        rank_env=rank_env,
        start=start,
    )
    return assemble(
        outcome.reports,
        procs_per_node,
        outcome.timed_out,
        outcome.exit_codes,
        backend=backend,
        started_at=started,
        reference=reference,
        bandwidth_floors=dict.fromkeys(range(nodes), bandwidth_floor_gbps) if bandwidth_floor_gbps else None,
    )


def _wait(procs: Mapping[int, ChildProcess], paths: Mapping[int, Path], deadline: float, stall: float) -> list[int]:
    """Wait for every process to exit; returns the ranks still running at the deadline or stalled."""
    last_change = time.monotonic()
    last_seen: dict[int, float] = {}
    exited: set[int] = set()
    while time.monotonic() < deadline:  # bounded by the deadline
        running = [r for r, p in procs.items() if p.poll() is None]
        if not running:
            return []
        newly = set(procs) - set(running) - exited
        if newly:
            exited |= newly
            last_change = time.monotonic()  # survivors get their grace from the latest exit
        for r in running:
            try:
                mtime = paths[r].stat().st_mtime
            except OSError:
                continue
            if last_seen.get(r) != mtime:
                last_seen[r] = mtime
                last_change = time.monotonic()
        # Stalled: no report changed for `stall` seconds once every rank has started (start-up is
        # bounded by the deadline only). Once a rank has exited, the rest can complete no further
        # collective with it: they get EXIT_GRACE to write their reports and go.
        quiet = time.monotonic() - last_change
        if len(running) < len(procs) and quiet > EXIT_GRACE_S:
            return sorted(running)
        if len(last_seen) == len(procs) and quiet > stall:
            return sorted(running)
        time.sleep(_POLL)
    return sorted(r for r, p in procs.items() if p.poll() is None)
