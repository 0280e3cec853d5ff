"""Plain DCP across world sizes: 2 ranks save DTensor shards through DCPWriter (dcp.save and
dcp.async_save), then 3 ranks and 1 rank load them resharded through DCPReader. Multi-rank
torch.distributed worlds: an end-to-end test (docs/testing.md)."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.ranks import run_ranks

from stalwart.checkpoint import Checkpointer, open_storage

pytestmark = pytest.mark.e2e

RANKS = Path(__file__).with_name("dcp_ranks.py")


@pytest.mark.parametrize("mode", ["save", "async"])
def test_two_ranks_save_and_three_ranks_load_resharded(tmp_path: Path, mode: str) -> None:
    uri = f"uri={tmp_path / 'ckpt'}"
    saved = run_ranks(RANKS, ["save", str(tmp_path), uri, f"mode={mode}"], 2, tmp_path)
    assert all(r["result"]["committed"] for r in saved)
    [info] = Checkpointer.list_committed(open_storage(str(tmp_path / "ckpt")))
    assert info.world_size == 2
    for world in (3, 1):
        loaded = run_ranks(RANKS, ["load", str(tmp_path), uri], world, tmp_path)
        for r in loaded:
            assert all(r["equal"].values()), r
            assert r["loader"] == {"position": 41, "epoch": 2}
