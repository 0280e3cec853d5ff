"""`stalwart incidents [JOB]` and `stalwart incident ID`: what failed, what Stalwart did, and which runbook."""

from __future__ import annotations

import time
from typing import Annotated

import typer
from rich import box
from rich.console import Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from stalwart.cli.connection import EtcdOption
from stalwart.cli.errors import cli_errors
from stalwart.cli.job_actions import NamespaceOption, ReadNamespaceOption
from stalwart.cli.output import TABLE, OutputOption, show
from stalwart.ops.connection import open_store
from stalwart.ops.incidents import IncidentRow
from stalwart.ops.lookup import find_incident, qualified_job
from stalwart.ops.readable import ago, clock, duration, num
from stalwart.ops.reading import open_reader
from stalwart.runbooks import runbook_for_incident
from stalwart.store.records import Incident


def where(node: str | None, rank: int | None) -> str:
    return (node or "-") + (f"/r{rank}" if rank is not None else "")


def incidents_table(rows: list[IncidentRow], *, show_job: bool, title: str = "incidents", wide: bool = False) -> Table:
    t = Table(title=title, title_justify="left", box=box.SIMPLE_HEAVY)
    cols = (
        ["id"]
        + (["job"] if show_job else [])
        + ["class", "where", "failed", "detect", "downtime", "action", "runbook"]
        + (["gen", "exit", "policy", "suspects"] if wide else [])
    )
    for col in cols:
        t.add_column(col, no_wrap=col != "action", overflow="fold", max_width=40 if col == "action" else None)
    now = time.time()
    for r in rows:
        downtime = duration(r.downtime_seconds) if r.recovered else Text("ongoing", style="bold yellow")
        cells: list[str | Text] = [r.id, r.job] if show_job else [r.id]
        cells.extend(
            [
                Text(r.failure_class, style="bold"),
                where(r.node, r.rank),
                ago(r.failed_at, now),
                duration(r.detect_seconds),
                downtime,
                r.action,
                r.runbook,
            ]
        )
        if wide:
            cells.extend([str(r.generation), num(r.exit_code), r.policy_action or "-", ", ".join(r.suspects) or "-"])
        t.add_row(*cells)
    return t


@cli_errors
def incidents(
    job: Annotated[str | None, typer.Argument(help="Only this job's incidents (default: every job's).")] = None,
    failure_class: Annotated[
        str | None, typer.Option("--class", help="Only this class, e.g. Hang, LostNode, WorkerCrash.")
    ] = None,
    limit: Annotated[int, typer.Option(min=1, help="Show the newest N.")] = 50,
    etcd: EtcdOption = None,
    namespace: NamespaceOption = None,
    output: OutputOption = TABLE,
) -> None:
    """List incidents, oldest first: class, where, detection time, downtime, action and runbook.

    Through the Kubernetes API (kubectl stalwart, or a kubeconfig and no etcd) it lists the newest
    incidents each TrainingJob's status carries (10 a job); with etcd, every one.

    Examples:

        stalwart incidents

        stalwart incidents pretrain-tiny --class Hang

        stalwart incidents -o wide -n ml

        stalwart incidents -o json | jq '.[] | select(.recovered | not)'

        stalwart incidents -o jsonpath='{.items[*].id}'
    """
    with open_reader(etcd, namespace) as reader:
        found = reader.incidents(job)
    name = found[0].job if job and found else job
    if failure_class:
        found = [i for i in found if i.failure_class.lower() == failure_class.lower()]
    rows = found[-limit:]

    def human(wide: bool) -> Group | str:
        if not rows:
            return f"no incidents{f' in job {name}' if name else ''}"
        return Group(
            incidents_table(rows, show_job=name is None, wide=wide),
            Text("details: stalwart incident ID · what to do: stalwart runbook show CLASS", style="dim"),
        )

    show(output, rows, human)


def timeline(inc: Incident) -> Table:
    """Each moment with its clock time and its offset from the failure."""
    t = Table(box=None, show_header=False, pad_edge=False)
    for _ in range(3):
        t.add_column()
    moments = [
        ("failed", inc.failed_at),
        ("detected", inc.detected_at),
        ("diagnosed", inc.diagnosed_at),
        ("restarted", inc.restarted_at),
        ("first step", inc.first_step_at),
    ]
    for name, at in moments:
        offset = "-" if at is None else f"+{at - inc.failed_at:.2f}s"
        t.add_row(name, clock(at), offset)
    return t


def incident_view(inc: Incident):  # type: ignore[no-untyped-def]
    from stalwart.cli.verdict_view import verdict_view

    runbook = runbook_for_incident(inc)
    head = Text.assemble(
        ("Incident ", "bold"),
        (inc.id, "bold cyan"),
        " · ",
        (inc.failure_class.value, "bold red"),
        f" · job {inc.job} · generation {inc.generation}",
    )
    facts = Table(box=None, show_header=False, pad_edge=False)
    facts.add_column(style="bold")
    facts.add_column(overflow="fold")
    exit_text = f" (exit {inc.exit_code})" if inc.exit_code is not None else ""
    facts.add_row("where", where(inc.node, inc.rank) + exit_text)
    facts.add_row("action", inc.action + (f"  [policy {inc.policy_action.value}]" if inc.policy_action else ""))
    if inc.suspects:
        facts.add_row("suspects", ", ".join(inc.suspects))
    if inc.evicted:
        facts.add_row("evicted", ", ".join(inc.evicted))
    if inc.replacements:
        facts.add_row("replaced", ", ".join(f"{a} → {b}" for a, b in inc.replacements.items()))
    facts.add_row("counted", "yes (against maxRestarts)" if inc.counted else "no (an infrastructure failure)")
    facts.add_row(
        "progress",
        f"step {num(inc.step_at_failure)} at failure, resumed at {num(inc.resumed_step)}; "
        f"loss {num(inc.loss_before, '.4f')} → {num(inc.loss_after, '.4f')}",
    )
    facts.add_row("downtime", duration(inc.downtime) if inc.recovered else "ongoing (no step since the failure)")
    parts: list = [head, facts, Panel(timeline(inc), title="timeline", title_align="left")]
    if inc.evidence:
        parts.append(Panel(Text("\n".join(inc.evidence[-20:])), title="evidence", title_align="left"))
    if inc.verdict:
        parts.append(verdict_view(inc.verdict, title="diagnosis at the time"))
    parts.append(
        Text.assemble(
            ("runbook ", "bold"), (runbook, "bold cyan"), f"  stalwart runbook show {runbook}  (runbooks/{runbook}.md)"
        )
    )
    return Group(*parts)


@cli_errors
def incident(
    incident_id: Annotated[
        str, typer.Argument(metavar="ID", help="Incident id (inc-0001-a1b2c3, 0001-a1b2c3, or a unique prefix).")
    ],
    job: Annotated[str | None, typer.Option(help="Look only in this job.")] = None,
    etcd: EtcdOption = None,
    namespace: ReadNamespaceOption = None,
    output: OutputOption = TABLE,
) -> None:
    """Show one incident: timeline, evidence, suspects, the action taken, the verdict and the runbook.

    Examples:

        stalwart incident inc-0001-a1684e

        stalwart incident 0001-a1684e -o yaml
    """
    with open_store(etcd) as store:
        inc = find_incident(store, incident_id, qualified_job(job, namespace) if job else None)
    show(
        output, {**inc.model_dump(mode="json"), "runbook": runbook_for_incident(inc)}, lambda _wide: incident_view(inc)
    )
