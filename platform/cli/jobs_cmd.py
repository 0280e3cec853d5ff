"""`stalwart jobs`: every job, the first thing on-call looks at (from etcd, or through the Kubernetes API:
stalwart.ops.reading)."""

from __future__ import annotations

from rich import box
from rich.table import Table
from rich.text import Text

from stalwart.cli.connection import EtcdOption
from stalwart.cli.errors import cli_errors
from stalwart.cli.job_actions import NamespaceOption
from stalwart.cli.output import TABLE, OutputOption, WatchOption, WatchTimeoutOption, show, watch
from stalwart.ops.jobs import JobRow
from stalwart.ops.readable import duration, num, percent
from stalwart.ops.reading import open_reader
from stalwart.styles import phase_text


def jobs_table(rows: list[JobRow], where: str, wide: bool = False) -> Table:
    t = Table(title="jobs", title_justify="left", caption=where, caption_justify="left", box=box.SIMPLE_HEAVY)
    columns = [
        ("job", "left"),
        *([("namespace", "left")] if wide else []),
        ("phase", "left"),
        ("gen", "right"),
        ("step", "right"),
        ("restarts", "right"),
        *([("infra", "right"), ("tokens/s", "right")] if wide else []),
        ("ETTR", "right"),
        ("nodes", "right"),
        ("incidents", "right"),
        ("age", "right"),
        *([("reason", "left")] if wide else []),
    ]
    for col, just in columns:
        t.add_column(col, justify=just, no_wrap=col != "reason", overflow="fold")  # type: ignore[arg-type]
    for r in rows:
        cells: list[str | Text] = [
            r.job,
            *([r.namespace] if wide else []),
            phase_text(r.phase),
            str(r.generation),
            num(r.step),
            str(r.restarts),
            *([str(r.infra_restarts), num(r.tokens_per_second, ",.0f")] if wide else []),
            percent(r.ettr),
            f"{r.nodes_up}/{r.nodes_total}",
            str(r.incidents),
            duration(r.age_seconds),
            *([r.reason or "-"] if wide else []),
        ]
        t.add_row(*cells)
    return t


def jobs_view(rows: list[JobRow], where: str, namespace: str | None, wide: bool) -> Table | str:
    if not rows:
        return f"no jobs{f' in namespace {namespace}' if namespace else ''} in {where}"
    return jobs_table(rows, where, wide)


@cli_errors
def jobs(
    etcd: EtcdOption = None,
    namespace: NamespaceOption = None,
    output: OutputOption = TABLE,
    watch_: WatchOption = False,
    watch_timeout: WatchTimeoutOption = None,
) -> None:
    """List jobs: phase, generation, step, restarts, ETTR, nodes up and age.

    Unfinished jobs come first. ETTR is computed from the job's incidents (docs/control-plane.md).
    With etcd every job is listed (-n keeps one namespace's); through the Kubernetes API (kubectl
    stalwart, or a kubeconfig and no etcd) the TrainingJobs of the namespace, from their status.

    Examples:

        stalwart jobs --etcd 127.0.0.1:2379

        stalwart jobs -o wide -n ml

        stalwart jobs -o json | jq '.[] | select(.phase == "Restarting") | .job'

        stalwart jobs -o jsonpath='{.items[*].job}'

        stalwart jobs --watch
    """
    with open_reader(etcd, namespace) as reader:

        def human(rows: list[JobRow], wide: bool) -> Table | str:
            return jobs_view(rows, reader.where, namespace, wide)

        if watch_:
            watch(output, reader.jobs, lambda rows: rows, human, timeout=watch_timeout)
            return
        rows = reader.jobs()
        show(output, rows, lambda wide: human(rows, wide))
