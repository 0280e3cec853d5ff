"""The actor's ledger: the history a model carries after restarts, and the exactly-once check."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from stalwart.dataloader import DataConfig, SourceSpec, global_ids, write_shard
from stalwart.rlhf.ledger import CheckpointRecord, Ledger, StartRecord, StepRecord, history, main, problems, read

PER_STEP = 4


@pytest.fixture
def data(tmp_path: Path) -> DataConfig:
    """64 one-token-per-sample prompts: enough for a few steps, and a second epoch."""
    path = tmp_path / "prompts.stok"
    write_shard(path, np.arange(65, dtype=np.uint16) % 200, vocab_size=257)
    return DataConfig(sources=[SourceSpec(name="p", shards=[str(path)])], seq_len=1, seed=3)


def step_records(config: DataConfig, incarnation: str, first: int, last: int) -> list[StepRecord]:
    ids = global_ids(config, 0, last * PER_STEP).tolist()
    return [
        StepRecord(
            incarnation=incarnation,
            step=s,
            position=(s - 1) * PER_STEP,
            sample_ids=ids[(s - 1) * PER_STEP : s * PER_STEP],
            reward=0.1 * s,
        )
        for s in range(first, last + 1)
    ]


def start(config: DataConfig, incarnation: str, base: int) -> StartRecord:
    return StartRecord(incarnation=incarnation, base_step=base, prompts_per_step=PER_STEP, data=config)


def test_a_restart_replaces_the_steps_after_its_checkpoint(data: DataConfig) -> None:
    records = [
        start(data, "a", 0),
        *step_records(data, "a", 1, 7),  # checkpoint at 5, then a crash after step 7
        start(data, "b", 5),
        *step_records(data, "b", 6, 10),
    ]
    steps = history(records)
    assert [(r.step, r.incarnation) for r in steps] == [(s, "a") for s in range(1, 6)] + [
        (s, "b") for s in range(6, 11)
    ]
    assert problems(records) == []


def test_a_skipped_step_a_repeated_prompt_and_a_wrong_order_are_named(data: DataConfig) -> None:
    steps = step_records(data, "a", 1, 4)
    skipped = [start(data, "a", 0), steps[0], steps[2]]
    assert "comes where step 2 should" in problems(skipped)[0]
    twice = [start(data, "a", 0), steps[0], steps[1].model_copy(update={"sample_ids": steps[0].sample_ids})]
    found = problems(twice)
    assert any("a clean run trains sample" in p for p in found) and any("twice" in p for p in found)
    swapped = steps[1].model_copy(update={"sample_ids": list(reversed(steps[1].sample_ids))})
    assert "a clean run trains sample" in problems([start(data, "a", 0), steps[0], swapped])[0]
    assert problems([steps[0]]) == ["the ledger has no start record"]


def test_a_torn_last_line_is_ended_before_the_next_writer_appends(tmp_path: Path, data: DataConfig) -> None:
    path = tmp_path / "ledger.jsonl"
    ledger = Ledger(path)
    ledger.write(start(data, "a", 0))
    ledger.write(step_records(data, "a", 1, 1)[0])
    ledger.close()
    with open(path, "a") as f:
        f.write('{"event": "step", "incarn')  # the writer was killed mid-line
    ledger = Ledger(path)
    ledger.write(start(data, "b", 1))
    for record in step_records(data, "b", 2, 3):
        ledger.write(record)
    ledger.write(CheckpointRecord(incarnation="b", step=3))
    ledger.close()
    records, torn = read(path)
    assert torn == 1 and problems(records) == [] and len(history(records)) == 3


def test_the_command_line_check_exits_nonzero_naming_the_problem(
    tmp_path: Path, data: DataConfig, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "ledger.jsonl"
    ledger = Ledger(path)
    ledger.write(start(data, "a", 0))
    steps = step_records(data, "a", 1, 2)
    ledger.write(steps[0])
    ledger.write(steps[0].model_copy(update={"step": 2}))
    ledger.close()
    out = subprocess.run([sys.executable, "-m", "stalwart.rlhf.ledger", str(path)], capture_output=True, text=True)
    assert out.returncode == 1 and "twice" in out.stderr and '"exact": false' in out.stdout
    assert main([str(tmp_path / "none.jsonl")]) == 2
    assert "no such ledger" in capsys.readouterr().err
