"""The shadow loader: a real loader process filling real shared memory, supervised and restarted,
serving exactly the batches the in-process loader computes, whatever fails around it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import psutil
import pytest
from support.dataloader import build_corpus, sup_path

from stalwart.dataloader import (
    DataConfig,
    DataError,
    ShadowLoaderClient,
    ShadowLoaderSupervisor,
    ShadowLoaderUnavailable,
    ShardError,
    TokenDataset,
    global_ids,
    remove_stale_segments,
)
from stalwart.dataloader.doorbell import bell_path
from stalwart.dataloader.shard_format import HEADER_SIZE
from stalwart.dataloader.shm_layout import A, S, Segment, segment_name, shm_dir
from stalwart.dataloader.state import state_at
from stalwart.processes import wait_for


def client(
    sup: ShadowLoaderSupervisor, rank: int, dp_size: int = 2, micro: int = 4, **kw: object
) -> ShadowLoaderClient:
    """A trainer's client that waits for the loader rather than falling back after a few seconds
    (the tests count what the loader served; a starved loader is slow, not absent)."""
    kw.setdefault("local_fallback", False)
    return ShadowLoaderClient(
        sup.name, lane=rank, dp_rank=rank, dp_size=dp_size, micro_batch=micro, config=sup.config, **kw
    )  # type: ignore[arg-type]


def consume(clients: list[ShadowLoaderClient], steps: int) -> list[int]:
    ids: list[int] = []
    for _ in range(steps):
        for c in clients:
            ids += c.next_batch().sample_ids.tolist()
    return ids


def lane_armed_at(sup: ShadowLoaderSupervisor, lane: int, position: int) -> bool:
    """The lane holds an unowned (prefilled) generation at `position` with its ring full."""
    c = sup.segment.lanes[lane].ctrl  # type: ignore[union-attr]
    slots = sup.segment.lanes[lane].slots  # type: ignore[union-attr]
    ready = sum(1 for s in slots if int(s.header[S.GEN]) == int(c[A.GEN]) and int(s.header[S.STATUS]) == S.READY)
    return int(c[A.OWNER_PID]) == 0 and int(c[A.POSITION]) == position and ready == sup.slots


def test_the_shadow_loader_serves_exactly_the_global_order(supervisor: ShadowLoaderSupervisor) -> None:
    clients = [client(supervisor, r) for r in range(2)]
    try:
        ids = consume(clients, 40)  # 320 samples: past the ring size many times
        assert ids == global_ids(supervisor.config, 0, 320).tolist()
        assert all(c.stats.shadow == 40 and c.stats.local == 0 for c in clients)
        tokens = clients[0].next_batch().tokens
        assert tokens.shape == (4, supervisor.config.seq_len + 1) and int(tokens.max()) <= 256
    finally:
        for c in clients:
            c.close()


def test_a_released_lane_is_prefilled_from_the_last_state_and_adopted(supervisor: ShadowLoaderSupervisor) -> None:
    first = [client(supervisor, r) for r in range(2)]
    consume(first, 5)
    state = first[0].state_dict()  # what a checkpoint would save: position 40
    first[1].state_dict()
    consume(first, 3)  # steps after the checkpoint, lost with the trainer
    for c in first:
        c.close()
    assert wait_for(lambda: all(lane_armed_at(supervisor, r, 40) for r in range(2)), 120)
    again = [client(supervisor, r) for r in range(2)]
    try:
        for c in again:
            c.load_state_dict(state)
        assert consume(again, 10) == global_ids(supervisor.config, 40, 80).tolist()
        assert all(c.stats.adopted == 1 and c.stats.local == 0 for c in again)
    finally:
        for c in again:
            c.close()


def test_a_warm_standby_is_prewarmed_from_a_saved_state(supervisor: ShadowLoaderSupervisor) -> None:
    dataset = TokenDataset(supervisor.config)
    state = state_at(dataset, 400).model_dump()  # as saved in the failed node's last checkpoint
    dataset.close()
    supervisor.prewarm(state, dp_size=4, micro_batch=2, dp_ranks=[2, 3])  # this node holds ranks 2 and 3
    assert wait_for(lambda: all(lane_armed_at(supervisor, lane, 400) for lane in range(2)), 120)
    # No local fallback: what is tested is the adoption of the prefill, however long a starved loader
    # takes to write it (a client that falls back after 5 s computes the batch itself instead).
    standby = [
        ShadowLoaderClient(supervisor.name, lane=i, dp_rank=2 + i, dp_size=4, micro_batch=2, local_fallback=False)
        for i in range(2)
    ]
    try:
        for c in standby:
            c.load_state_dict(state)
        got = [c.next_batch().sample_ids.tolist() for c in standby]
        expected = global_ids(supervisor.config, 400, 8).tolist()
        assert got == [expected[4:6], expected[6:8]]
        assert all(c.stats.adopted == 1 for c in standby)
        with pytest.raises(DataError, match="in use by a live trainer"):
            supervisor.prewarm(state, dp_size=4, micro_batch=2, dp_ranks=[2])
    finally:
        for c in standby:
            c.close()


def test_without_its_doorbell_the_loader_polls_and_serves_the_same_batches(
    data_config: DataConfig, tmp_path: Path
) -> None:
    """A file where the loader's named pipe goes: it says so in its log and serves by polling."""
    job = f"test-{uuid.uuid4().hex[:8]}"
    bell = bell_path(shm_dir() / segment_name(job, "n"))
    bell.write_text("in the way")
    log = tmp_path / "loader.log"
    sup = ShadowLoaderSupervisor(data_config, job=job, node="n", lanes=1, max_micro_batch=4, log_path=log).start()
    trainer = client(sup, 0, dp_size=1)
    try:
        assert consume([trainer], 12) == global_ids(data_config, 0, 48).tolist()
        assert trainer.stats.shadow == 12
        assert "no doorbell: polling instead" in log.read_text()
    finally:
        trainer.close()
        sup.close()
    assert not bell.exists()  # removed with its segment, whatever it was


