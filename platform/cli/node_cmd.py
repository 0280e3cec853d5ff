"""`stalwart node list|cordon|uncordon|evict`: take a machine out of service, or put it back.

Inside a running job the controller does it (an OperatorRequest, see stalwart.ops.requests): it
owns the job's slots and standby pool. With a kubeconfig the request goes through the Kubernetes
API (stalwart.ops.actions), so the cluster's RBAC and audit log apply. A machine in no running job is
cordoned by writing its Cordon record directly (etcd only: no controller is there to race with).
"""

from __future__ import annotations

import time
from typing import Annotated

import typer
from pydantic import BaseModel
from rich import box
from rich.table import Table
from rich.text import Text

from stalwart.cli import operator_requests
from stalwart.cli.connection import EtcdOption
from stalwart.cli.errors import cli_errors, print_note
from stalwart.cli.job_actions import JobActions, NamespaceOption, ReadNamespaceOption, open_actions
from stalwart.cli.output import TABLE, Output, OutputOption, show
from stalwart.ops.connection import open_store
from stalwart.ops.errors import OpsError
from stalwart.ops.lookup import in_namespace, job_states, qualified_job, require_state
from stalwart.ops.readable import ago, duration, rank_ranges
from stalwart.ops.requests import requester
from stalwart.ops.status import node_records, node_rows
from stalwart.store import keys
from stalwart.store.client import Store
from stalwart.store.records import Assignment, Cordon, RequestKind

app = typer.Typer(help="List machines; cordon, uncordon or evict one.", no_args_is_help=True)

NodeArg = Annotated[
    str, typer.Argument(metavar="NODE", help="The machine's node name, as `stalwart status JOB` shows it.")
]
JobOption = Annotated[
    str | None,
    typer.Option("--job", "-j", help="The job the node is in (found by itself when the node is in one job)."),
]
YesOption = Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")]
ReasonOption = Annotated[str, typer.Option(help="Why: recorded with the request or the cordon.")]
TimeoutOption = Annotated[float, typer.Option(min=1, help="Seconds to wait for the controller's answer.")]


def confirm(question: str, yes: bool) -> None:
    if yes:
        return
    try:
        ok = typer.confirm(question, default=False)
    except typer.Abort:  # end of input: no answer is a no
        ok = False
    if not ok:
        raise OpsError("not confirmed; nothing was done (--yes skips the question)")


def _ask_controller(
    actions: JobActions, job: str, kind: RequestKind, node: str, reason: str, timeout: float, output: Output
) -> None:
    operator_requests.report(actions.ask(job, kind, node, reason, timeout), output)


def _machine_store(actions: JobActions, node: str, verb: str) -> Store:
    """etcd, to cordon a machine in no job; through the Kubernetes API that is the cluster's own."""
    if actions.store is None:
        raise OpsError(
            f"{node!r} is in no TrainingJob reachable through {actions.where}: to keep a Kubernetes node out "
            f"of every workload, `kubectl {verb} NODE`; or name the job with --job (and -n)"
        )
    return actions.store


@app.command()
@cli_errors
def evict(
    node: NodeArg,
    job: JobOption = None,
    reason: ReasonOption = "evicted by on-call",
    yes: YesOption = False,
    timeout: TimeoutOption = 120.0,
    etcd: EtcdOption = None,
    namespace: NamespaceOption = None,
    output: OutputOption = TABLE,
) -> None:
    """Evict a node from its job now: a standby takes its ranks and the job restarts from its checkpoint.

    The controller carries it out and records an incident; the machine is cordoned.

    Examples:

        stalwart node evict node-3 --job pretrain-tiny --reason "Xid 79 in dmesg"

        stalwart node evict node-3 --yes

        kubectl stalwart node evict node-3 -n ml --job pretrain-tiny
    """
    with open_actions(etcd, namespace) as actions:
        target = actions.job_for_node(node, job)
        if target is None:
            raise OpsError(
                f"node {node!r} is not in any running job; to keep it out of future jobs: stalwart node cordon {node}"
            )
        confirm(
            f"Evict {node} from job {target}? Its workers stop, a standby takes its ranks and the job "
            "restarts from its last checkpoint.",
            yes,
        )
        _ask_controller(actions, target, RequestKind.EVICT, node, reason, timeout, output)


@app.command()
@cli_errors
def cordon(
    node: NodeArg,
    job: JobOption = None,
    reason: ReasonOption = "cordoned by on-call",
    yes: YesOption = False,
    timeout: TimeoutOption = 60.0,
    etcd: EtcdOption = None,
    namespace: NamespaceOption = None,
    output: OutputOption = TABLE,
) -> None:
    """Cordon a machine: no job gives it a slot or keeps it as a standby until it is uncordoned.

    A node inside a running job keeps its ranks until it is evicted; cordoning keeps it from coming back.

    Examples:

        stalwart node cordon node-3 --reason "ECC errors rising"

        stalwart node cordon node-3 --job pretrain-tiny --yes
    """
    with open_actions(etcd, namespace) as actions:
        target = actions.job_for_node(node, job)
        where = f" (in job {target})" if target else ""
        confirm(f"Cordon {node}{where}? No job will place work on it until it is uncordoned.", yes)
        if target is not None:
            _ask_controller(actions, target, RequestKind.CORDON, node, reason, timeout, output)
            return
        store = _machine_store(actions, node, "cordon")
        record = Cordon(node=node, reason=reason, cordoned_at=time.time(), by=requester())
        if not store.create(keys.cordon(node), record):
            existing = store.get(keys.cordon(node), Cordon)
            print_note(
                f"{node} was already cordoned"
                + (f" by {existing.by} {ago(existing.cordoned_at)}: {existing.reason}" if existing else "")
            )
            record = existing or record
        show(output, record, lambda _wide: f"cordoned {node}: {record.reason}")


