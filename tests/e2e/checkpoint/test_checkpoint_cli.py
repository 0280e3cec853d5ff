"""`stalwart checkpoint` commands, and interop both ways: plain DCP and torchsnapshot. The commands
run in this process (support.cli_invoke), through the installed command's entry."""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from support.cli_invoke import Cli

from stalwart.checkpoint import Checkpointer, open_storage


def make_checkpoint(root: Path) -> dict[str, torch.Tensor]:
    ck = Checkpointer(open_storage(str(root)))
    state = {"w": torch.randn(40, 30), "b": torch.randn(30)}
    ck.save({"model": state, "meta": {"epoch": 2}}, 100).wait()
    return state


def test_plain_dcp_reads_a_stalwart_checkpoint(tmp_path: Path, cli: Cli) -> None:
    """A checkpoint holds no pickle for DCP's FileSystemReader to run: DCP reads it through the
    safe reader, or by path after `stalwart checkpoint export-dcp`."""
    from stalwart.checkpoint import DCPReader

    state = make_checkpoint(tmp_path / "ckpt")
    assert not (tmp_path / "ckpt" / "step-0000000100" / ".metadata").exists()
    target = {"model": {"w": torch.zeros(40, 30), "b": torch.zeros(30)}, "meta": {"epoch": 0}}
    dcp.load(target, storage_reader=DCPReader(str(tmp_path / "ckpt"), 100))
    assert torch.equal(target["model"]["w"], state["w"]) and torch.equal(target["model"]["b"], state["b"])
    assert target["meta"] == {"epoch": 2}

    export = ["checkpoint", "export-dcp", str(tmp_path / "ckpt"), "100", str(tmp_path / "dcp")]
    out = cli(*export)
    assert out.returncode == 0, out.stderr
    assert "exported step 100" in out.stdout
    target = {"model": {"w": torch.zeros(40, 30), "b": torch.zeros(30)}, "meta": {"epoch": 0}}
    dcp.load(target, checkpoint_id=str(tmp_path / "dcp"))  # plain DCP, by path
    assert torch.equal(target["model"]["w"], state["w"]) and torch.equal(target["model"]["b"], state["b"])
    assert target["meta"] == {"epoch": 2}
    again = cli(*export)  # over it: refused
    assert again.returncode == 1 and "is not empty" in again.stderr and "Traceback" not in again.stderr


def test_ls_and_inspect(tmp_path: Path, cli: Cli) -> None:
    make_checkpoint(tmp_path)
    ls = cli("checkpoint", "ls", str(tmp_path), "-o", "json")
    assert ls.returncode == 0, ls.stderr
    [info] = json.loads(ls.stdout)
    assert info["step"] == 100 and info["world_size"] == 1
    inspect = cli("checkpoint", "inspect", str(tmp_path), "100", "-o", "json")
    assert inspect.returncode == 0, inspect.stderr
    manifest = json.loads(inspect.stdout)
    assert manifest["tensors"]["model.w"]["shape"] == [40, 30]
    assert manifest["tensors"]["model.w"]["shards"][0]["checksum"] > 0
    table = cli("checkpoint", "inspect", str(tmp_path), "100", env={"COLUMNS": "160"})
    assert table.returncode == 0, table.stderr
    assert "model.w" in table.stdout and "float32" in table.stdout


def test_inspect_of_a_missing_step_is_a_clear_error(tmp_path: Path, cli: Cli) -> None:
    make_checkpoint(tmp_path)
    out = cli("checkpoint", "inspect", str(tmp_path), "7")
    assert out.returncode == 1
    assert "no committed checkpoint for step 7" in out.stderr and "Traceback" not in out.stderr


def test_bad_uri_scheme(cli: Cli) -> None:
    out = cli("checkpoint", "ls", "ftp://x/y")
    assert out.returncode == 2 and "unsupported checkpoint URI scheme 'ftp'" in out.stderr


def test_import_torchsnapshot(tmp_path: Path, cli: Cli) -> None:
    from torchsnapshot import Snapshot, StateDict

    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    optim = torch.optim.Adam(model.parameters())
    model(torch.randn(3, 8)).sum().backward()
    optim.step()
    Snapshot.take(str(tmp_path / "snap"), {"model": model, "optim": optim, "extra": StateDict(step=7)})
    out = cli("checkpoint", "import-torchsnapshot", str(tmp_path / "snap"), str(tmp_path / "ckpt"), "--step", "7")
    assert out.returncode == 0, out.stderr
    fresh = torch.nn.Linear(8, 4)
    target = {"model": fresh.state_dict(), "extra": {"step": 0}}
    assert Checkpointer(open_storage(str(tmp_path / "ckpt"))).load(target) == 7
    assert torch.equal(fresh.weight, model.weight) and torch.equal(fresh.bias, model.bias)
    assert target["extra"]["step"] == 7


def test_the_short_api(tmp_path: Path) -> None:
    from stalwart import checkpoint

    uri = str(tmp_path / "short")
    assert checkpoint.latest(uri) is None
    handle = checkpoint.save({"x": torch.arange(6.0)}, uri, 3)
    assert handle.wait().committed
    target = {"x": torch.zeros(6)}
    assert checkpoint.load(target, uri) == 3 and torch.equal(target["x"], torch.arange(6.0))
    assert checkpoint.latest(uri) == 3
