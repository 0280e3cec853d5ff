"""Markdown tables of a simulation summary, for docs/simulator.md and the benchmark's output."""

from __future__ import annotations

from stalwart.simulator.model import Component
from stalwart.simulator.run import StrategySummary, Summary

TARGET_ETTR = 0.98


def _pct(x: float) -> str:
    return f"{100 * x:.2f}%"


def _dur(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 120:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.0f} s"


def ettr_table(summary: Summary) -> str:
    rows = [
        "| strategy | ETTR mean | std | min - max | unproductive (h) | incidents | standbys "
        "| resume checkpoint every | restart |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for s in summary.strategies:
        lost = sum(s.lost_hours.values())
        incidents = sum(c.count for c in s.classes.values())
        rows.append(
            f"| {s.strategy} | **{_pct(s.ettr.mean)}** | {100 * s.ettr.std:.2f} pp | {_pct(s.ettr.min)} - "
            f"{_pct(s.ettr.max)} | {lost:.1f} | {incidents:.0f} | "
            f"{'-' if s.standbys is None else s.standbys} | {_dur(s.checkpoint_interval_seconds)} | "
            f"{_dur(s.restart_seconds)} |"
        )
    return "\n".join(rows)


def component_table(summary: Summary) -> str:
    names = [s.strategy for s in summary.strategies]
    rows = ["| time lost per run (hours) | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for c in Component:
        rows.append(
            f"| {c.value} | " + " | ".join(f"{s.lost_hours.get(c, 0.0):.2f}" for s in summary.strategies) + " |"
        )
    rows.append(
        "| **total** | " + " | ".join(f"**{sum(s.lost_hours.values()):.2f}**" for s in summary.strategies) + " |"
    )
    return "\n".join(rows)


def class_table(summary: Summary) -> str:
    names = [s.strategy for s in summary.strategies]
    all_classes = sorted(
        {name for s in summary.strategies for name in s.classes},
        key=lambda n: -max(s.classes[n].count if n in s.classes else 0 for s in summary.strategies),
    )
    head = "| class | " + " | ".join(f"n ({n}) | MTTR ({n})" for n in names) + " |"
    rows = [head, "|---|" + "---|---|" * len(names)]
    for name in all_classes:
        cells = []
        for s in summary.strategies:
            c = s.classes.get(name)
            cells.append("- | -" if c is None else f"{c.count:.1f} | {_dur(c.mttr_seconds)}")
        rows.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def inputs_table(summary: Summary) -> str:
    m, sc = summary.measured, summary.scaled
    how = "default (the recovery benchmark has not run)" if m.source == "defaults" else f"measured ({m.source})"
    rows = [
        "| input | value | how |",
        "|---|---|---|",
        f"| measured on | {m.machine} | source: `{m.source}` |",
        f"| local hot-swap | {m.hot_swap_seconds:.1f} s | {how} |",
        f"| local requeue | {m.requeue_seconds:.1f} s | {how} |",
        (
            f"| local checkpoint stall | {m.checkpoint_stall_seconds:.3f} s for "
            f"{m.checkpoint_bytes_per_rank / 1e9:.2f} GB | "
            f"{how if m.source != 'defaults' else 'measured by bench/bench_checkpoint.py'} |"
        ),
        f"| in-place restart at scale | {sc.in_place_restart_seconds:.1f} s | {sc.notes['in_place_restart']} |",
        f"| requeue at scale | {sc.requeue_seconds:.1f} s | {sc.notes['requeue']} |",
        f"| checkpoint stall at scale | {sc.checkpoint_stall_seconds:.3f} s | {sc.notes['checkpoint_stall']} |",
        f"| stack capture at scale | {sc.stack_capture_seconds:.1f} s | {sc.notes['stack_capture']} |",
    ]
    for event, seconds in sorted(m.detect_seconds.items(), key=lambda kv: kv[0].value):
        rows.append(f"| detect {event.value} (local) | {seconds:.1f} s | {how} |")
    return "\n".join(rows + control_plane_rows(summary))


def control_plane_rows(summary: Summary) -> list[str]:
    """What the control plane adds at the job's size (docs/control-plane-scale.json), and how each
    figure was had: interpolated, or the small-job figures with the reason."""
    cp = summary.control_plane
    notes = cp.notes
    ticks = (
        "-"
        if cp.tick_p50_seconds is None or cp.tick_p99_seconds is None
        else f"{cp.tick_p50_seconds:.2f} / {cp.tick_p99_seconds:.2f} s"
    )
    return [
        f"| control plane at {cp.nodes:,} nodes | label `{cp.label or '-'}` | source: `{cp.source}` |",
        (
            f"| + lease expiry to eviction decision (added to lost-node detection) | "
            f"{cp.lease_decision_seconds:.2f} s | {notes.get('lease_decision_seconds', '')} |"
        ),
        (
            f"| + hang detection past its timeout (added to Stalwart's hang detection) | "
            f"{cp.hang_beyond_timeout_seconds:.2f} s | {notes.get('hang_beyond_timeout_seconds', '')} |"
        ),
        (
            f"| controller tick p50 / p99 (shown, not added: the two figures above include the ticks "
            f"that made them) | {ticks} | {notes.get('tick_p50_seconds', '')} |"
        ),
    ]


def verdict(summary: Summary) -> str:
    st = next((s for s in summary.strategies if s.strategy == "stalwart"), None)
    if st is None:
        return ""
    ok = st.ettr.min >= TARGET_ETTR
    return (
        f"Target ETTR >= {_pct(TARGET_ETTR)} for Stalwart: **{'met' if ok else 'not met'}** "
        f"(mean {_pct(st.ettr.mean)}, worst seed {_pct(st.ettr.min)})."
    )


def comparison(summary: Summary) -> str:
    """Unproductive time of each strategy relative to requeue, the anchor."""
    by = {s.strategy: s for s in summary.strategies}
    anchor = by.get("requeue")
    if anchor is None:
        return ""
    base = sum(anchor.lost_hours.values())
    lines = []
    for s in summary.strategies:
        if s is anchor:
            continue
        lost = sum(s.lost_hours.values())
        lines.append(
            f"- {s.strategy}: {lost:.1f} h unproductive per run against requeue's {base:.1f} h "
            f"({base / lost:.1f}x less)."
        )
    return "\n".join(lines)


def strategy_line(s: StrategySummary) -> str:
    return f"- **{s.strategy}**: {s.description}"


def markdown(summary: Summary, command: str) -> str:
    j = summary.job
    return "\n\n".join(
        [
            (
                f"Produced by `{command}`: {len(summary.seeds)} seeds ({summary.seeds[0]}..{summary.seeds[-1]}), "
                f"{j.gpus:,} GPUs ({j.nodes:,} nodes), {j.days:.0f} days, {j.step_seconds:.0f} s steps, "
                f"{summary.expected_failures:.0f} incidents expected per run (planned updates included). "
                f"Every strategy replays the same trace for each seed."
            ),
            "\n".join(strategy_line(s) for s in summary.strategies),
            ettr_table(summary),
            verdict(summary),
            comparison(summary),
            "### Time lost per component\n\n" + component_table(summary),
            "### Per class (mean count per run, MTTR = failure to first step after recovery)\n\n"
            + class_table(summary),
            "### Recovery inputs\n\n" + inputs_table(summary),
        ]
    )
