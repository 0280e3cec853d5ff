"""The learning curve of a GRPO run, from the actor's ledger, as a markdown table.

    python examples/rlhf/curve.py LEDGER.jsonl [--every 10]

Each row is a window of steps of the history the final model carries (steps redone after a restart
count once): the mean reward of the window, the KL to the reference, the time since the first step.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from statistics import mean

from stalwart.rlhf.ledger import history, problems, read

BAR = 40


def table(ledger: Path, every: int) -> str:
    records, _ = read(ledger)
    steps = history(records)
    if not steps:
        raise SystemExit(f"{ledger}: no steps yet")
    t0 = steps[0].time
    lines = [
        "| steps | mean reward | KL to reference | seconds since step 1 | |",
        "|---|---|---|---|---|",
    ]
    for start in range(0, len(steps), every):
        window = steps[start : start + every]
        reward = mean(r.reward for r in window)
        lines.append(
            f"| {window[0].step}-{window[-1].step} | {reward:.3f} | {mean(r.kl for r in window):.4f} | "
            f"{window[-1].time - t0:.1f} | `{'#' * round(reward * BAR):<{BAR}}` |"
        )
    found = problems(records)
    lines.append("")
    lines.append(
        f"{len(steps)} steps, {sum(len(r.sample_ids) for r in steps)} prompts, "
        + ("each trained on exactly once." if not found else f"NOT exact: {found[0]}")
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ledger", type=Path)
    parser.add_argument("--every", type=int, default=10, help="steps per row")
    args = parser.parse_args()
    print(table(args.ledger, args.every))


if __name__ == "__main__":
    main()
