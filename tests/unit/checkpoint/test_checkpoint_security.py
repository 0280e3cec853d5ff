"""Nothing executable in a checkpoint, and a memory store that only the job can use (issue 16).

The attack reproduced first: a pickle PUT into a running memory store, where the checkpoint's
DCP metadata used to be read from, then a load. Then the store's door (token, bind address) and
its bounds (Content-Length checked before a byte of the body is read), corrupt commit markers, and
values a checkpoint may not hold.
"""

from __future__ import annotations

import http.client
import io
import os
import pickle
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import torch

from stalwart.checkpoint import (
    Checkpointer,
    ChecksumError,
    UnsafeObjectError,
    open_storage,
)
from stalwart.checkpoint.manifest import MANIFEST_NAME, read_manifest, step_dir
from stalwart.checkpoint.memory_server import Server, serve
from stalwart.checkpoint.writer import checksum
from stalwart.net import free_port
from stalwart.processes import spawn, stop_process, wait_for

TOKEN = "the-job-token"


class RunsCode:
    """Unpickling this creates `path`: proof that a load ran code from storage."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return (open, (str(self.path), "w"))


def request(addr: tuple[str, int], method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    conn = http.client.HTTPConnection(*addr, timeout=10)
    try:
        conn.request(method, path, body=body or None, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def store(monkeypatch: pytest.MonkeyPatch) -> Iterator[Server]:
    monkeypatch.setenv("STALWART_CHECKPOINT_TOKEN", TOKEN)  # the workers' environment, as the agent sets it
    server = serve("127.0.0.1", free_port(), 64 << 20, TOKEN)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def small_model() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    optim = torch.optim.AdamW(model.parameters())
    model(torch.ones(2, 8)).sum().backward()
    optim.step()
    return model, optim


def test_a_pickle_put_into_the_memory_store_runs_nothing_at_load(store: Server, tmp_path: Path) -> None:
    from stalwart.checkpoint import TrainState

    addr = store.server_address
    uri = f"mem://127.0.0.1:{addr[1]}/job"
    model, optim = small_model()
    ckpt = Checkpointer(open_storage(uri))
    assert ckpt.save({"train": TrainState(model, optim), "meta": {"epoch": 2}}, 10, blocking=True).wait().committed
    marker = tmp_path / "pwned"
    payload = pickle.dumps(RunsCode(marker))

    # Where DCP keeps its metadata: a Stalwart checkpoint has none, and never reads one.
    assert request(addr, "PUT", f"/o/job/{step_dir(10)}/.metadata", payload, AUTH)[0] == 200
    fresh = torch.nn.Linear(8, 4)
    fresh_optim = torch.optim.AdamW(fresh.parameters())
    holder = {"train": TrainState(fresh, fresh_optim), "meta": {"epoch": 0}}
    assert ckpt.load(holder) == 10 and holder["meta"] == {"epoch": 2}
    assert torch.equal(fresh.weight, model.weight)
    assert not marker.exists()

    # A stored value swapped for the payload, with the manifest's checksum fixed up to match (an
    # attacker who can write to storage can do that too): refused, and nothing ran.
    raw = request(addr, "GET", f"/o/job/{step_dir(10)}/{MANIFEST_NAME}", headers=AUTH)[1]
    manifest = read_manifest(raw, "test")
    entry = manifest.objects["meta.epoch"]
    evil = io.BytesIO()
    torch.save(RunsCode(marker), evil)  # a torch.save of the payload, appended to the rank's file
    data = evil.getvalue()
    file = f"/o/job/{step_dir(10)}/{entry.file}"
    blob = request(addr, "GET", file, headers=AUTH)[1]
    update = {"offset": len(blob), "length": len(data), "checksum": checksum(data)}
    manifest.objects["meta.epoch"] = entry.model_copy(update=update)
    blob += data
    assert request(addr, "PUT", file, bytes(blob), AUTH)[0] == 200
    assert request(addr, "PUT", f"/o/job/{step_dir(10)}/{MANIFEST_NAME}", manifest.to_bytes(), AUTH)[0] == 200
    with pytest.raises(UnsafeObjectError, match=r"'meta.epoch'.*refused, unrun"):
        ckpt.load({"train": TrainState(fresh, fresh_optim), "meta": {"epoch": 0}})
    assert not marker.exists()


def test_the_store_answers_only_the_job(store: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    addr = store.server_address
    assert request(addr, "GET", "/healthz") == (200, b'{"ok": true}')  # read-only, open
    for method, path in (("PUT", "/o/j/x"), ("GET", "/o/j/x"), ("DELETE", "/dirs/j"), ("GET", "/dirs?prefix=")):
        assert request(addr, method, path, b"data" if method == "PUT" else b"")[0] == 401, (method, path)
        wrong = {"Authorization": "Bearer not-the-token"}
        assert request(addr, method, path, b"data" if method == "PUT" else b"", wrong)[0] == 403, (method, path)
    assert request(addr, "PUT", "/o/j/x", b"data", AUTH)[0] == 200
    assert request(addr, "GET", "/o/j/x", headers=AUTH) == (200, b"data")
    # The clients send it: a memory tier without the token is refused with a clear error.
    monkeypatch.delenv("STALWART_CHECKPOINT_TOKEN")
    with pytest.raises(Exception, match="refused GET with no token.*STALWART_CHECKPOINT_TOKEN"):
        Checkpointer(open_storage(f"mem://127.0.0.1:{addr[1]}/j")).latest()


def test_the_store_binds_only_where_told() -> None:
    for host in ("0.0.0.0", "::"):
        with pytest.raises(ValueError, match="refusing to listen"):
            serve(host, free_port(), 1 << 20, TOKEN)
    with pytest.raises(ValueError, match="needs a token"):
        serve("127.0.0.1", free_port(), 1 << 20, "")


def raw_put(addr: tuple[str, int], head: str, body: bytes = b"") -> int:
    """A PUT written by hand (any Content-Length, or none); the status line's code."""
    with socket.create_connection(addr, timeout=10) as sock:
        sock.sendall(f"PUT /o/j/big HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n{head}\r\n".encode() + body)
        return int(sock.recv(256).split(b" ")[1])


