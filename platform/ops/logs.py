"""The tail of workers' output, fetched from their nodes through etcd (`stalwart logs`, the console's
logs page).

Nothing outside a node can read its pods' files; every agent watches the job's log-request key and
answers with a LogReport of its workers' tails (as for stacks). Agents that do not answer in time are
named; for workers that already exited, the tail their agent put in the heartbeat is shown instead.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator

from pydantic import BaseModel

from stalwart.ops.errors import NotFound, OpsError
from stalwart.ops.lookup import current_assignment, require_state
from stalwart.processes import wait_for
from stalwart.store import keys
from stalwart.store.client import Store
from stalwart.store.nodes import read_nodes
from stalwart.store.records import JobState, LogReport, LogRequest


class RankOutput(BaseModel):
    rank: int
    node: str
    source: str  # agent (answered the request) or heartbeat (the tail kept after the worker exited)
    exit_code: int | None
    lines: list[str]


def request_logs(store: Store, job: str, rank: int | None, lines: int) -> str:
    request = LogRequest(id=f"log-{uuid.uuid4().hex[:10]}", rank=rank, lines=lines, requested_at=time.time())
    store.put(keys.log_request(job), request)
    return request.id


def collect_logs(store: Store, job: str, request_id: str, nodes: list[str], timeout: float) -> list[LogReport]:
    """Reports from `nodes`, waiting up to `timeout` seconds; a node that does not answer is missing.

    The reports are deleted once read: the asker owns its request, and a console that follows a log
    live asks every few seconds."""

    def reports() -> list[LogReport]:
        return store.get_prefix(keys.logs_prefix(job, request_id), LogReport)

    wait_for(lambda: {r.node for r in reports()} >= set(nodes), timeout, interval=0.2)
    found = sorted(reports(), key=lambda r: r.node)
    store.delete_prefix(keys.logs_prefix(job, request_id))
    return found


def log_nodes(store: Store, job: str, rank: int | None) -> tuple[JobState, list[str]]:
    """The running generation's nodes to ask (the rank's one when given); NotFound for a rank the job lacks."""
    state = require_state(store, job)
    assignment = current_assignment(store, state)
    owners = assignment.rank_nodes()
    if rank is not None and rank not in owners:
        raise NotFound(f"job {job!r} has no rank {rank} (ranks 0-{assignment.world_size - 1})")
    return state, [owners[rank]] if rank is not None else [n.node for n in assignment.nodes]


def read_logs(
    store: Store,
    job: str,
    rank: int | None,
    lines: int,
    timeout: float,
    on_note: Callable[[str], None] = lambda _note: None,
) -> list[RankOutput]:
    """Ask the nodes for their workers' tails now; `on_note` hears about nodes that did not answer.

    Only nodes with a heartbeat are asked: a node without one (lost, or its agent stopped with the
    job) cannot answer, and waiting `timeout` for it only delays the error."""
    state, nodes = log_nodes(store, job, rank)
    beats = read_nodes(store, job).heartbeats
    live = [n for n in nodes if n in beats]
    reports = collect_logs(store, job, request_logs(store, job, rank, lines), live, timeout) if live else []
    found: dict[int, RankOutput] = {}
    for report in reports:
        for w in report.workers:
            if rank is None or w.rank == rank:
                found[w.rank] = RankOutput(
                    rank=w.rank, node=report.node, source="agent", exit_code=None, lines=w.lines[-lines:]
                )
    answered = {r.node for r in reports}
    silent = [n for n in live if n not in answered]
    for node in silent:
        beat = beats[node]  # every node asked has one
        for ws in beat.workers if beat.generation == state.running_generation(node) else []:
            if (rank is None or ws.rank == rank) and ws.log_tail and ws.rank not in found:
                found[ws.rank] = RankOutput(
                    rank=ws.rank, node=node, source="heartbeat", exit_code=ws.exit_code, lines=ws.log_tail[-lines:]
                )
    if silent:
        on_note(
            f"no answer from {', '.join(silent)} within {timeout:.0f}s"
            + ("; showing the tails their heartbeats kept for exited workers" if found else "")
        )
    if not found:
        raise OpsError(no_output_reason(job, rank, state, nodes, live, silent))
    return [found[r] for r in sorted(found)]


def no_output_reason(
    job: str, rank: int | None, state: JobState, nodes: list[str], live: list[str], silent: list[str]
) -> str:
    """Why nothing came back, and where the output is then."""
    what = f"no output from job {job!r}" + (f" rank {rank}" if rank is not None else "")
    if not live and state.phase.terminal:
        return (
            f"{what}: the job has ended ({state.phase.value}) and its agents have stopped, so its workers' "
            "output can no longer be fetched; it stays on the nodes, in the agent's work folder "
            "(WORKDIR/nodes/NODE/gen-NNNN/rank-R.log for `stalwart run`; on Kubernetes, the pod's "
            "work folder, /var/run/stalwart by default, while the pod lasts)"
        )
    gone = [n for n in nodes if n not in live]
    reasons = [f"{len(gone)} of {len(nodes)} node(s) have no heartbeat ({', '.join(gone)})"] if gone else []
    if silent:
        reasons.append(f"{len(silent)} of {len(nodes)} node(s) did not answer the log request")
    return f"{what}: {'; '.join(reasons)} (is the agent running? stalwart status JOB)"


def new_lines(seen: list[str], tail: list[str], anchor: int = 20) -> list[str]:
    """The lines of `tail` after the end of `seen` (the previous tail).

    Agents send tails, not offsets: the last lines of `seen` (up to `anchor` of them) are looked for
    in `tail`, longest match first, at its earliest place (with repeated lines, a line shown twice
    rather than one lost). A tail that holds none of them (the worker wrote more than a tail holds
    between two reads, or restarted) is new as a whole."""
    for k in range(min(len(seen), len(tail), anchor), 0, -1):
        end = seen[-k:]
        for j in range(k, len(tail) + 1):
            if tail[j - k : j] == end:
                return tail[j:]
    return tail


def follow_logs(
    store: Store,
    job: str,
    rank: int | None,
    lines: int,
    timeout: float,
    interval: float = 1.0,
    on_note: Callable[[str], None] = lambda _note: None,
) -> Iterator[RankOutput]:
    """`logs -f`: the tails first, then each rank's new lines as its node reports them, every `interval`
    seconds, until the job is finished or (with a rank) that rank's worker exited; a node that does not
    answer one round is asked again the next. Only ranks with new lines are yielded."""
    seen: dict[int, list[str]] = {}
    first = True
    while True:
        # Read after noticing the end, so that the lines written last are shown too.
        finished = require_state(store, job).phase.terminal
        try:
            found = read_logs(store, job, rank, lines if first else FOLLOW_WINDOW, timeout, on_note=on_note)
        except NotFound:
            if finished:
                return
            raise
        except OpsError as e:
            found = []  # between generations nobody answers: ask again
            if finished and not seen:
                on_note(str(e))  # the job ended before anything could be read: say why nothing shows
        for r in found:
            fresh = r.lines if first else new_lines(seen.get(r.rank, []), r.lines)
            seen[r.rank] = r.lines
            if fresh:
                yield r.model_copy(update={"lines": fresh})
        first = False
        if finished or (rank is not None and any(r.exit_code is not None for r in found)):
            return
        time.sleep(interval)


# Lines asked for on each round of a follow: more than a worker writes between two rounds, usually.
FOLLOW_WINDOW = 1000
