"""ETTR of a 9,600-GPU, 90-day job under requeue, ByteRobust-like and Stalwart, by simulation.

Reads docs/recovery-measured.json (written by the recovery benchmark) when it exists, else the
labeled defaults, and the control plane's figures at the job's size from docs/control-plane-scale.json
(written by bench/bench_control_plane.py; its newest run unless --control-plane-label names one,
the small-job figures where it has none); prints the tables, and with --write-docs replaces the results section of
docs/simulator.md (between its `results:begin` and `results:end` markers).

    python bench/bench_ettr_sim.py --seeds 20 --write-docs
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from stalwart.simulator.control_plane import ControlPlaneAtScale

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "simulator.md"
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"


def sensitivity(seeds: list[int], measured_path: Path | None, control_plane: ControlPlaneAtScale) -> str:
    """How Stalwart's ETTR moves when one estimate or measurement moves (same seeds)."""
    from stalwart.simulator.measured import load_measured
    from stalwart.simulator.rates import default_classes
    from stalwart.simulator.run import run_many
    from stalwart.simulator.scaling import JobModel
    from stalwart.simulator.strategies import byterobust_like, stalwart

    measured = load_measured(measured_path)
    base, classes = JobModel(), default_classes()
    slow_swap = measured.model_copy(update={"hot_swap_seconds": 3 * measured.hot_swap_seconds})
    cases = [
        ("defaults", base, classes, stalwart(measured, base, classes, control_plane=control_plane)),
        (
            "without the estimated classes (Llama 3 data + planned only)",
            base,
            default_classes(include_estimates=False),
            stalwart(measured, base, default_classes(include_estimates=False), control_plane=control_plane),
        ),
        (
            f"local hot-swap x3 ({slow_swap.hot_swap_seconds:.0f} s)",
            base,
            classes,
            stalwart(slow_swap, base, classes, control_plane=control_plane),
        ),
        (
            "collective init 90 s instead of 30 s",
            base,
            classes,
            stalwart(
                measured,
                base.model_copy(update={"collective_init_seconds": 90.0}),
                classes,
                control_plane=control_plane,
            ),
        ),
        (
            "stop-time checks 10 min",
            base,
            classes,
            stalwart(
                measured,
                base.model_copy(update={"stop_time_check_seconds": 600.0}),
                classes,
                control_plane=control_plane,
            ),
        ),
        (
            "no warm standbys (every eviction a cold replacement)",
            base,
            classes,
            stalwart(measured, base, classes, control_plane=control_plane).model_copy(update={"standbys": 0}),
        ),
        (
            "failure rates x2",
            base,
            [c.model_copy(update={"count": 2 * c.count}) for c in classes],
            stalwart(
                measured,
                base,
                [c.model_copy(update={"count": 2 * c.count}) for c in classes],
                control_plane=control_plane,
            ),
        ),
        (
            "ByteRobust-like with free per-step checkpoints (not Stalwart)",
            base,
            classes,
            byterobust_like(measured, base, classes, zero_stall_every_step=True, control_plane=control_plane),
        ),
    ]
    rows = ["| case | ETTR mean | min |", "|---|---|---|"]
    for label, job, case_classes, strategy in cases:
        runs = run_many([strategy], case_classes, job, seeds)[strategy.name]
        values = [r.ettr for r in runs]
        rows.append(f"| {label} | {100 * sum(values) / len(values):.2f}% | {100 * min(values):.2f}% |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    from stalwart.simulator.control_plane import CONTROL_PLANE_PATH, load_control_plane
    from stalwart.simulator.measured import load_measured
    from stalwart.simulator.report import markdown
    from stalwart.simulator.run import run_default
    from stalwart.simulator.scaling import JobModel

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=20, help="simulated jobs per strategy (seeds 0..N-1)")
    ap.add_argument("--measured", type=Path, default=None, help="recovery-measured.json (default: docs/)")
    ap.add_argument(
        "--control-plane",
        type=Path,
        default=CONTROL_PLANE_PATH,
        help="the scale harness's control-plane-scale.json (default: docs/)",
    )
    ap.add_argument(
        "--control-plane-label", default=None, help="which run of it to use (default: the newest, by its 'when')"
    )
    ap.add_argument("--write-docs", action="store_true", help="replace the results section of docs/simulator.md")
    ap.add_argument("--doc", type=Path, default=DOC)
    args = ap.parse_args(argv)

    seeds = list(range(max(1, min(args.seeds, 1000))))
    started = time.perf_counter()
    try:
        control_plane = load_control_plane(args.control_plane, nodes=JobModel().nodes, label=args.control_plane_label)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    summary = run_default(seeds, measured=load_measured(args.measured), control_plane=control_plane)
    command = "python bench/bench_ettr_sim.py --seeds " + str(len(seeds)) + (" --write-docs" if args.write_docs else "")
    if args.control_plane_label:
        command += f" --control-plane-label {args.control_plane_label}"
    body = markdown(summary, command)
    body += "\n\n### Sensitivity\n\n" + sensitivity(seeds, args.measured, control_plane)
    elapsed = time.perf_counter() - started
    print(body)
    print(f"\n({len(seeds)} seeds x {len(summary.strategies)} strategies + sensitivity in {elapsed:.1f} s)")
    if args.write_docs:
        text = args.doc.read_text()
        if BEGIN not in text or END not in text:
            print(f"{args.doc} has no {BEGIN} ... {END} section", file=sys.stderr)
            return 1
        head, rest = text.split(BEGIN, 1)
        _, tail = rest.split(END, 1)
        args.doc.write_text(head + BEGIN + "\n\n" + body + "\n\n" + END + tail)
        print(f"wrote the results section of {args.doc}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
