"""stalwart.integrations.lightning in one process: the Trainer's placement, the data position a
checkpoint holds while Lightning draws ahead, and a fit resumed from Stalwart's checkpoint that
continues exactly where an uninterrupted fit goes (losses, samples, Lightning's step counter).

Lightning is imported by the module-scoped `sl` fixture and inside the helpers, not at the top: every
xdist worker collects every unit test, and only the worker that runs these (one group with the other
in-process framework tests) pays for importing it."""

from __future__ import annotations

import functools
import importlib
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import pytest
import torch
import torch.nn.functional as F

from stalwart import worker_contract as contract
from stalwart.agents import worker_sdk
from stalwart.agents.progress_inbox import ProgressInbox
from stalwart.dataloader import DataConfig, SourceSpec, build_shards

if TYPE_CHECKING:
    from stalwart.integrations.lightning import StalwartCallback

pytestmark = pytest.mark.xdist_group("in-process-frameworks")

TORCHRUN_4x2 = {
    "RANK": "3",
    "LOCAL_RANK": "1",
    "WORLD_SIZE": "8",
    "LOCAL_WORLD_SIZE": "2",
    "MASTER_ADDR": "127.0.0.1",
    "MASTER_PORT": "29500",
    "TORCHELASTIC_RUN_ID": "job",
}


@pytest.fixture(scope="module")
def sl() -> ModuleType:
    return importlib.import_module("stalwart.integrations.lightning")


def test_a_torchrun_launch_is_ddp_over_its_nodes_and_processes(sl: ModuleType) -> None:
    kw = sl.trainer_kwargs(TORCHRUN_4x2)
    assert kw["strategy"] == "ddp" and kw["devices"] == 2 and kw["num_nodes"] == 4


