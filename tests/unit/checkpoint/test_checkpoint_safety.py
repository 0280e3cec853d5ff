"""No partial checkpoint is ever used: kills mid-save, full disks, flipped bytes, lost nodes; and S3."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import torch

from stalwart.checkpoint import Checkpointer, ChecksumError, open_storage
from stalwart.checkpoint.manifest import MANIFEST_NAME, read_manifest, step_dir
from stalwart.net import free_port

TOKEN = "unit-test-token"


@pytest.fixture(autouse=True)
def job_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STALWART_CHECKPOINT_TOKEN", TOKEN)  # what the agent gives workers


def flip_a_byte(root: Path, step: int, fqn: str) -> str:
    manifest = read_manifest((root / step_dir(step) / MANIFEST_NAME).read_bytes(), "test")
    shard = manifest.tensors[fqn].shards[0]
    path = root / step_dir(step) / shard.file
    data = bytearray(path.read_bytes())
    data[shard.data_offset + shard.nbytes // 2] ^= 0x40
    path.write_bytes(data)
    return shard.file


def test_a_flipped_byte_is_caught_named_and_load_can_fall_back(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    ck = Checkpointer(open_storage(str(root)))
    good = {"w": torch.randn(300, 200), "b": torch.randn(77)}
    ck.save({"m": good}, 10).wait()
    newer = {"w": good["w"] + 1, "b": good["b"] + 1}
    ck.save({"m": newer}, 20).wait()
    file = flip_a_byte(root, 20, "m.w")

    target = {"w": torch.zeros(300, 200), "b": torch.zeros(77)}
    with pytest.raises(ChecksumError) as info:
        ck.load({"m": target})
    assert "'m.w'" in str(info.value) and file in str(info.value)

    target = {"w": torch.zeros(300, 200), "b": torch.zeros(77)}
    assert ck.load({"m": target}, fallback=True) == 10
    assert torch.equal(target["w"], good["w"]) and torch.equal(target["b"], good["b"])


def test_an_uncommitted_folder_does_not_exist_for_load_or_latest(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    ck = Checkpointer(open_storage(str(root)))
    ck.save({"x": torch.ones(3)}, 5).wait()
    ck.save({"x": torch.ones(3) * 2}, 6).wait()
    (root / step_dir(6) / MANIFEST_NAME).unlink()
    assert ck.latest() == 5
    target = {"x": torch.zeros(3)}
    assert ck.load(target) == 5 and torch.equal(target["x"], torch.ones(3))


def test_retention_keeps_the_last_n_and_every_kth(tmp_path: Path) -> None:
    from stalwart.checkpoint import RetentionPolicy
    from stalwart.checkpoint.retention import to_delete

    assert to_delete([10, 20, 30, 40, 50, 60], RetentionPolicy(keep_last=2, keep_every=30)) == [10, 20, 40]
    ck = Checkpointer(open_storage(str(tmp_path)), retention=RetentionPolicy(keep_last=2, keep_every=30))
    for step in (10, 20, 30, 40, 50, 60):
        ck.save({"x": torch.full((4,), float(step))}, step).wait()
    assert [c.step for c in ck.catalog()] == [30, 50, 60]


def test_memory_peers_share_no_parallel_group() -> None:
    from stalwart.checkpoint.peers import choose_peers

    # 4 nodes x 2 ranks; TP=2 inside a node; DP groups pair node 0 with 1 and node 2 with 3.
    rank_to_node = {r: f"n{r // 2}" for r in range(8)}
    tp = [[0, 1], [2, 3], [4, 5], [6, 7]]
    dp = [[0, 2], [1, 3], [4, 6], [5, 7]]
    peers = choose_peers(rank_to_node, tp + dp)
    assert set(peers) == {"n0", "n1", "n2", "n3"}
    for node, peer in peers.items():
        assert peer != node
        assert {node, peer} not in ({"n0", "n1"}, {"n2", "n3"})  # never inside its DP pair
    assert sorted(peers.values()) == ["n0", "n1", "n2", "n3"]  # each node holds one copy
    # With one DP group spanning every node there is no outside: the next node still holds a copy.
    assert choose_peers({0: "a", 1: "b"}, [[0, 1]]) == {"a": "b", "b": "a"}
    assert choose_peers({0: "a", 1: "a"}, [[0, 1]]) == {}


def test_a_memory_store_takes_a_burst_of_connections() -> None:
    """After a node loss every restarted rank connects to the same store at once. A listen backlog
    of 5 (socketserver's default) drops the SYNs past it; the kernel resends them a second later,
    and that second was most of a hot-swap's checkpoint load. Nothing accepts here, so each
    connection must fit in the backlog."""
    from stalwart.checkpoint.memory_server import serve

    server = serve("127.0.0.1", free_port(), 1 << 20, TOKEN)
    clients = []
    try:
        for _ in range(64):
            sock = socket.create_connection(server.server_address, timeout=3)
            clients.append(sock)
    finally:
        for sock in clients:
            sock.close()
        server.server_close()
    assert len(clients) == 64


def test_a_memory_tier_load_merges_reads_and_skips_a_lost_store(tmp_path: Path) -> None:
    """A standby loading a lost node's shards from its peer: a few requests per file, not one per
    tensor, and the lost store is tried once, not once per read."""
    import threading

    from stalwart.checkpoint import TrainState
    from stalwart.checkpoint.memory_server import serve
    from stalwart.checkpoint.storage.memory import MemoryStorage

    servers = [serve("127.0.0.1", free_port(), 64 << 20, TOKEN) for _ in range(2)]
    threads = [threading.Thread(target=s.serve_forever, args=(0.05,), daemon=True) for s in servers]
    for t in threads:
        t.start()
    peer, standby = (f"127.0.0.1:{s.server_address[1]}" for s in servers)
    lost = f"127.0.0.1:{free_port()}"  # nothing listens: the lost node's store
    try:
        torch.manual_seed(0)
        model = torch.nn.Sequential(*[torch.nn.Linear(16, 16) for _ in range(20)])
        optim = torch.optim.AdamW(model.parameters())
        model(torch.ones(2, 16)).sum().backward()
        optim.step()
        Checkpointer(open_storage(f"mem://{peer}/job")).save({"train": TrainState(model, optim)}, 10, blocking=True)
        want = {k: v.clone() for k, v in model.state_dict().items()}

        fresh = torch.nn.Sequential(*[torch.nn.Linear(16, 16) for _ in range(20)])
        fresh_optim = torch.optim.AdamW(fresh.parameters())
        storage = open_storage(f"mem://{standby}/job?peer={lost}&nodes={lost},{peer}")
        assert isinstance(storage, MemoryStorage)
        calls: list[str] = []
        for ep in storage.readers:
            original = ep.request

            def counted(method: str, path: str, *args: object, _ep: object = ep, _orig=original, **kw: object):  # type: ignore[no-untyped-def]
                calls.append(_ep.address)  # type: ignore[attr-defined]
                return _orig(method, path, *args, **kw)

            ep.request = counted  # type: ignore[method-assign]
        assert Checkpointer(storage).load({"train": TrainState(fresh, fresh_optim)}, 10) == 10
        assert all(torch.equal(fresh.state_dict()[k], v) for k, v in want.items())
        # 40 parameters and 80 optimizer moments, in one file: listing, manifest, metadata and a
        # handful of reads, where one read per tensor took over a hundred.
        assert len(calls) < 40, calls
        assert calls.count(lost) <= 2, calls  # it did not answer: asked last from then on
    finally:
        for s in servers:
            s.shutdown()
            s.server_close()


def test_a_standby_mirrors_the_newest_committed_checkpoint_into_its_own_store() -> None:
    import threading

    from stalwart.checkpoint import TrainState
    from stalwart.checkpoint.memory_mirror import sync_newest
    from stalwart.checkpoint.memory_server import serve

    servers = [serve("127.0.0.1", free_port(), 64 << 20, TOKEN) for _ in range(2)]
    for s in servers:
        threading.Thread(target=s.serve_forever, args=(0.05,), daemon=True).start()
    slot, standby = (f"127.0.0.1:{s.server_address[1]}" for s in servers)
    try:
        model = torch.nn.Linear(64, 64)
        state = {"train": TrainState(model, torch.optim.SGD(model.parameters(), lr=0.1))}
        ckpt = Checkpointer(open_storage(f"mem://{slot}/job"))
        ckpt.save(state, 10, blocking=True)
        first = sync_newest(standby, [slot], "job", budget_bytes=1 << 30)
        assert first.step == 10 and first.copied_bytes > 64 * 64 * 4 and first.skipped is None
        assert sync_newest(standby, [slot], "job", budget_bytes=1 << 30).copied_bytes == 0  # held already

        with torch.no_grad():
            model.weight.add_(1.0)
        ckpt.save(state, 20, blocking=True)
        assert sync_newest(standby, [slot], "job", budget_bytes=1 << 30).step == 20
        mine = Checkpointer(open_storage(f"mem://{standby}/job"))  # the standby's store alone
        assert [c.step for c in mine.catalog()] == [20]  # the older copy is dropped
        fresh = torch.nn.Linear(64, 64)
        assert mine.load({"train": TrainState(fresh, torch.optim.SGD(fresh.parameters(), lr=0.1))}) == 20
        assert torch.equal(fresh.weight, model.weight)

        ckpt.save(state, 30, blocking=True)
        skipped = sync_newest(standby, [slot], "job", budget_bytes=1000)
        assert skipped.step is None and "over the budget" in (skipped.skipped or "")
        assert [c.step for c in mine.catalog()] == [20]  # what it held stays
    finally:
        for s in servers:
            s.shutdown()
            s.server_close()


def test_a_program_that_is_not_a_memory_store_counts_as_a_lost_store() -> None:
    """A node's store address answered by another program (its port taken before the store bound
    it): its answer is not read as the checkpoint list; the other stores' lists stand."""
    import http.server
    import threading

    from stalwart.checkpoint.memory_server import serve
    from stalwart.checkpoint.storage.memory import MemoryStorage

    class Empty(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    store = serve("127.0.0.1", 0, 1 << 20, TOKEN)
    other = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Empty)
    threads = [threading.Thread(target=s.serve_forever, args=(0.05,), daemon=True) for s in (store, other)]
    for t in threads:
        t.start()
    try:
        good, bad = (f"127.0.0.1:{s.server_address[1]}" for s in (store, other))
        MemoryStorage(good, None, "job", token=TOKEN).write_bytes("step-0000000010/x", b"x")
        assert MemoryStorage(bad, good, "job", token=TOKEN).list_dirs() == ["step-0000000010"]
    finally:
        for s in (store, other):
            s.shutdown()
            s.server_close()