def test_content_length_is_checked_before_the_body_is_read_in_a_real_process(tmp_path: Path) -> None:
    port = free_port()
    proc = spawn(
        [sys.executable, "-m", "stalwart.checkpoint.memory_server", "--port", str(port), "--capacity-gib", "0.5"],
        env={**os.environ, "STALWART_CHECKPOINT_TOKEN": TOKEN},
        stdout=subprocess.DEVNULL,
    )
    addr = ("127.0.0.1", port)

    def up() -> bool:
        try:
            return request(addr, "GET", "/healthz")[0] == 200
        except OSError:
            return False

    try:
        assert wait_for(up, 30)
        server = psutil.Process(proc.pid)
        before = server.memory_info().rss
        assert raw_put(addr, "Content-Length: -1\r\n", b"x" * 1000) == 400
        assert raw_put(addr, "", b"x" * 1000) == 411  # no Content-Length
        assert raw_put(addr, "Transfer-Encoding: chunked\r\n", b"3\r\nabc\r\n0\r\n\r\n") == 411
        assert raw_put(addr, f"Content-Length: {2 << 30}\r\n", b"x" * (1 << 20)) == 413  # 2 GiB into 0.5 GiB
        assert server.memory_info().rss - before < 16 << 20  # nothing of it was held
        # A body that fits is read straight into the memory that keeps it: no second copy.
        body = os.urandom(64 << 20)
        assert request(addr, "PUT", "/o/j/fits", body, AUTH)[0] == 200
        grown = server.memory_info().rss - before
        assert (64 << 20) * 0.9 < grown < (64 << 20) * 1.3, grown
        assert request(addr, "GET", "/o/j/fits", headers={**AUTH, "Range": "bytes=5-9"}) == (206, body[5:10])
        # Over what is left, refused with the reason (a body our clients would send is drained).
        status, why = request(addr, "PUT", "/o/j/more", os.urandom(8 << 20), {**AUTH, "X-Offset": "0"})
        assert status == 200
        status, why = request(addr, "PUT", "/o/j/fits", b"y" * 10, {**AUTH, "X-Offset": "3"})
        assert status == 409 and b"offset 3" in why
    finally:
        stop_process(proc, grace=1)


