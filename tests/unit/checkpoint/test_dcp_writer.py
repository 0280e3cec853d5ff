"""Plain DCP code (dcp.save, dcp.async_save, dcp.load) on Stalwart's tiers through DCPWriter/DCPReader."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from support.cli_invoke import Cli
from support.s3 import moto_s3
from torch.distributed.checkpoint.api import CheckpointException

from stalwart.checkpoint import Checkpointer, ChecksumError, DCPReader, DCPWriter, open_storage
from stalwart.checkpoint.manifest import MANIFEST_NAME, read_manifest, step_dir
from stalwart.net import free_port

TOKEN = "dcp-test-token"


def _state(seed: int) -> dict[str, object]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4))
    optim = torch.optim.AdamW(model.parameters())
    model(torch.ones(2, 8)).sum().backward()
    optim.step()
    return {"model": model.state_dict(), "optim": optim.state_dict(), "loader": {"position": 5, "seed": seed}}


def _fresh() -> dict[str, object]:
    return _state(99)


def _same(a: object, b: object) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))  # type: ignore[arg-type,call-overload]
    return a == b


@pytest.mark.parametrize("mode", ["save", "async"])
def test_dcp_save_writes_a_stalwart_checkpoint_that_dcp_and_the_engine_load(tmp_path: Path, mode: str) -> None:
    want = _state(1)
    writer = DCPWriter(str(tmp_path), 10)
    if mode == "async":
        dcp.async_save(want, storage_writer=writer, no_dist=True).result()  # type: ignore[union-attr]
    else:
        dcp.save(want, storage_writer=writer, no_dist=True)
    folder = tmp_path / step_dir(10)
    assert (folder / MANIFEST_NAME).exists()
    assert not (folder / ".metadata").exists()  # no pickle

    got = _fresh()
    dcp.load(got, storage_reader=DCPReader(str(tmp_path), 10), no_dist=True)
    assert _same(got, want)

    # The engine sees a checkpoint of its own: listed, newest, loadable.
    ckpt = Checkpointer(open_storage(str(tmp_path)))
    assert [c.step for c in ckpt.catalog()] == [10]
    assert ckpt.catalog()[0].world_size == 1
    result = writer.outcome(stall_seconds=0.0)
    assert result.committed and result.total_bytes == ckpt.catalog()[0].total_bytes > 0


def test_the_step_can_come_from_dcps_checkpoint_id(tmp_path: Path) -> None:
    dcp.save(_state(1), storage_writer=DCPWriter(str(tmp_path)), checkpoint_id="12", no_dist=True)
    assert [c.step for c in Checkpointer.list_committed(open_storage(str(tmp_path)))] == [12]


def test_stalwart_checkpoint_ls_lists_a_dcp_save(tmp_path: Path, cli: Cli) -> None:
    dcp.save(_state(1), storage_writer=DCPWriter(str(tmp_path), 3), no_dist=True)
    out = cli("checkpoint", "ls", str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert "3" in out.stdout.split()


def test_a_corrupted_shard_is_refused_on_load(tmp_path: Path) -> None:
    dcp.save(_state(1), storage_writer=DCPWriter(str(tmp_path), 4), no_dist=True)
    folder = tmp_path / step_dir(4)
    manifest = read_manifest((folder / MANIFEST_NAME).read_bytes(), "test")
    entry = manifest.tensors["model.0.weight"].shards[0]
    shard = folder / entry.file
    data = bytearray(shard.read_bytes())
    data[entry.data_offset + 3] ^= 0xFF  # one bit pattern inside the weights' raw bytes
    shard.write_bytes(bytes(data))
    with pytest.raises(CheckpointException) as info:  # DCP wraps the reader's error in its own
        dcp.load(_fresh(), storage_reader=DCPReader(str(tmp_path), 4), no_dist=True)
    assert isinstance(_cause(info.value), ChecksumError)


def _cause(exc: BaseException) -> BaseException:
    """The error a rank raised, out of DCP's CheckpointException (which keeps it per rank)."""
    assert isinstance(exc, CheckpointException)
    return next(iter(exc.failures.values()))[0]


def test_a_save_that_fails_leaves_no_commit(tmp_path: Path) -> None:
    class Broken(DCPWriter):
        def finish(self, metadata, results) -> None:  # type: ignore[no-untyped-def]
            raise OSError("disk gone")

    with pytest.raises(CheckpointException) as info:
        dcp.save(_state(1), storage_writer=Broken(str(tmp_path), 5), no_dist=True)
    assert str(_cause(info.value)) == "disk gone"
    assert Checkpointer.list_committed(open_storage(str(tmp_path))) == []


def test_several_tiers_at_once_and_retention(tmp_path: Path) -> None:
    from stalwart.checkpoint import RetentionPolicy

    tiers = [str(tmp_path / "a"), str(tmp_path / "b")]
    for step in (1, 2, 3):
        dcp.save(
            _state(step), storage_writer=DCPWriter(tiers, step, retention=RetentionPolicy(keep_last=2)), no_dist=True
        )
    for t in tiers:
        assert sorted(c.step for c in Checkpointer.list_committed(open_storage(t))) == [2, 3]


@pytest.fixture
def memory_stores(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    from stalwart.checkpoint.memory_server import serve

    monkeypatch.setenv("STALWART_CHECKPOINT_TOKEN", TOKEN)  # what the agent gives workers
    servers = [serve("127.0.0.1", free_port(), 64 << 20, TOKEN) for _ in range(2)]
    threads = [threading.Thread(target=s.serve_forever, args=(0.05,), daemon=True) for s in servers]
    for t in threads:
        t.start()
    try:
        yield [f"127.0.0.1:{s.server_address[1]}" for s in servers]
    finally:
        for s in servers:
            s.shutdown()
            s.server_close()
        for t in threads:
            t.join()


def test_the_memory_tier_keeps_a_peer_copy_a_standby_loads_from(memory_stores: list[str]) -> None:
    mine, peer = memory_stores
    want = _state(1)
    dcp.async_save(want, storage_writer=DCPWriter(f"mem://{mine}/job?peer={peer}", 8), no_dist=True).result()  # type: ignore[union-attr]
    # The node is lost; a standby (its own empty store) reads the lost node's copy from its peer.
    lost = f"127.0.0.1:{free_port()}"
    standby = open_storage(f"mem://{peer}/job?peer={lost}&nodes={lost},{peer}")
    got = _fresh()
    dcp.load(got, storage_reader=DCPReader(standby, 8), no_dist=True)
    assert _same(got, want)


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    with moto_s3(monkeypatch) as endpoint:
        yield endpoint


def test_s3(s3: str) -> None:
    uri = f"s3://ckpt/runs/dcp?endpoint={s3}"
    want = _state(1)
    dcp.save(want, storage_writer=DCPWriter(uri, 6), no_dist=True)
    got = _fresh()
    dcp.load(got, storage_reader=DCPReader(uri, 6), no_dist=True)
    assert _same(got, want)
    assert [c.step for c in Checkpointer.list_committed(open_storage(uri))] == [6]