def test_lightning_detects_the_torchelastic_environment_and_spawns_nothing(
    sl: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What Stalwart's agent sets is what torchrun sets: Lightning must not start processes itself."""
    import lightning as L
    from lightning.pytorch.plugins.environments import TorchElasticEnvironment

    for name, value in {**TORCHRUN_4x2, "GROUP_RANK": "1"}.items():
        monkeypatch.setenv(name, value)
    trainer = L.Trainer(**{**sl.trainer_kwargs(), "accelerator": "cpu"}, logger=False)
    assert isinstance(trainer.strategy.cluster_environment, TorchElasticEnvironment)
    # Lightning's launcher starts child scripts only for an environment that does not create its processes.
    assert trainer.strategy.cluster_environment.creates_processes_externally
    assert (trainer.global_rank, trainer.local_rank, trainer.node_rank, trainer.world_size) == (3, 1, 1, 8)


def test_a_process_nobody_launched_trains_alone(sl: ModuleType) -> None:
    kw = sl.trainer_kwargs({})
    assert kw == {"accelerator": kw["accelerator"], "devices": 1, "num_nodes": 1}


def test_uneven_nodes_are_refused_naming_the_variables(sl: ModuleType) -> None:
    with pytest.raises(ValueError, match="WORLD_SIZE=8 is not a multiple of LOCAL_WORLD_SIZE=3"):
        sl.trainer_kwargs({**TORCHRUN_4x2, "LOCAL_WORLD_SIZE": "3"})


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> DataConfig:
    folder = tmp_path_factory.mktemp("shards")
    text = folder / "text.txt"
    text.write_text("\n".join(f"line {i}: the quick brown fox jumps over the lazy dog" for i in range(400)))
    build_shards([text], folder, prefix="text", overwrite=True)
    return DataConfig(sources=[SourceSpec(name="text", shards=[str(folder / "text-*.stok")])], seq_len=16, seed=0)


def test_the_checkpointed_position_is_after_the_last_trained_batch_not_the_last_drawn(
    sl: ModuleType, config: DataConfig
) -> None:
    data = sl.StalwartData(config, micro_batch=2)
    data.open(0, 1)
    batches = iter(data)
    first, second, third = next(batches), next(batches), next(batches)  # Lightning draws ahead
    data.mark_trained(first)
    state = data.state_dict()
    assert data.state_delta() == {"position": state["position"], "fingerprint": state["fingerprint"]}
    data.close()

    resumed = sl.StalwartData(config, micro_batch=2)
    resumed.load_state_dict(state)
    assert torch.equal(next(iter(resumed))["sample_ids"], second["sample_ids"])
    resumed.close()
    assert not torch.equal(second["sample_ids"], third["sample_ids"])


@functools.cache
def modules() -> tuple[type, type]:
    """Bigram (small enough to fit in a second; a scheduler so the resumed LR is checked too) and
    NaNAtStep3, defined on first use because they subclass Lightning's module."""
    import lightning as L

    class Bigram(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.emb = torch.nn.Embedding(257, 257)
            self.log_: dict[int, tuple[float, list[int]]] = {}

        def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
            tokens = batch["tokens"]
            logits = self.emb(tokens[:, :-1])
            return F.cross_entropy(logits.reshape(-1, 257), tokens[:, 1:].reshape(-1))

        def on_train_batch_end(self, outputs: Any, batch: dict[str, Any], batch_idx: int) -> None:
            self.log_[self.trainer.global_step] = (float(outputs["loss"]), batch["sample_ids"].tolist())

        def configure_optimizers(self) -> Any:
            optim = torch.optim.AdamW(self.parameters(), lr=0.05)
            sched = torch.optim.lr_scheduler.StepLR(optim, step_size=2, gamma=0.5)
            return {"optimizer": optim, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    class NaNAtStep3(Bigram):
        def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
            loss = super().training_step(batch, batch_idx)
            return loss * float("nan") if self.trainer.global_step == 2 else loss

    return Bigram, NaNAtStep3


def fit(
    sl: ModuleType, config: DataConfig, checkpoints: Path, steps: int, interval: int = 3
) -> tuple[Any, StalwartCallback]:
    import lightning as L

    torch.manual_seed(0)
    bigram, _ = modules()
    module = bigram()
    data = sl.StalwartData(config, micro_batch=2)
    callback = sl.StalwartCallback(data, checkpoint_uri=str(checkpoints), interval=interval)
    trainer = L.Trainer(
        max_steps=steps,
        callbacks=[callback],
        accelerator="cpu",
        devices=1,
        use_distributed_sampler=False,
        enable_checkpointing=False,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module, train_dataloaders=data.dataloader())
    assert trainer.global_step == steps
    return module, callback


def test_a_resumed_fit_continues_exactly_as_an_uninterrupted_one(
    sl: ModuleType, config: DataConfig, tmp_path: Path
) -> None:
    clean, _ = fit(sl, config, tmp_path / "clean", steps=7)
    first, _ = fit(sl, config, tmp_path / "resumed", steps=5)  # checkpoints at 3 and 5 (the last step)
    second, callback = fit(sl, config, tmp_path / "resumed", steps=7)
    assert callback.resumed_from == 5
    assert sorted(second.log_) == [6, 7]  # Lightning's step counter resumed too
    for step in (6, 7):
        assert second.log_[step][1] == clean.log_[step][1], step  # the same samples
        assert second.log_[step][0] == pytest.approx(clean.log_[step][0], abs=1e-6), step  # the same model
    assert {s: first.log_[s] for s in range(1, 6)} == {s: clean.log_[s] for s in range(1, 6)}


def test_a_rollback_resumes_from_the_newest_checkpoint_it_allows(
    sl: ModuleType, config: DataConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clean, _ = fit(sl, config, tmp_path / "clean", steps=7)
    fit(sl, config, tmp_path / "resumed", steps=5)  # checkpoints at 3 and 5
    monkeypatch.setenv("STALWART_RESUME_MAX_STEP", "4")  # the controller rolls back past step 5
    second, callback = fit(sl, config, tmp_path / "resumed", steps=7)
    assert callback.resumed_from == 3 and sorted(second.log_) == [4, 5, 6, 7]
    assert [second.log_[s][1] for s in (4, 5, 6, 7)] == [clean.log_[s][1] for s in (4, 5, 6, 7)]


def test_a_nan_loss_raises_the_sdks_floating_point_error(sl: ModuleType, config: DataConfig, tmp_path: Path) -> None:
    import lightning as L

    _, nan_at_step_3 = modules()
    data = sl.StalwartData(config, micro_batch=2)
    trainer = L.Trainer(
        max_steps=5,
        callbacks=[sl.StalwartCallback(data, checkpoint_uri=str(tmp_path))],
        accelerator="cpu",
        devices=1,
        use_distributed_sampler=False,
        enable_checkpointing=False,
        logger=False,
        enable_progress_bar=False,
    )
    with pytest.raises(FloatingPointError, match="loss is nan at step 3"):
        trainer.fit(nan_at_step_3(), train_dataloaders=data.dataloader())


@pytest.fixture
def inbox(monkeypatch: pytest.MonkeyPatch) -> Iterator[ProgressInbox]:
    """The node agent's end of the worker SDK's socket."""
    box = ProgressInbox()
    monkeypatch.setenv(contract.PROGRESS_SOCKET, box.path)
    monkeypatch.setattr(worker_sdk, "_sock", None)
    monkeypatch.setattr(worker_sdk, "_unsent", [])
    monkeypatch.setattr(worker_sdk, "_last_report_at", None)
    try:
        yield box
    finally:
        if worker_sdk._sock is not None:
            worker_sdk._sock.close()
        box.close()


def test_the_agent_hears_every_step_with_its_phases_and_every_save_with_the_data_position(
    sl: ModuleType, config: DataConfig, tmp_path: Path, inbox: ProgressInbox
) -> None:
    _, callback = fit(sl, config, tmp_path / "ckpt", steps=4, interval=2)
    assert callback.clock.steps == 4 and callback.clock.cpu > 0 and callback.clock.wall > 0  # its own time
    # The step hooks it leaves alone are None, and Lightning's dispatcher skips them (the fit ran).
    assert callback.on_before_backward is None and callback.on_after_backward is None
    reports = inbox.drain()
    steps = [r for r in reports if r.kind == "step"]
    assert [r.step for r in steps] == [1, 2, 3, 4]
    for r in steps:
        assert r.loss is not None and r.tokens == 2 * config.seq_len, r
        assert r.phases is not None and None not in (r.phases.data, r.phases.compute, r.phases.optimizer), r
    saves = [r for r in reports if r.kind == "checkpoint" and r.checkpoint and r.checkpoint.operation == "save"]
    assert [r.step for r in saves] == [2, 4] and all(r.checkpoint and r.checkpoint.committed for r in saves)
    assert all(r.data_state for r in saves), saves
    # The position a save carries is the loader's own at that step (the trained batch's end).
    positions = [r.data_state["position"] for r in saves if r.data_state]
    assert positions == [2 * step for step in (2, 4)], positions  # micro-batch 2, one rank

    fit(sl, config, tmp_path / "ckpt", steps=6, interval=2)  # a restart: the load is reported
    loads = [r for r in inbox.drain() if r.kind == "checkpoint" and r.checkpoint and r.checkpoint.operation == "load"]
    assert [r.step for r in loads] == [4], loads