def test_without_a_loader_the_client_computes_the_same_batches_itself(data_config: DataConfig) -> None:
    sup = ShadowLoaderSupervisor(
        data_config, job=f"test-{uuid.uuid4().hex[:8]}", node="n", lanes=1, max_micro_batch=4, slots=4
    ).start(watch=False)
    try:
        os.kill(sup.loader_pid, signal.SIGKILL)  # type: ignore[arg-type]
        assert wait_for(lambda: sup.loader_pid is None, 60)
        strict = client(sup, 0, dp_size=1, local_fallback=False, wait_timeout=0.3)
        with pytest.raises(ShadowLoaderUnavailable, match="delivered nothing"):
            strict.next_batch()
        strict.close()
        lenient = client(sup, 0, dp_size=1, local_fallback=True, fallback_after=0.2)
        ids = consume([lenient], 5)
        assert lenient.stats.local == 5 and lenient.stats.shadow == 0
        assert sup.check() and sup.restarts == 1  # the supervisor brings the loader back ...
        served: list[str] = []

        def take() -> bool:
            batch = lenient.next_batch()
            ids.extend(batch.sample_ids.tolist())
            served.append(batch.served_by)
            return batch.served_by == "shadow"

        assert wait_for(take, 30, interval=0.02)  # ... and the client goes back to it
        assert ids == global_ids(data_config, 0, len(ids)).tolist()
        lenient.close()
    finally:
        sup.close()


