"""Terminal rendering of a running job (the CLI is the only place that prints for humans)."""

from __future__ import annotations

import time

from rich import box
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from stalwart.runner.summary import JobSnapshot
from stalwart.store.records import Incident, JobPhase
from stalwart.styles import phase_text


def _fmt(value: float | None, spec: str, missing: str = "-") -> str:
    return missing if value is None else format(value, spec)


def progress_line(s: JobSnapshot) -> str:
    return (
        f"[{s.elapsed_seconds:6.1f}s] {s.job} {s.phase.value:<10} gen={s.generation} step={s.step or 0} "
        f"loss={_fmt(s.loss, '.4f')} tokens/s={_fmt(s.tokens_per_second, ',.0f')} "
        f"nodes={s.nodes_up}/{s.nodes_total} standbys={len(s.standbys)} restarts={s.restarts}+{s.infra_restarts}"
    )


def progress_table(s: JobSnapshot) -> Table:
    t = Table(title=f"stalwart run · {s.job}", title_justify="left", expand=False)
    for col in ("phase", "gen", "step", "loss", "tokens/s", "nodes", "standbys", "restarts", "elapsed"):
        t.add_column(col, justify="right" if col not in ("phase",) else "left")
    t.add_row(
        phase_text(s.phase),
        str(s.generation),
        str(s.step or 0),
        _fmt(s.loss, ".4f"),
        _fmt(s.tokens_per_second, ",.0f"),
        f"{s.nodes_up}/{s.nodes_total}",
        str(len(s.standbys)),
        f"{s.restarts}+{s.infra_restarts}",
        f"{s.elapsed_seconds:.0f}s",
    )
    return t


def _since(inc: Incident, t: float | None) -> str:
    return "-" if t is None else f"{t - inc.failed_at:.2f}"


def incidents_table(incidents: list[Incident]) -> Table:
    """Times are seconds after the failure; fits an 80-column terminal."""
    t = Table(
        title="incidents (seconds after the failure)",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=True,
    )
    for col in ("id", "class", "where", "exit", "detect", "restart", "1st step", "resumed"):
        t.add_column(col, no_wrap=True)
    for inc in incidents:
        where = (inc.node or "-") + (f"/r{inc.rank}" if inc.rank is not None else "")
        t.add_row(
            inc.id.removeprefix("inc-"),
            inc.failure_class.value,
            where,
            _fmt(inc.exit_code, "d"),
            _since(inc, inc.detected_at),
            _since(inc, inc.restarted_at),
            _since(inc, inc.first_step_at),
            _fmt(inc.resumed_step, "d"),
        )
    return t


def summary_view(s: JobSnapshot) -> Group:
    ettr = s.ettr.ettr
    lines = [
        Text.assemble(("Job ", "bold"), (s.job, "bold cyan"), " ", phase_text(s.phase)),
        Text(f"  reason     {s.reason or '-'}: {s.message or ''}"),
        Text(f"  steps      {s.step or 0}"),
        Text(f"  final loss {_fmt(s.loss, '.4f')}"),
        Text(f"  restarts   {s.restarts} counted, {s.infra_restarts} caused by the infrastructure"),
        Text(f"  incidents  {len(s.incidents)}"),
        Text(
            f"  ETTR       {_fmt(None if ettr is None else ettr * 100, '.1f')}% "
            f"(downtime {s.ettr.downtime_seconds:.1f}s, redone work {s.ettr.lost_work_seconds:.1f}s "
            f"over {s.ettr.window_seconds:.1f}s)"
        ),
        Text(f"  wall time  {s.elapsed_seconds:.1f}s"),
    ]
    parts: list = [*lines]
    if len(s.roles) > 1:
        mttr = {m.role: m.mttr_seconds for m in s.mttr_by_role}
        parts += [
            Text(
                f"  role {r.role:<12} gen {r.generation}  scope {r.restart_scope:<4}  restarted {r.restarted}  "
                f"restarts {r.restarts} counted + {r.infra_restarts}  incidents {r.incidents}  "
                f"MTTR {_fmt(mttr.get(r.role), '.1f')}s"
            )
            for r in s.roles
        ]
    if s.incidents:
        parts.append(incidents_table(s.incidents))
        parts += [Text(f"  {inc.id}: {inc.action}") for inc in s.incidents]
    return Group(*parts)


class ProgressView:
    """A live table on a terminal; a line every few seconds (and on every phase change) otherwise."""

    def __init__(self, console: Console, plain_every: float = 5.0) -> None:
        self.console = console
        self.live: Live | None = None
        self.plain_every = plain_every
        self._last_plain = 0.0
        self._last_phase: JobPhase | None = None

    def __enter__(self) -> ProgressView:
        if self.console.is_terminal:
            self.live = Live(console=self.console, refresh_per_second=4, transient=False)
            self.live.__enter__()
        return self

    def update(self, s: JobSnapshot) -> None:
        if self.live is not None:
            self.live.update(progress_table(s))
            return
        now = time.monotonic()
        if s.phase != self._last_phase or now - self._last_plain >= self.plain_every:
            self.console.print(progress_line(s), highlight=False)
            self._last_plain, self._last_phase = now, s.phase

    def note(self, message: str) -> None:
        self.console.print(message, highlight=False, markup=False)  # "[fault] ..." is text, not a style

    def __exit__(self, *exc: object) -> None:
        if self.live is not None:
            self.live.__exit__(None, None, None)
