"""What the actor trained on, step by step, and the check that every prompt counts exactly once.

The actor's rank 0 appends one JSON line per event to the ledger: a `start` (its incarnation, the
step it resumed from, the prompt data), a `step` (the sample ids trained on, the mean reward), a
`checkpoint` once one commits, a `finish`. Steps after the last checkpoint of a crashed incarnation
are in the file but not in the model; the history keeps, for each step, what the model carries: a
start at step s drops every step after s written before it.

    python -m stalwart.rlhf.ledger LEDGER.jsonl     # exits 1, naming the problem, unless exact
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
from pydantic import BaseModel, Field, TypeAdapter, ValidationError

from stalwart.dataloader.config import DataConfig
from stalwart.dataloader.dataset import TokenDataset
from stalwart.dataloader.errors import DataError
from stalwart.dataloader.sample_id import decode as decode_sample_id


class _Event(BaseModel):
    incarnation: str  # the actor's start that wrote it
    time: float = Field(default_factory=time.time)


class StartRecord(_Event):
    event: Literal["start"] = "start"
    base_step: int  # the checkpointed step it resumed from (0: from scratch)
    prompts_per_step: int
    data: DataConfig


class StepRecord(_Event):
    event: Literal["step"] = "step"
    step: int
    position: int  # the loader position of the step's first prompt
    sample_ids: list[int]  # every prompt of the step, all ranks, in loader order
    reward: float  # mean reward of the step's samples
    kl: float = 0.0
    versions: list[int] = []  # weight steps that generated the step's groups


class CheckpointRecord(_Event):
    event: Literal["checkpoint"] = "checkpoint"
    step: int


class FinishRecord(_Event):
    event: Literal["finish"] = "finish"
    step: int


LedgerRecord = Annotated[StartRecord | StepRecord | CheckpointRecord | FinishRecord, Field(discriminator="event")]
_RECORD: TypeAdapter[LedgerRecord] = TypeAdapter(LedgerRecord)


class Ledger:
    """Append-only; each record is one write of one line, so a killed writer leaves whole lines
    (and at worst one torn last line, which the next writer ends before appending)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        size = os.fstat(self._fd).st_size
        if size:
            with open(self.path, "rb") as f:
                f.seek(size - 1)
                if f.read(1) != b"\n":
                    os.write(self._fd, b"\n")

    def write(self, record: StartRecord | StepRecord | CheckpointRecord | FinishRecord) -> None:
        os.write(self._fd, (record.model_dump_json() + "\n").encode())

    def close(self) -> None:
        os.close(self._fd)


def read(path: str | Path) -> tuple[list[LedgerRecord], int]:
    """The records, and how many lines were not records (torn by a kill)."""
    records: list[LedgerRecord] = []
    torn = 0
    for line in Path(path).read_text().splitlines():
        if not line.strip():
            continue
        try:
            records.append(_RECORD.validate_json(line))
        except ValidationError:
            torn += 1
    return records, torn


def history(records: Sequence[LedgerRecord]) -> list[StepRecord]:
    """The steps the final model carries, in order: each start cuts what came after its base step."""
    steps: list[StepRecord] = []
    for record in records:
        if isinstance(record, StartRecord):
            del steps[record.base_step :]
        elif isinstance(record, StepRecord):
            steps.append(record)
    return steps


def problems(records: Sequence[LedgerRecord]) -> list[str]:
    """Empty when the history trains on exactly the prompts of a clean run, in order, each once per epoch."""
    starts = [r for r in records if isinstance(r, StartRecord)]
    if not starts:
        return ["the ledger has no start record"]
    first = starts[0]
    steps = history(records)
    found: list[str] = []
    for i, record in enumerate(steps, start=1):
        if record.step != i:
            found.append(f"step {record.step} of incarnation {record.incarnation} comes where step {i} should")
            return found
    trained = np.array([sid for r in steps for sid in r.sample_ids], dtype=np.int64)
    dataset = TokenDataset(first.data)  # not the loader: the check needs no torch
    try:
        expected = dataset.order.sample_ids(np.arange(len(trained)))
    finally:
        dataset.close()
    if len(trained) != len(steps) * first.prompts_per_step:
        found.append(f"{len(trained)} prompts over {len(steps)} steps, expected {first.prompts_per_step} per step")
    differ = np.nonzero(trained != expected)[0]
    if differ.size:
        i = int(differ[0])
        found.append(
            f"prompt {i} (step {i // first.prompts_per_step + 1}) is sample {int(trained[i])}, "
            f"a clean run trains sample {int(expected[i])} there"
        )
    seen: set[tuple[int, int, int]] = set()
    for sid in trained.tolist():
        ref = decode_sample_id(sid)
        key = (ref.source, ref.epoch, ref.index)
        if key in seen:
            found.append(f"sample {sid} (epoch {ref.epoch}) is trained on twice")
            break
        seen.add(key)
    return found


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m stalwart.rlhf.ledger", description=__doc__.splitlines()[0])
    parser.add_argument("ledger", type=Path)
    args = parser.parse_args(argv)
    if not args.ledger.is_file():
        print(f"error: {args.ledger}: no such ledger", file=sys.stderr)
        return 2
    records, torn = read(args.ledger)
    steps = history(records)
    starts = [r for r in records if isinstance(r, StartRecord)]
    try:
        found = problems(records)
    except DataError as exc:
        print(f"error: cannot read the prompts this ledger names: {exc}", file=sys.stderr)
        return 2
    summary = {
        "steps": len(steps),
        "prompts": sum(len(r.sample_ids) for r in steps),
        "incarnations": [(r.incarnation, r.base_step) for r in starts],
        "steps_redone": sum(1 for r in records if isinstance(r, StepRecord)) - len(steps),
        "torn_lines": torn,
        "exact": not found,
    }
    print(json.dumps(summary))
    for problem in found:
        print(f"problem: {problem}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
