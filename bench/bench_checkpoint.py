"""Checkpoint benchmark: Stalwart vs DCP (sync and async_save) vs torchsnapshot, same run, same disk.

State: about `--gb` GB of model + optimizer state (fp32 weights and two Adam moments), sharded
FSDP-style over `--ranks` gloo ranks. Per system: the blocking stall, the total save time, and the
load time into the same layout and into a different one (resharding). The physical limit, raw
disk write bandwidth, is measured with dd in the same run.

    python bench/bench_checkpoint.py --ranks 4 --gb 1.0 --out docs/checkpoint-benchmark.md
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

ROOT = Path(__file__).resolve().parent.parent


# ----------------------------------------------------------------------------------- per rank
def make_state(gb: float, layout: str, fill: bool) -> dict[str, Any]:
    """Weights + 2 optimizer moments, in 16 tensors of equal size, sharded over the ranks.

    Each rank creates only its own shard (as FSDP does), so memory stays at gb / ranks per state.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard

    world, rank = dist.get_world_size(), dist.get_rank()
    n_tensors = 16
    rows = 4096
    cols = int(gb * (1 << 30) / 4 / n_tensors / rows) // world * world
    if layout == "rows2":  # 2-way row shards, each held by 2 ranks (a DP size change: 4 -> 2 x 2)
        mesh = init_device_mesh("cpu", (2, world // 2))
        placements, local_shape = [Shard(0), Replicate()], (rows // 2, cols)
    else:
        mesh = init_device_mesh("cpu", (world,))
        dim = 0 if layout == "rows" else 1
        placements = [Shard(dim)]
        local_shape = (rows // world, cols) if dim == 0 else (rows, cols // world)
    state: dict[str, Any] = {}
    for i in range(n_tensors):
        kind = ("weight", "exp_avg", "exp_avg_sq")[i % 3]
        g = torch.Generator().manual_seed(i * 1000 + rank)
        local = torch.randn(local_shape, generator=g) if fill else torch.zeros(local_shape)
        state[f"layer{i}.{kind}"] = DTensor.from_local(
            local, mesh, placements, run_check=False, shape=torch.Size((rows, cols)), stride=(cols, 1)
        )
    return state


def nbytes(state: dict[str, Any]) -> int:
    return sum(t.to_local().numel() * 4 for t in state.values())


def barrier_time(fn):  # type: ignore[no-untyped-def]
    dist.barrier()
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def run_stalwart(
    state: dict[str, Any], target: dict[str, Any], resharded: dict[str, Any], base: Path, regrouped: dict[str, Any]
) -> dict[str, float]:
    from stalwart.checkpoint import Checkpointer, open_storage

    ck = Checkpointer(open_storage(str(base)))
    ck.save(state, 1).wait()  # warm-up: allocates staging buffers and caches the plan, as in training
    dist.barrier()
    t0 = time.perf_counter()
    handle = ck.save(state, 2)
    stall = time.perf_counter() - t0
    result = handle.wait()
    total = time.perf_counter() - t0
    assert result.committed, result.error
    dist.barrier()
    load, _ = barrier_time(lambda: ck.load(target, step=2))
    regroup, _ = barrier_time(lambda: ck.load(regrouped, step=2))
    reshard, _ = barrier_time(lambda: ck.load(resharded, step=2))
    ck.close()
    return {"stall": stall, "total": total, "load": load, "load_regroup": regroup, "load_reshard": reshard}


def run_dcp(
    state: dict[str, Any], target: dict[str, Any], resharded: dict[str, Any], base: Path, regrouped: dict[str, Any]
) -> dict[str, float]:
    import torch.distributed.checkpoint as dcp

    t_sync, _ = barrier_time(lambda: dcp.save(state, checkpoint_id=str(base / "sync")))
    dist.barrier()
    t0 = time.perf_counter()
    fut = dcp.async_save(state, checkpoint_id=str(base / "async"))
    stall = time.perf_counter() - t0
    fut.result()
    total = time.perf_counter() - t0
    load, _ = barrier_time(lambda: dcp.load(target, checkpoint_id=str(base / "sync")))
    regroup, _ = barrier_time(lambda: dcp.load(regrouped, checkpoint_id=str(base / "sync")))
    reshard, _ = barrier_time(lambda: dcp.load(resharded, checkpoint_id=str(base / "sync")))
    return {
        "sync_total": t_sync,
        "async_stall": stall,
        "async_total": total,
        "load": load,
        "load_regroup": regroup,
        "load_reshard": reshard,
    }


def run_torchsnapshot(
    state: dict[str, Any], target: dict[str, Any], resharded: dict[str, Any], base: Path, regrouped: dict[str, Any]
) -> dict[str, float | str]:
    """torchsnapshot 0.1.0 predates DTensor: it saves each rank's local shards as that rank's own
    objects, and cannot reshard them."""
    import logging

    from torchsnapshot import Snapshot, StateDict

    logging.getLogger("torchsnapshot").setLevel(logging.ERROR)
    local = {k: v.to_local() for k, v in state.items()}
    local_target = {k: v.to_local() for k, v in target.items()}
    path = str(base / "ts")
    t_sync, _ = barrier_time(lambda: Snapshot.take(path, {"s": StateDict(**local)}))
    dist.barrier()
    t0 = time.perf_counter()
    pending = Snapshot.async_take(str(base / "ts-async"), {"s": StateDict(**local)})
    stall = time.perf_counter() - t0
    pending.wait()
    total = time.perf_counter() - t0
    load, _ = barrier_time(lambda: Snapshot(path).restore({"s": StateDict(**local_target)}))
    return {
        "sync_total": t_sync,
        "async_stall": stall,
        "async_total": total,
        "load": load,
        "load_regroup": "not supported",
        "load_reshard": "not supported",
    }


def rank_main(args: argparse.Namespace) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    base = Path(args.dir)
    state = make_state(args.gb, "rows", fill=True)
    target = make_state(args.gb, "rows", fill=False)
    resharded = make_state(args.gb, "cols", fill=False)
    regrouped = make_state(args.gb, "rows2", fill=False)
    results: dict[str, Any] = {"bytes_per_rank": nbytes(state)}
    for name, fn in (("stalwart", run_stalwart), ("dcp", run_dcp), ("torchsnapshot", run_torchsnapshot)):
        if name not in args.systems:
            continue
        folder = base / name
        if rank == 0:
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(parents=True)
        dist.barrier()
        results[name] = fn(state, target, resharded, folder, regrouped)
        dist.barrier()
        if rank == 0:
            shutil.rmtree(folder, ignore_errors=True)  # keep the disk (and page cache) for the next one
    Path(args.dir, f"rank-{rank}.json").write_text(json.dumps(results))
    dist.barrier()
    dist.destroy_process_group()


# ----------------------------------------------------------------------------------- driver
def dd_bandwidth(folder: Path, gb: float) -> float:
    """Raw sequential write bandwidth (bytes/s) with dd, flushed to the disk (conv=fdatasync)."""
    path = folder / "dd.bin"
    count = max(1, int(gb * 1024 / 64))
    out = subprocess.run(
        ["dd", "if=/dev/zero", f"of={path}", "bs=64M", f"count={count}", "conv=fdatasync"],
        capture_output=True,
        text=True,
        check=True,
    )
    path.unlink(missing_ok=True)
    m = re.search(r"(\d+) bytes .* copied, ([\d.]+) s", out.stderr)
    assert m, out.stderr
    return int(m.group(1)) / float(m.group(2))


def launch(args: argparse.Namespace, folder: Path) -> list[dict[str, Any]]:
    from stalwart.net import free_port
    from stalwart.processes import spawn, stop_process

    port = free_port()
    procs = []
    for rank in range(args.ranks):
        env = {
            **os.environ,
            "RANK": str(rank),
            "WORLD_SIZE": str(args.ranks),
            "LOCAL_RANK": str(rank),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "OMP_NUM_THREADS": "1",
            "PYTHONWARNINGS": "ignore",
        }
        argv = [
            sys.executable,
            __file__,
            "--rank-main",
            "--dir",
            str(folder),
            "--gb",
            str(args.gb),
            "--systems",
            *args.systems,
        ]
        procs.append(spawn(argv, env=env))
    try:
        codes = [p.wait(timeout=3000) for p in procs]
    finally:
        for p in procs:
            stop_process(p, grace=5)
    if any(codes):
        raise SystemExit(f"benchmark ranks exited {codes}")
    return [json.loads((folder / f"rank-{r}.json").read_text()) for r in range(args.ranks)]


def slowest(results: list[dict[str, Any]], system: str, key: str) -> float | str:
    values = [r[system][key] for r in results]
    if any(isinstance(v, str) for v in values):
        return next(v for v in values if isinstance(v, str))
    return max(values)


def report(args: argparse.Namespace, results: list[dict[str, Any]], dd: float) -> str:
    total_bytes = sum(r["bytes_per_rank"] for r in results)
    s = {k: slowest(results, "stalwart", k) for k in ("stall", "total", "load", "load_regroup", "load_reshard")}
    rows = [("Stalwart (async)", s["stall"], s["total"], s["load"], s["load_regroup"], s["load_reshard"])]
    if "dcp" in args.systems:
        d = {
            k: slowest(results, "dcp", k)
            for k in ("sync_total", "async_stall", "async_total", "load", "load_regroup", "load_reshard")
        }
        rows += [
            ("DCP save (sync)", d["sync_total"], d["sync_total"], d["load"], d["load_regroup"], d["load_reshard"]),
            ("DCP async_save", d["async_stall"], d["async_total"], "-", "-", "-"),
        ]
    if "torchsnapshot" in args.systems:
        t = {
            k: slowest(results, "torchsnapshot", k)
            for k in ("sync_total", "async_stall", "async_total", "load", "load_regroup", "load_reshard")
        }
        rows += [
            ("torchsnapshot take", t["sync_total"], t["sync_total"], t["load"], t["load_regroup"], t["load_reshard"]),
            ("torchsnapshot async_take", t["async_stall"], t["async_total"], "-", "-", "-"),
        ]

    def fmt(v: float | str) -> str:
        return v if isinstance(v, str) else f"{v:.3f}"

    lines = [
        f"State: {total_bytes / 1e9:.2f} GB over {args.ranks} gloo ranks (FSDP-style row shards), "
        f"{os.cpu_count()} CPU cores. Times are the slowest rank's, in seconds.",
        "",
        "| system | blocking stall | total save | load (same layout) | load (rows: 4 shards -> 2x2) | "
        "load (rows -> columns) |",
        "|---|---|---|---|---|---|",
        *[f"| {n} | {fmt(a)} | {fmt(b)} | {fmt(c)} | {fmt(r)} | {fmt(e)} |" for n, a, b, c, r, e in rows],
        "",
        f"Raw disk write bandwidth (dd, 64 MiB blocks, fdatasync): {dd / 1e9:.2f} GB/s.",
        "",
        "| ratio | measured | target |",
        "|---|---|---|",
    ]
    if "dcp" in args.systems:
        stall_ratio = d["sync_total"] / s["stall"]  # type: ignore[operator]
        lines.append(f"| DCP sync save time / Stalwart stall | {stall_ratio:.1f}x | >= 50x |")
        lines.append(f"| DCP async_save stall / Stalwart stall | {d['async_stall'] / s['stall']:.1f}x | - |")  # type: ignore[operator]
    throughput = total_bytes / s["total"]  # type: ignore[operator]
    lines.append(
        f"| Stalwart save throughput / raw disk bandwidth | {throughput / dd:.2f} "
        f"({throughput / 1e9:.2f} GB/s) | >= 0.8 |"
    )
    if "dcp" in args.systems:
        lines.append(f"| DCP load / Stalwart load, same layout | {d['load'] / s['load']:.2f}x | - |")
        lines.append(
            f"| DCP load / Stalwart load, rows 4 -> 2x2 | {d['load_regroup'] / s['load_regroup']:.2f}x | >= 1.0 |"
        )
        lines.append(
            f"| DCP load / Stalwart load, rows -> columns | {d['load_reshard'] / s['load_reshard']:.2f}x | >= 1.0 |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--gb", type=float, default=1.0)
    parser.add_argument("--dir", default=None, help="where to write (default: a temp folder on the repo's disk)")
    parser.add_argument("--systems", nargs="+", default=["stalwart", "dcp", "torchsnapshot"])
    parser.add_argument("--out", default=None, help="also write the report (markdown) here")
    parser.add_argument("--rank-main", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_main:
        rank_main(args)
        return
    folder = Path(
        args.dir
        or tempfile.mkdtemp(prefix="bench-ckpt-", dir=ROOT / ".stalwart" if (ROOT / ".stalwart").exists() else None)
    )
    folder.mkdir(parents=True, exist_ok=True)
    try:
        print(f"measuring raw disk bandwidth in {folder} ...", flush=True)
        dd = dd_bandwidth(folder, args.gb)
        print(f"running {args.ranks} ranks, {args.gb} GB: {', '.join(args.systems)} ...", flush=True)
        results = launch(args, folder)
        text = report(args, results, dd)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print(text)
    if args.out:
        command = "python bench/bench_checkpoint.py " + " ".join(sys.argv[1:])
        Path(args.out).write_text(
            f"# Checkpoint benchmark\n\nMeasured on {time.strftime('%Y-%m-%d')} with:\n\n    {command}\n\n{text}\n"
        )


if __name__ == "__main__":
    main()