def test_a_corrupt_commit_marker_falls_back_like_a_corrupt_shard(tmp_path: Path) -> None:
    ckpt = Checkpointer(open_storage(str(tmp_path)))
    ckpt.save({"x": torch.full((100,), 1.0), "meta": {"n": 1}}, 10).wait()
    ckpt.save({"x": torch.full((100,), 2.0), "meta": {"n": 2}}, 20).wait()
    marker = tmp_path / step_dir(20) / MANIFEST_NAME
    data = bytearray(marker.read_bytes())
    at = data.index(b'"step":20') + len(b'"step":')
    data[at : at + 2] = b"21"  # still valid JSON, a plausible number: only the digest can tell
    marker.write_bytes(bytes(data))

    with pytest.raises(ChecksumError, match=f"{MANIFEST_NAME}.*fails its digest"):
        ckpt.load({"x": torch.zeros(100), "meta": {"n": 0}})
    target = {"x": torch.zeros(100), "meta": {"n": 0}}
    assert ckpt.load(target, fallback=True) == 10
    assert torch.equal(target["x"], torch.full((100,), 1.0)) and target["meta"] == {"n": 1}
    [corrupt] = [c for c in ckpt.catalog() if c.error]
    assert corrupt.step == 20 and "digest" in corrupt.error


def test_a_value_that_needs_code_to_load_is_refused_on_save(tmp_path: Path) -> None:
    import numpy as np

    ckpt = Checkpointer(open_storage(str(tmp_path)))
    with pytest.raises(UnsafeObjectError, match=r"'loader.rng'.*numpy.ndarray.*Convert it"):
        ckpt.save({"loader": {"rng": np.zeros(3)}, "x": torch.ones(2)}, 1)
    result = ckpt.wait()
    assert result is not None and not result.committed and "numpy.ndarray" in (result.error or "")
    assert result.location is None  # nothing committed: nothing for the job's catalog to point at
    assert ckpt.catalog() == []
    # What a training state holds is fine: RNG state, counters, optimizer settings.
    from stalwart.checkpoint import RNGState, TrainState

    model, optim = small_model()
    state = {"train": TrainState(model, optim), "rng": RNGState(), "loader": {"position": 7, "weights": (0.5, 0.5)}}
    saved = ckpt.save(state, 2).wait()
    assert saved.committed and saved.location == str(tmp_path / "step-0000000002")  # the catalog's pointer
    assert saved.total_bytes > 0 and saved.tiers == ["file"]


def test_a_format_1_checkpoint_still_loads_and_its_pickle_is_never_read(tmp_path: Path) -> None:
    """Format 1 had a bare JSON manifest and DCP's `.metadata` pickle beside it."""
    ckpt = Checkpointer(open_storage(str(tmp_path)))
    ckpt.save({"x": torch.arange(10.0), "meta": {"n": 3}}, 5).wait()
    folder = tmp_path / step_dir(5)
    manifest = read_manifest((folder / MANIFEST_NAME).read_bytes(), "test")
    legacy = manifest.model_copy(update={"format_version": 1, "mappings": {}})
    (folder / MANIFEST_NAME).write_text(legacy.model_dump_json())
    (folder / ".metadata").write_bytes(pickle.dumps(RunsCode(tmp_path / "pwned")))
    target = {"x": torch.zeros(10), "meta": {"n": 0}}
    assert ckpt.load(target) == 5 and torch.equal(target["x"], torch.arange(10.0)) and target["meta"] == {"n": 3}
    assert not (tmp_path / "pwned").exists()
