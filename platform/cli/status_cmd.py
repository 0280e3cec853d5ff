"""`stalwart status JOB`: one job's nodes, ranks and their health, progress, standbys and recent incidents."""

from __future__ import annotations

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from stalwart.cli.connection import EtcdOption
from stalwart.cli.errors import cli_errors
from stalwart.cli.incidents_cmd import incidents_table
from stalwart.cli.job_actions import NamespaceOption
from stalwart.cli.job_arg import JobArg
from stalwart.cli.output import TABLE, OutputOption, WatchOption, WatchTimeoutOption, show, watch
from stalwart.ops.readable import ago, duration, num, percent, rank_ranges
from stalwart.ops.reading import open_reader
from stalwart.ops.status import DETAIL_NODES, NodeRow, RankRow, StatusReport
from stalwart.styles import phase_text

NODE_STYLE = {
    "up": "green",
    "lost": "bold red",
    "standby": "cyan",
    "standby-starting": "yellow",
    "evicted": "red",
    "idle": "dim",
}
HEALTH_STYLE = {
    "ok": "green",
    "stalled": "bold yellow",
    "starting": "yellow",
    "crashed": "bold red",
    "done": "dim",
    "missing": "bold red",
}


def _header(r: StatusReport) -> Table:
    t = Table(box=None, show_header=False, pad_edge=False)
    t.add_column(style="bold")
    t.add_column(overflow="fold")
    t.add_row(
        "job",
        Text.assemble(
            (r.job, "bold cyan"),
            "  ",
            phase_text(r.phase),
            f"  generation {r.generation}  age {duration(r.age_seconds)}",
        ),
    )
    if r.reason or r.message:
        t.add_row("reason", f"{r.reason or '-'}: {r.message or ''}")
    if r.layout:
        t.add_row("layout", r.layout)
    mfu = f"  MFU {r.mfu:.1%}" if r.mfu is not None else ""
    t.add_row(
        "progress", f"step {num(r.step)}  loss {num(r.loss, '.4f')}  tokens/s {num(r.tokens_per_second, ',.0f')}{mfu}"
    )
    t.add_row("restarts", f"{r.restarts} ({r.infra_restarts} caused by the infrastructure)")
    e = r.ettr
    t.add_row(
        "ETTR",
        f"{percent(e['ettr'])}  (downtime {duration(e['downtime_seconds'])}, redone work "
        f"{duration(e['lost_work_seconds'])} over {duration(e['window_seconds'])})",
    )
    ckpt = r.last_checkpoint
    where = "+".join(ckpt.tiers) if ckpt and ckpt.tiers else "tier not reported"
    if ckpt is None and r.partial:
        t.add_row("checkpoint", Text("not in what was read (below)", style="dim"))
    else:
        t.add_row("checkpoint", f"step {ckpt.step} ({where}) {ago(ckpt.committed_at)}" if ckpt else "none yet")
    if r.open_incident:
        t.add_row("incident", Text(f"{r.open_incident} open: stalwart incident {r.open_incident}", style="bold yellow"))
    return t


def nodes_table(rows: list[NodeRow], wide: bool = False) -> Table:
    t = Table(title="nodes", title_justify="left", box=box.SIMPLE_HEAVY, pad_edge=False)
    for col in ("node", "state", "slot", "ranks", "host", "heartbeat", "gen", "faults", *(("role",) if wide else ())):
        t.add_column(col, no_wrap=col != "faults", overflow="fold")
    for n in rows:
        state = Text(n.state, style=NODE_STYLE.get(n.state, ""))
        if n.cordoned:
            state.append(" cordoned", style="bold magenta")
        t.add_row(
            n.node,
            state,
            num(n.node_rank),
            rank_ranges(n.ranks) if n.ranks else "-",
            n.host or "-",
            "-" if n.heartbeat_age is None else f"{duration(n.heartbeat_age)} ago",
            num(n.generation),
            Text(", ".join(n.machine_faults) or "-", style="bold red" if n.machine_faults else "dim"),
            *([n.role or "-"] if wide else []),
        )
    return t


def coords_text(coords: dict[str, int | str] | None, dims: tuple[str, ...]) -> str:
    """'tp1 pp0 dp1' for the dimensions the job splits."""
    return " ".join(f"{d}{coords[d]}" for d in dims) if coords else "-"


