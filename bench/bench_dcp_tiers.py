"""Plain DCP onto Stalwart's tiers: how long a checkpoint blocks the training loop.

    .venv/bin/python bench/bench_dcp_tiers.py                       # a 16M-parameter MLP, AdamW
    .venv/bin/python bench/bench_dcp_tiers.py --params 4 --saves 3  # quicker

For the same model and optimizer state, one process (DCP's no_dist path), each configuration saves
`--saves` times; the figure is the time the call held the loop (what `dcp.save` or
`dcp.async_save` takes before it returns), each save's write finished before the next one:

- anchor: `dcp.async_save` to DCP's FileSystemWriter on local disk, as DCP's docs recommend for
  async saves (`cache_staged_state_dict=True`, staging into reused pinned buffers, where a GPU is
  present: pinning needs one; DCP's default staging on a CPU-only machine);
- `dcp.async_save` to DCPWriter on `mem://` (a host-memory store with its copy on a peer store,
  both on loopback in this process, as a node agent serves them);
- `dcp.save` to each (the whole write inside the call).

Ratios are against the anchor's median. The report goes to bench/results/dcp-tiers.md.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shlex
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemWriter

from stalwart.checkpoint import DCPWriter, RetentionPolicy
from stalwart.checkpoint.memory_server import serve
from stalwart.net import free_port

REPO = Path(__file__).resolve().parents[1]
REPORT = REPO / "bench" / "results" / "dcp-tiers.md"
TOKEN = "bench-dcp-tiers"


def machine_load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} / {five:.2f} / {fifteen:.2f} on {os.cpu_count()} CPUs"


def model_state(million_params: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    width = int((million_params * 1_000_000 / 4) ** 0.5)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False) for _ in range(4)])
    optim = torch.optim.AdamW(model.parameters())
    model(torch.ones(2, width)).sum().backward()
    optim.step()
    return model, optim


def state_of(model: torch.nn.Module, optim: torch.optim.Optimizer) -> dict[str, Any]:
    return {"model": model.state_dict(), "optim": optim.state_dict()}


def blocked(save: Callable[[int], Any], saves: int) -> list[float]:
    """Seconds each call held the caller; an async save's write finishes before the next call."""
    out = []
    for step in range(1, saves + 1):
        t0 = time.perf_counter()
        pending = save(step)
        out.append(time.perf_counter() - t0)
        if hasattr(pending, "result"):  # an async save's future (dcp.save returns its Metadata)
            pending.result()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=int, default=16, help="millions of model parameters")
    parser.add_argument("--saves", type=int, default=5)
    parser.add_argument("--report", type=Path, default=REPORT)
    args = parser.parse_args()
    command = shlex.join(["python", "bench/bench_dcp_tiers.py", *sys.argv[1:]])
    os.environ["STALWART_CHECKPOINT_TOKEN"] = TOKEN
    model, optim = model_state(args.params)
    state_bytes = sum(t.numel() * t.element_size() for t in model.parameters()) * 3
    stores = [serve("127.0.0.1", free_port(), 8 * state_bytes + (64 << 20), TOKEN) for _ in range(2)]
    threads = [threading.Thread(target=s.serve_forever, args=(0.05,), daemon=True) for s in stores]
    for t in threads:
        t.start()
    mine, peer = (f"127.0.0.1:{s.server_address[1]}" for s in stores)
    mem = f"mem://{mine}/bench?peer={peer}"
    keep = RetentionPolicy(keep_last=2)  # the store holds a few checkpoints, as a job's does
    cache = torch.cuda.is_available()  # pinned staging buffers need an accelerator
    load_before = machine_load()
    rows: list[tuple[str, list[float]]] = []
    try:
        with tempfile.TemporaryDirectory(prefix="stalwart-bench-dcp-") as tmp:
            disk = Path(tmp)
            configs: list[tuple[str, Callable[[int], Any]]] = [
                (
                    "dcp.async_save, FileSystemWriter, local disk (anchor)",
                    lambda s: dcp.async_save(
                        state_of(model, optim),
                        storage_writer=FileSystemWriter(disk / f"fs-async-{s}", cache_staged_state_dict=cache),
                        no_dist=True,
                    ),
                ),
                (
                    "dcp.async_save, DCPWriter, mem:// with peer copy",
                    lambda s: dcp.async_save(
                        state_of(model, optim), storage_writer=DCPWriter(mem, s, retention=keep), no_dist=True
                    ),
                ),
                (
                    "dcp.save, FileSystemWriter, local disk",
                    lambda s: dcp.save(
                        state_of(model, optim), storage_writer=FileSystemWriter(disk / f"fs-sync-{s}"), no_dist=True
                    ),
                ),
                (
                    "dcp.save, DCPWriter, mem:// with peer copy",
                    lambda s: dcp.save(
                        state_of(model, optim), storage_writer=DCPWriter(mem, 100 + s, retention=keep), no_dist=True
                    ),
                ),
            ]
            for name, save in configs:
                rows.append((name, blocked(save, args.saves)))
                print(f"{name}: {[round(x, 4) for x in rows[-1][1]]}", flush=True)
    finally:
        for s in stores:
            s.shutdown()
            s.server_close()
    anchor = statistics.median(rows[0][1])
    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# Plain DCP onto Stalwart's tiers: time a checkpoint blocks the loop",
        "",
        "Written by `bench/bench_dcp_tiers.py`.",
        "",
        f"Measured {date} on {platform.node()} ({platform.machine()}), torch {torch.__version__}: `{command}`.",
        f"State: {state_bytes / 2**20:.0f} MiB (a {args.params}M-parameter MLP with AdamW's moments), one process;"
        f" the anchor's cache_staged_state_dict={cache}.",
        f"Machine before: {load_before}; after: {machine_load()}.",
        "",
        "| configuration | median blocked (s) | vs anchor | runs (s) |",
        "| --- | --- | --- | --- |",
    ]
    for name, secs in rows:
        median = statistics.median(secs)
        lines.append(f"| {name} | {median:.4f} | {median / anchor:.2f}x | {', '.join(f'{x:.4f}' for x in secs)} |")
    args.report.parent.mkdir(parents=True, exist_ok=True)
    args.report.write_text("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)


if __name__ == "__main__":
    main()
