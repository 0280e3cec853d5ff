"""StalwartTrainer in one process: a crash mid-run and a restart train exactly what a clean run trains
(the same samples, step by step, and bit-identical weights), and the callback's pieces on their own.

transformers is imported by the module-scoped `hf` fixture, not at the top: every xdist worker collects
every unit test, and only the worker that runs these tests (one group with the other in-process
framework tests) pays for importing it."""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import pytest
import torch
from support.paths import REPO

from stalwart import worker_contract as contract
from stalwart.agents.worker_sdk import trained_samples
from stalwart.dataloader import DataConfig, SourceSpec
from stalwart.integrations.common import SchedulerState

if TYPE_CHECKING:
    from stalwart.integrations.huggingface import StalwartTrainer

pytestmark = pytest.mark.xdist_group("in-process-frameworks")

STEPS = 8


@pytest.fixture(scope="module")
def hf() -> ModuleType:
    return importlib.import_module("stalwart.integrations.huggingface")


def crash_at(step: int) -> Any:
    """A TrainerCallback that stands in for a killed worker: training stops dead at `step`."""
    from transformers import TrainerCallback

    class Crash(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.global_step == step:
                raise RuntimeError(f"crash at step {step}")

    return Crash()


def config() -> DataConfig:
    shards = str(REPO / "examples" / "data" / "shards" / "stories-*.stok")
    return DataConfig(sources=[SourceSpec(name="stories", shards=[shards])], seq_len=16, seed=0)


def trainer(hf: ModuleType, tmp_path: Path, run: str, *callbacks: Any) -> StalwartTrainer:
    from transformers import GPT2Config, GPT2LMHeadModel, TrainingArguments

    torch.manual_seed(0)
    model = GPT2LMHeadModel(
        GPT2Config(vocab_size=257, n_positions=17, n_embd=32, n_layer=1, n_head=2, resid_pdrop=0.0, embd_pdrop=0.0)
    )
    args = TrainingArguments(
        output_dir=str(tmp_path / "out" / run),
        max_steps=STEPS,
        per_device_train_batch_size=2,
        learning_rate=1e-2,
        lr_scheduler_type="linear",
        use_cpu=True,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
    )
    trainer: StalwartTrainer = hf.StalwartTrainer(
        model=model,
        args=args,
        data_config=config(),
        checkpoint_dir=str(tmp_path / "ckpt" / run),
        sample_log=str(tmp_path / "samples" / run),
        callbacks=list(callbacks),
    )
    return trainer


def test_a_restart_trains_exactly_what_a_clean_run_trains(
    hf: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, example_shards: None
) -> None:
    monkeypatch.setenv(contract.CHECKPOINT_INTERVAL, "3")
    clean = trainer(hf, tmp_path, "clean")
    clean.train()

    crashed = trainer(hf, tmp_path, "faulty", crash_at(5))
    with pytest.raises(RuntimeError, match="crash at step 5"):
        crashed.train()
    assert crashed.stalwart._periodic is not None
    crashed.stalwart._periodic.finish()  # the step-3 save, in flight when it crashed

    monkeypatch.setenv(contract.GENERATION, "1")  # a restarted worker's generation
    resumed = trainer(hf, tmp_path, "faulty")
    resumed.train()
    assert resumed.stalwart.resumed_step == 3  # the newest checkpoint, not the crash's step
    assert resumed.state.global_step == STEPS
    assert resumed.stalwart.clock.steps == STEPS - 3 and resumed.stalwart.clock.cpu > 0  # its own time, per step

    assert trained_samples(tmp_path / "samples" / "faulty") == trained_samples(tmp_path / "samples" / "clean")
    for (name, a), b in zip(clean.model.state_dict().items(), resumed.model.state_dict().values(), strict=True):
        assert torch.equal(a, b), name  # model, optimizer, schedule and data all resumed exactly


def test_a_nan_loss_raises_the_rollback_error(hf: ModuleType, tmp_path: Path) -> None:
    callback = hf.StalwartCallback()
    callback.record_loss(torch.tensor(float("nan")))
    state: Any = type("State", (), {"global_step": 7})()
    with pytest.raises(FloatingPointError, match="loss is nan at step 7"):
        callback.on_step_end(None, state, None)  # type: ignore[arg-type]


def test_batches_are_causal_lm_inputs_and_their_ids_are_recorded(
    hf: ModuleType, example_shards: None, tmp_path: Path
) -> None:
    from stalwart.dataloader import open_loader

    loader = open_loader(config(), dp_rank=0, dp_size=1, micro_batch=2)
    callback = hf.StalwartCallback(sample_log=str(tmp_path / "samples"))
    batches = iter(hf.StalwartBatches(loader, callback))
    first = next(batches)
    assert first["input_ids"].shape == (2, 17) and first["labels"] is first["input_ids"]
    assert loader.position == 2  # nothing prefetched: the position is what the Trainer consumed
    assert len(callback._ids) == 2 and callback._tokens == 2 * 16
    assert "data" in callback.timer.times
    callback.samples.close()

    unaudited = hf.StalwartCallback()  # no sample log: the ids are not even gathered, the tokens still count
    next(iter(hf.StalwartBatches(loader, unaudited)))
    assert unaudited._ids == [] and unaudited._tokens == 2 * 16
    loader.close()


def test_scheduler_state_round_trips() -> None:
    model = torch.nn.Linear(2, 2)
    optim = torch.optim.AdamW(model.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optim, lambda step: 1.0 / (step + 1))
    for _ in range(4):
        optim.step()
        scheduler.step()
    saved = SchedulerState(scheduler).state_dict()
    assert all(not callable(v) for v in saved.values())

    fresh_optim = torch.optim.AdamW(model.parameters(), lr=1.0)
    fresh = torch.optim.lr_scheduler.LambdaLR(fresh_optim, lambda step: 1.0 / (step + 1))
    SchedulerState(fresh).load_state_dict(saved)
    assert fresh.last_epoch == 4 and fresh.get_last_lr() == scheduler.get_last_lr()