def split_dims(rows: list[RankRow]) -> tuple[str, ...]:
    """The parallel dimensions some rank has a non-zero coordinate in (none for a job that is only DP)."""
    dims = tuple(d for d in ("tp", "cp", "pp", "ep") if any(r.coords and r.coords.get(d) for r in rows))
    return (*dims, "dp") if dims else ()


def ranks_table(rows: list[RankRow], wide: bool = False) -> Table:
    """Fits 80 columns: the exit code goes with the health, the class column only when a rank has one,
    the layout column only when the job splits the model (in plain DP it is the rank). Wide adds the
    pid, tokens/s and the rank's last checkpoint."""
    with_class = any(r.failure_class for r in rows)
    dims = split_dims(rows)
    extra = ("pid", "tokens/s", "ckpt") if wide else ()
    t = Table(title="ranks", title_justify="left", box=box.SIMPLE_HEAVY, pad_edge=False)
    for col in (
        ("rank", "node", *(("layout",) if dims else ()), "health", "step", "loss", "step time", "last step")
        + (("class",) if with_class else ())
        + extra
    ):
        t.add_column(col, no_wrap=True, justify="right" if col in ("rank", "step", "loss", "step time") else "left")
    for r in rows:
        health = Text(r.health, style=HEALTH_STYLE.get(r.health, ""))
        if r.exit_code is not None:
            health.append(f" ({r.exit_code})")
        cells: list[str | Text] = [
            str(r.rank),
            r.node or "-",
            *([coords_text(r.coords, dims)] if dims else []),
            health,
            num(r.step),
            num(r.loss, ".4f"),
            "-" if r.step_time is None else f"{r.step_time * 1000:.0f}ms",
            "-" if r.progress_age is None else f"{duration(r.progress_age)} ago",
        ]
        wide_cells = [num(r.pid), num(r.tokens_per_second, ",.0f"), num(r.last_checkpoint_step)] if wide else []
        t.add_row(*cells, *([r.failure_class or "-"] if with_class else []), *wide_cells)
    return t


def status_view(r: StatusReport, wide: bool = False) -> Group:
    parts: list = [_header(r), nodes_table(r.nodes, wide)]
    if r.detail:
        parts.append(ranks_table(r.ranks, wide))
    elif r.partial:
        parts.append(Text(r.partial, style="dim"))
    else:
        parts.append(
            Text(
                f"{len(r.nodes)} nodes: more than {DETAIL_NODES}, so no heartbeat was read and ranks are not "
                "listed (stalwart diagnose JOB looks at every rank)",
                style="dim",
            )
        )
    if r.standbys:
        parts.append(Text(f"standby pool: {', '.join(r.standbys)}", style="cyan"))
    else:
        parts.append(Text("standby pool: empty", style="dim"))
    for req in r.pending_requests:
        parts.append(
            Text(
                f"pending request {req.id}: {req.kind.value} {req.node or 'all nodes'} "
                f"(by {req.requested_by or '?'}, {ago(req.requested_at)})",
                style="yellow",
            )
        )
    if r.incidents:
        title = f"recent incidents ({len(r.incidents)} of {r.incident_count})"
        parts.append(incidents_table(r.incidents, show_job=False, title=title))
    else:
        parts.append(Text("no incidents", style="dim"))
    return Group(*parts)


@cli_errors
def status(
    job: JobArg,
    etcd: EtcdOption = None,
    namespace: NamespaceOption = None,
    output: OutputOption = TABLE,
    watch_: WatchOption = False,
    watch_timeout: WatchTimeoutOption = None,
) -> None:
    """Show a job: progress, nodes and their ranks, each rank's health, the standby pool, recent incidents.

    Through the Kubernetes API (kubectl stalwart, or a kubeconfig and no etcd) it shows the
    TrainingJob's status: the summary, the nodes not healthy and the newest incidents, no rank.

    A rank is "stalled" after 5 of its step times (10 s at least) without a step: look closer with diagnose.

    With --watch it is redrawn as the job changes, until the job finishes or Ctrl-C.

    Examples:

        stalwart status pretrain-tiny

        stalwart status pretrain-tiny -w

        stalwart status pretrain-tiny -o json | jq '.ranks[] | select(.health != "ok")'

        stalwart status pretrain-tiny -o jsonpath='{.phase} {.step}'
    """
    with open_reader(etcd, namespace) as reader:
        if watch_:
            watch(
                output,
                lambda: reader.status(job),
                lambda report: report,
                status_view,
                finished=lambda report: report.phase.terminal,
                timeout=watch_timeout,
            )
            return
        report = reader.status(job)
    show(output, report, lambda wide: status_view(report, wide))