@app.command()
@cli_errors
def uncordon(
    node: NodeArg,
    job: JobOption = None,
    yes: YesOption = False,
    timeout: TimeoutOption = 60.0,
    etcd: EtcdOption = None,
    namespace: NamespaceOption = None,
    output: OutputOption = TABLE,
) -> None:
    """Uncordon a machine: it may take slots and standby places again (after its pre-flight checks).

    Examples:

        stalwart node uncordon node-3

        stalwart node uncordon node-3 --job pretrain-tiny --yes
    """
    with open_actions(etcd, namespace) as actions:
        target = actions.job_for_node(node, job)
        if target is not None:
            confirm(f"Uncordon {node}? Jobs may place work on it again.", yes)
            _ask_controller(actions, target, RequestKind.UNCORDON, node, "uncordoned by on-call", timeout, output)
            return
        store = _machine_store(actions, node, "uncordon")
        existing = store.get(keys.cordon(node), Cordon)
        if existing is None:
            print_note(f"{node} is not cordoned; nothing to do")
            if not output.human:
                show(output, {"node": node, "cordoned": False}, lambda _wide: "")
            return
        confirm(f"Uncordon {node}? Jobs may place work on it again.", yes)
        store.delete(keys.cordon(node))
        show(output, {"node": node, "cordoned": False}, lambda _wide: f"uncordoned {node}")


class MachineRow(BaseModel):
    node: str
    job: str | None
    state: str
    ranks: list[int]
    host: str | None
    heartbeat_age: float | None
    cordoned: str | None
    role: str | None = None
    generation: int | None = None
    machine_faults: list[str] = []


def machines_table(rows: list[MachineRow], wide: bool) -> Table | str:
    from stalwart.cli.status_cmd import NODE_STYLE

    if not rows:
        return "no machines in running jobs and none cordoned"
    t = Table(title="machines", title_justify="left", box=box.SIMPLE_HEAVY)
    for col in (
        "node",
        "job",
        "state",
        "ranks",
        "host",
        "heartbeat",
        "cordoned",
        *(("role", "gen", "faults") if wide else ()),
    ):
        t.add_column(col, no_wrap=col not in ("cordoned", "faults"), overflow="fold")
    for r in rows:
        t.add_row(
            r.node,
            r.job or "-",
            Text(r.state, style=NODE_STYLE.get(r.state, "magenta")),
            rank_ranges(r.ranks) if r.ranks else "-",
            r.host or "-",
            "-" if r.heartbeat_age is None else f"{duration(r.heartbeat_age)} ago",
            Text(r.cordoned or "-", style="bold magenta" if r.cordoned else "dim"),
            *(
                [r.role or "-", "-" if r.generation is None else str(r.generation), ", ".join(r.machine_faults) or "-"]
                if wide
                else []
            ),
        )
    return t


@app.command("list")
@cli_errors
def list_nodes(
    job: Annotated[str | None, typer.Option("--job", "-j", help="Only this job's nodes.")] = None,
    etcd: EtcdOption = None,
    namespace: ReadNamespaceOption = None,
    output: OutputOption = TABLE,
) -> None:
    """List machines: each running job's nodes with their state, and every cordoned machine.

    Examples:

        stalwart node list

        stalwart node list --job pretrain-tiny -o json

        stalwart node list -o wide -n ml
    """
    now = time.time()
    if job is not None:
        job = qualified_job(job, namespace)
    with open_store(etcd) as store:
        rows: list[MachineRow] = []
        states = [
            s
            for s in job_states(store)
            if (job is None and not s.phase.terminal and in_namespace(store, s.job, namespace)) or s.job == job
        ]
        if job is not None and not states:
            require_state(store, job)
        for state in states:
            assignment = (
                store.get(keys.generation(state.job, state.generation), Assignment) if state.generation else None
            )
            for n in node_rows(store, state, assignment, now, node_records(store, state)):
                rows.append(
                    MachineRow(
                        node=n.node,
                        job=state.job,
                        state=n.state,
                        ranks=n.ranks,
                        host=n.host,
                        heartbeat_age=n.heartbeat_age,
                        cordoned=n.cordoned,
                        role=n.role,
                        generation=n.generation,
                        machine_faults=n.machine_faults,
                    )
                )
        placed = {r.node for r in rows}
        if job is None and not namespace:
            for c in store.get_prefix(keys.cordons_prefix(), Cordon):
                if c.node not in placed:
                    rows.append(
                        MachineRow(
                            node=c.node,
                            job=None,
                            state="cordoned",
                            ranks=[],
                            host=None,
                            heartbeat_age=None,
                            cordoned=c.reason,
                        )
                    )
    show(output, rows, lambda wide: machines_table(rows, wide))
