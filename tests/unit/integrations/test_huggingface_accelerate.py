"""StalwartLoop (the accelerate helper) in one process: a crash and a resume end where a clean run ends.

accelerate is imported where it is used, so the workers that only collect this module do not pay for it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from support.paths import REPO

from stalwart import worker_contract as contract
from stalwart.agents.worker_sdk import trained_samples
from stalwart.dataloader import DataConfig, SourceSpec, open_loader
from stalwart.integrations.accelerate import StalwartLoop

pytestmark = pytest.mark.xdist_group("in-process-frameworks")

STEPS = 7


def train(tmp_path: Path, run: str, crash_at: int | None = None) -> torch.nn.Module:
    from accelerate import Accelerator

    torch.manual_seed(0)
    shards = str(REPO / "examples" / "data" / "shards" / "stories-*.stok")
    config = DataConfig(sources=[SourceSpec(name="stories", shards=[shards])], seq_len=8, seed=0)
    loader = open_loader(config, dp_rank=0, dp_size=1, micro_batch=2)
    accelerator = Accelerator(cpu=True)
    model = torch.nn.Sequential(torch.nn.Embedding(257, 16), torch.nn.Linear(16, 257))
    optim = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, optim = accelerator.prepare(model, optim)
    sched = torch.optim.lr_scheduler.LambdaLR(optim, lambda step: 1.0 / (step + 1))
    loop = StalwartLoop(
        model=model,
        optimizer=optim,
        scheduler=sched,
        loader=loader,
        last_step=STEPS,
        checkpoint_dir=str(tmp_path / "ckpt" / run),
        sample_log=str(tmp_path / "samples" / run),
    )
    for step in range(loop.resume() + 1, STEPS + 1):
        if step == crash_at:
            loop.finish()  # the process "dies" here; its in-flight save is let finish, as the test's bound
            loader.close()
            return model
        with loop.phase("data"):
            batch = loader.next_batch()
        with loop.phase("compute"):
            logits = model(batch.tokens[:, :-1])
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 257), batch.tokens[:, 1:].reshape(-1))
            accelerator.backward(loss)
        with loop.phase("optimizer"):
            optim.step()
            sched.step()
            optim.zero_grad()
        loop.step_done(step, loss.item(), batch)
    loop.finish()
    loader.close()
    return model


def test_a_resumed_loop_ends_where_a_clean_one_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, example_shards: None
) -> None:
    monkeypatch.setenv(contract.CHECKPOINT_INTERVAL, "3")
    clean = train(tmp_path, "clean")
    train(tmp_path, "faulty", crash_at=5)
    monkeypatch.setenv(contract.GENERATION, "1")
    resumed = train(tmp_path, "faulty")
    assert trained_samples(tmp_path / "samples" / "faulty") == trained_samples(tmp_path / "samples" / "clean")
    for a, b in zip(clean.state_dict().values(), resumed.state_dict().values(), strict=True):
        assert torch.equal(a, b)


def test_a_nan_loss_raises_the_rollback_error(tmp_path: Path) -> None:
    loader = type("NoLoader", (), {"state_delta": lambda self: None})()
    model = torch.nn.Linear(2, 2)
    loop = StalwartLoop(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), loader=loader, last_step=3)
    with pytest.raises(FloatingPointError, match="loss is inf at step 2"):
        loop.step_done(2, float("inf"))
