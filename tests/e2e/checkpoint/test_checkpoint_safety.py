"""No partial checkpoint is ever used: kills mid-save, full disks, flipped bytes, lost nodes; and S3."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.paths import REPO
from support.ranks import RankWorld, run_ranks
from support.s3 import moto_s3

from stalwart.checkpoint import Checkpointer
from stalwart.checkpoint.manifest import MANIFEST_NAME, step_dir
from stalwart.net import free_port
from stalwart.processes import spawn, stop_process, wait_for

WORKER = REPO / "tests" / "data" / "checkpoint" / "ckpt_worker.py"


def all_equal(results: list[dict]) -> bool:  # type: ignore[type-arg]
    return all(all(r["equal"].values()) for r in results)


def test_a_save_killed_midway_leaves_no_checkpoint_and_the_previous_one_loads(tmp_path: Path) -> None:
    ranks = RankWorld(WORKER, ["slow_save", str(tmp_path)], 2, tmp_path)
    try:
        assert wait_for(lambda: len(list((tmp_path / "results").glob("saving-*"))) == 2, 300), "save never started"
        for p in ranks.ranks:
            os.kill(p.pid, signal.SIGKILL)
    finally:
        ranks.stop()
    assert (tmp_path / "ckpt" / step_dir(20)).exists()  # it had started writing...
    assert not (tmp_path / "ckpt" / step_dir(20) / MANIFEST_NAME).exists()  # ...but never committed
    loaded = run_ranks(WORKER, ["reshard_load", str(tmp_path), "layout=rep"], 2, tmp_path)
    assert all(r["step"] == 10 for r in loaded) and all_equal(loaded)


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    out = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if out.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {out.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_disk_full_fails_the_save_clearly_and_training_goes_on(tmp_path: Path, tiny_disk: Path) -> None:
    results = run_ranks(WORKER, ["disk_full", str(tmp_path), f"uri={tiny_disk}", "ballast=2000000"], 2, tmp_path)
    for r in results:
        assert r["first"]["committed"]
        assert not r["second"]["committed"]
        assert "No space left on device" in r["second"]["error"]
        assert str(tiny_disk) in r["second"]["error"]  # it names where
        assert r["steps_after"] == 3  # training carried on
        assert r["catalog"] == [1]  # the failed save left nothing behind
    assert not (tiny_disk / step_dir(2)).exists()


# -- S3 on a real S3 protocol server --------------------------------------------------------------
@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    with moto_s3(monkeypatch) as endpoint:
        yield endpoint


def test_s3_reshard_reads_only_the_bytes_it_needs(tmp_path: Path, s3: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CKPT_BIG", "1")
    uri = f"uri=s3://ckpt/runs/a?endpoint={s3}"
    saved = run_ranks(WORKER, ["reshard_save", str(tmp_path), "layout=tp2xdp2", uri], 4, tmp_path)
    assert all(r["committed"] for r in saved)
    total = saved[0]["total_bytes"]
    assert total > 8 << 20  # several multipart parts

    # Each of 4 FSDP-style ranks needs a quarter of every tensor.
    loaded = run_ranks(WORKER, ["reshard_load", str(tmp_path), "layout=dp4", uri], 4, tmp_path)
    assert all_equal(loaded)
    reads = [r["bytes_read"] for r in loaded]
    for r in reads:
        assert r < 0.25 * total * 1.3 + (3 << 20), (reads, total)  # a quarter, plus block rounding
    assert sum(reads) < 1.3 * total  # not whole files on every rank

    # One rank loading everything reads about everything, once.
    [single] = run_ranks(WORKER, ["reshard_load", str(tmp_path), "layout=single", uri], 1, tmp_path)
    assert all(single["equal"].values())
    assert total * 0.95 < single["bytes_read"] < total * 1.05


def test_s3_dying_mid_save_fails_the_save_cleanly_and_commits_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """The S3 server goes away while a save's parts are uploading: the save fails with an error
    naming the bucket, training is never held, and when S3 is back the step has no manifest while
    the previous checkpoint loads. (moto keeps its buckets across a restart in one process.)"""
    import threading

    import boto3
    import torch
    from moto.server import ThreadedMotoServer

    from stalwart.checkpoint.storage.s3 import S3Storage

    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(key, "testing")
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    try:
        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket="dying")
        storage = S3Storage("dying", "run", endpoint_url=endpoint, part_size=5 << 20, max_workers=2)
        ckpt = Checkpointer(storage)
        small = {"x": torch.arange(100.0)}
        assert ckpt.save(small, 1).wait().committed
        # Parts after the first wait until S3 is gone: a quick machine would otherwise finish the
        # upload before the test stops the server.
        s3_gone = threading.Event()
        call = storage._call

        def held_call(op: str, key: str, **kwargs: object) -> dict:
            if op == "upload_part" and kwargs["PartNumber"] != 1:
                s3_gone.wait(120)
            return call(op, key, **kwargs)

        monkeypatch.setattr(storage, "_call", held_call)
        big = {"x": torch.arange(100.0) + 1, "ballast": torch.randn(6 << 20)}  # 24 MiB: five parts
        handle = ckpt.save(big, 2)
        assert wait_for(lambda: storage.bytes_written >= 5 << 20, 60)
        server.stop()  # S3 dies with parts in flight
        s3_gone.set()
        result = handle.wait(timeout=120)
        assert not result.committed and "upload_part" in (result.error or ""), result.error
        assert "s3://dying/run/step-0000000002/__0_0.distcp" in (result.error or "")  # it names where
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
        server.start()
        assert [c.step for c in ckpt.catalog()] == [1]
        target = {"x": torch.zeros(100)}
        assert ckpt.load(target) == 1 and torch.equal(target["x"], torch.arange(100.0))
        assert threading.active_count() < 50  # no runaway upload threads
    finally:
        server.stop()


# -- host memory with a peer copy -----------------------------------------------------------------
TOKEN = "e2e-test-token"


def start_memory_store() -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    proc = spawn(
        [sys.executable, "-m", "stalwart.checkpoint.memory_server", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        env={**os.environ, "STALWART_CHECKPOINT_TOKEN": TOKEN},
    )
    addr = f"127.0.0.1:{port}"
    import http.client

    def up() -> bool:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
            conn.request("GET", "/healthz")
            return conn.getresponse().status == 200
        except OSError:
            return False

    assert wait_for(up, 30)
    return proc, addr


def test_the_memory_tier_survives_the_loss_of_one_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STALWART_CHECKPOINT_TOKEN", TOKEN)  # the ranks' environment, as the agent sets it
    node_a, addr_a = start_memory_store()
    node_b, addr_b = start_memory_store()
    try:
        opts = ["uri=mem://{node}/job1?peer={peer}", f"nodes={addr_a}|{addr_b}", f"peers={addr_b}|{addr_a}"]
        saved = run_ranks(WORKER, ["reshard_save", str(tmp_path), "layout=dp2", *opts], 2, tmp_path)
        assert all(r["committed"] for r in saved)
        stop_process(node_a, grace=0)  # node A is lost, and its memory with it
        loaded = run_ranks(WORKER, ["reshard_load", str(tmp_path), "layout=dp2", *opts], 2, tmp_path)
        assert all_equal(loaded) and all(r["step"] == 10 for r in loaded)
    finally:
        stop_process(node_a, grace=1)
        stop_process(node_b, grace=1)