def test_bad_data_found_by_the_loader_process_reaches_the_trainer_with_the_file_name(tmp_path: Path) -> None:
    config = build_corpus(tmp_path)
    victim = config.sources[2].resolve()[0]  # numbers, the first shard
    raw = bytearray(victim.read_bytes())
    raw[HEADER_SIZE + 2 * 1024 * 2 + 5] ^= 0x40  # block 2 of that shard
    victim.write_bytes(bytes(raw))
    with ShadowLoaderSupervisor(
        config, job=f"test-{uuid.uuid4().hex[:8]}", node="n", lanes=1, max_micro_batch=8
    ) as sup:
        c = client(sup, 0, dp_size=1, micro=8, local_fallback=False, wait_timeout=30)
        with pytest.raises(DataError, match=rf"{victim}: corrupted tokens in block 2"):
            for _ in range(300):  # bounded: reaches every sample of that shard
                c.next_batch()
        c.close()
    victim.write_bytes(raw[:-50])
    with pytest.raises(ShardError, match=f"{victim}: truncated"):
        ShadowLoaderSupervisor(config, job="x", node="n", lanes=1, max_micro_batch=8).start()


def test_segment_names_are_unique_per_job_and_node_and_stale_ones_are_reclaimed(
    data_config: DataConfig,
) -> None:
    job = f"test-{uuid.uuid4().hex[:8]}"
    a = ShadowLoaderSupervisor(data_config, job=job, node="n0", lanes=1, max_micro_batch=2).start(watch=False)
    b = ShadowLoaderSupervisor(data_config, job=job, node="n1", lanes=1, max_micro_batch=2).start(watch=False)
    try:
        assert a.name != b.name and sup_path(a).exists() and sup_path(b).exists()
        with pytest.raises(DataError, match="in use by a live supervisor"):
            ShadowLoaderSupervisor(data_config, job=job, node="n0", lanes=1, max_micro_batch=2).start()
    finally:
        a.close()
        b.close()
    # A supervisor that is SIGKILLed takes its loader with it and leaves its segment behind.
    code = (
        "import sys\nfrom stalwart.dataloader import DataConfig, ShadowLoaderSupervisor\n"
        f"s = ShadowLoaderSupervisor(DataConfig.loads(sys.argv[1]), job={job!r}, node='n2', lanes=1,"
        " max_micro_batch=2).start()\n"
        "print(s.loader_pid, s.name, flush=True)\nimport time\nfor _ in range(600): time.sleep(0.1)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, data_config.dumps()], stdout=subprocess.PIPE, text=True)
    try:
        loader_pid, name = proc.stdout.readline().split()  # type: ignore[union-attr]
    finally:
        proc.kill()
        proc.wait()
    assert wait_for(
        lambda: (
            not psutil.pid_exists(int(loader_pid)) or psutil.Process(int(loader_pid)).status() == psutil.STATUS_ZOMBIE
        ),
        10,
    )
    assert (shm_dir() / name).exists()
    assert name in remove_stale_segments()
    assert not (shm_dir() / name).exists()
    assert not bell_path(shm_dir() / name).exists()  # its loader's doorbell went with it


def test_a_segment_is_refused_when_it_is_not_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STALWART_SHM_DIR", str(tmp_path))
    (tmp_path / "stalwart-dl.junk").write_bytes(b"\0" * 4096)
    with pytest.raises(DataError, match="not a Stalwart shadow-loader segment"):
        Segment.attach("stalwart-dl.junk")
    with pytest.raises(DataError, match="no shadow-loader segment"):
        Segment.attach("stalwart-dl.absent")


def test_a_segment_folder_of_its_own_is_made_when_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """STALWART_SHM_DIR names a folder that is not there yet (a fresh /dev/shm after a reboot): made, like a
    workdir, rather than failing every agent's start."""
    folder = tmp_path / "shm" / "job-a"
    monkeypatch.setenv("STALWART_SHM_DIR", str(folder))
    segment = Segment.create("stalwart-dl.fresh", config_json="{}", lanes=1, slots=2, max_micro=1, sample_tokens=4)
    try:
        assert (folder / "stalwart-dl.fresh").is_file()
    finally:
        segment.close()
