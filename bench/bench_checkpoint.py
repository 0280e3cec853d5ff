"""Checkpoint benchmark: Stalwart against DCP (sync and async_save, both configured as a competent
user would) and torchsnapshot, in one run, on one disk, with the disk's raw bandwidth.

Two parts, both with `--ranks` gloo ranks:

1. isolated: about `--gb` GB of FSDP-style sharded state (fp32 weights and two Adam moments). Per
   system: the time the caller is held, the time until every tensor is copied (what an optimizer
   step right after the save would wait for), the time to the commit, and loads into the same
   layout and into two others (resharding).
2. loop: the real cost, inside a training loop: every step is matmuls, an all-reduce of a gradient
   bucket and an SGD-with-momentum step over the checkpointed weights (`--loop-gb` of weights and
   momentum in all). A save every `--intervals` steps (a long and a short interval). Per save: the
   time training is blocked (in the save call, waiting for the previous save, and waiting at the
   next optimizer step), and the loop's slowdown: (loop time with saves - loop time without) /
   saves, against a baseline run of the same steps in the same round. Rounds are repeated and the
   medians reported.

Anchors (every figure is against these; a weaker anchor would be a defect):
  DCP sync:  dcp.save(planner=DefaultSavePlanner(enable_plan_caching=True)), after a warm-up save.
  DCP async: dcp.async_save(async_stager=one DefaultStager reused by every save, with
             use_async_staging=True (and pinned memory and non-blocking copies when CUDA is
             there), planner=DefaultSavePlanner(enable_plan_caching=True), process_group=a gloo
             group of its own, the default thread executor), after a warm-up save. In the loop it
             waits for staging_completion just before the next optimizer step (the latest point
             it may) and for the previous upload before the next save.
  torchsnapshot (isolated part only): Snapshot.take / async_take, after a warm-up.

    python bench/bench_checkpoint.py --ranks 4 --gb 1.0 --loop-gb 0.5 --out docs/checkpoint-benchmark.md

`--device cuda` puts the state (and the loop's model) on the GPUs, rank r on GPU r % GPUs, and
measures the pinned device-to-host copy bandwidth beside the disk's. The ranks stay gloo ranks
(NCCL refuses two ranks on one GPU); the loop's gradient all-reduce then goes through the host.
`--systems ... dcp_sync` (instead of `dcp`) leaves out DCP's async_save, for a torch whose stager
cannot stage the state (torch 2.11's, with DTensors on a GPU: docs/gpu.md).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

ROOT = Path(__file__).resolve().parent.parent

DCP_SYNC = "dcp.save(planner=DefaultSavePlanner(enable_plan_caching=True)), after a warm-up save"
DCP_ASYNC = (
    "dcp.async_save(async_stager=DefaultStager(StagingOptions(use_async_staging=True, "
    "use_pinned_memory={cuda}, use_non_blocking_copy={cuda}, use_shared_memory=False)) reused by "
    "every save, planner=DefaultSavePlanner(enable_plan_caching=True), process_group=a gloo group "
    "of its own, thread executor), after a warm-up save"
)


# ----------------------------------------------------------------------------------- per rank
def make_state(gb: float, layout: str, fill: bool, device: torch.device) -> dict[str, Any]:
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
        mesh = init_device_mesh(device.type, (2, world // 2))
        placements, local_shape = [Shard(0), Replicate()], (rows // 2, cols)
    else:
        mesh = init_device_mesh(device.type, (world,))
        dim = 0 if layout == "rows" else 1
        placements = [Shard(dim)]
        local_shape = (rows // world, cols) if dim == 0 else (rows, cols // world)
    state: dict[str, Any] = {}
    for i in range(n_tensors):
        kind = ("weight", "exp_avg", "exp_avg_sq")[i % 3]
        g = torch.Generator().manual_seed(i * 1000 + rank)
        local = (torch.randn(local_shape, generator=g) if fill else torch.zeros(local_shape)).to(device)
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


class DCPAnchors:
    """DCP configured as its documentation says to for the least stall: one of these per process."""

    def __init__(self, cuda: bool) -> None:
        """cuda: the state is on GPUs (pinned staging memory and non-blocking copies then)."""
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

        self.stager = DefaultStager(
            StagingOptions(
                use_pinned_memory=cuda, use_shared_memory=False, use_async_staging=True, use_non_blocking_copy=cuda
            )
        )
        self.group = dist.new_group(backend="gloo")  # its background collectives never meet training's

    @staticmethod
    def planner() -> Any:
        from torch.distributed.checkpoint import DefaultSavePlanner

        return DefaultSavePlanner(enable_plan_caching=True)

    def sync_save(self, state: dict[str, Any], path: Path) -> None:
        import torch.distributed.checkpoint as dcp

        dcp.save(state, checkpoint_id=str(path), planner=self.planner())

    def async_save(self, state: dict[str, Any], path: Path) -> Any:
        import torch.distributed.checkpoint as dcp

        return dcp.async_save(
            state,
            checkpoint_id=str(path),
            async_stager=self.stager,
            planner=self.planner(),
            process_group=self.group,
        )

    def close(self) -> None:
        self.stager.close()
        dist.destroy_process_group(self.group)


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
    handle.wait_staged()  # no optimizer here: every tensor was copied in the call
    if is_cuda(state):  # a GPU's copies are only queued in the call (training's stream waits for them)
        torch.cuda.synchronize()
    staged = time.perf_counter() - t0
    result = handle.wait()
    total = time.perf_counter() - t0
    assert result.committed, result.error
    dist.barrier()
    load, _ = barrier_time(lambda: ck.load(target, step=2))
    regroup, _ = barrier_time(lambda: ck.load(regrouped, step=2))
    reshard, _ = barrier_time(lambda: ck.load(resharded, step=2))
    ck.close()
    return {
        "stall": stall,
        "staged": staged,
        "total": total,
        "load": load,
        "load_regroup": regroup,
        "load_reshard": reshard,
    }


def with_dcp_async(args: argparse.Namespace) -> bool:
    """DCP's async_save is an anchor unless only its synchronous save was asked for (`dcp_sync`)."""
    return "dcp" in args.systems or "dcp_sync" not in args.systems


def run_dcp(
    state: dict[str, Any],
    target: dict[str, Any],
    resharded: dict[str, Any],
    base: Path,
    regrouped: dict[str, Any],
    with_async: bool = True,
) -> dict[str, float | str]:
    import torch.distributed.checkpoint as dcp

    anchors = DCPAnchors(cuda=is_cuda(state))
    anchors.sync_save(state, base / "sync-warm")  # warm-up: plan cache, page cache, first-call costs
    t_sync, _ = barrier_time(lambda: anchors.sync_save(state, base / "sync"))
    if not with_async:
        anchors.close()
        load, _ = barrier_time(lambda: dcp.load(target, checkpoint_id=str(base / "sync")))
        regroup, _ = barrier_time(lambda: dcp.load(regrouped, checkpoint_id=str(base / "sync")))
        reshard, _ = barrier_time(lambda: dcp.load(resharded, checkpoint_id=str(base / "sync")))
        skipped = "not run"
        return {
            "sync_total": t_sync,
            "async_stall": skipped,
            "async_staged": skipped,
            "async_total": skipped,
            "load": load,
            "load_regroup": regroup,
            "load_reshard": reshard,
        }
    anchors.async_save(state, base / "async-warm").upload_completion.result()  # warm-up: stager buffers
    dist.barrier()
    t0 = time.perf_counter()
    response = anchors.async_save(state, base / "async")
    stall = time.perf_counter() - t0
    response.staging_completion.result()
    staged = time.perf_counter() - t0
    response.upload_completion.result()
    total = time.perf_counter() - t0
    anchors.close()
    load, _ = barrier_time(lambda: dcp.load(target, checkpoint_id=str(base / "sync")))
    regroup, _ = barrier_time(lambda: dcp.load(regrouped, checkpoint_id=str(base / "sync")))
    reshard, _ = barrier_time(lambda: dcp.load(resharded, checkpoint_id=str(base / "sync")))
    return {
        "sync_total": t_sync,
        "async_stall": stall,
        "async_staged": staged,
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
    Snapshot.take(str(base / "ts-warm"), {"s": StateDict(**local)})  # warm-up
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
        "async_staged": stall,
        "async_total": total,
        "load": load,
        "load_regroup": "not supported",
        "load_reshard": "not supported",
    }


# ------------------------------------------------------------------------------ the training loop
class LoopModel:
    """Weights sharded over the ranks, trained by SGD with momentum: what a checkpoint holds and what
    every optimizer step writes. The state dict is DTensors sharing the weights' and the momentum's
    storage, as FSDP's would."""

    def __init__(self, gb: float, device: torch.device) -> None:
        from torch.distributed.device_mesh import init_device_mesh

        world, rank = dist.get_world_size(), dist.get_rank()
        n_tensors, rows = 8, 4096
        cols = max(world, int(gb / 2 * (1 << 30) / 4 / n_tensors / rows) // world * world)
        self.mesh = init_device_mesh(device.type, (world,))
        self.device = device
        self.global_shape = torch.Size((rows, cols))
        g = torch.Generator().manual_seed(rank)
        self.params = [
            torch.nn.Parameter((torch.randn(rows // world, cols, generator=g) * 0.01).to(device))
            for _ in range(n_tensors)
        ]
        for p in self.params:
            p.grad = (torch.randn(p.shape, generator=g) * 0.01).to(device)  # fixed: the step's writes are what count
        self.optimizer = torch.optim.SGD(self.params, lr=1e-4, momentum=0.9)
        self.optimizer.step()  # the momentum buffers exist from here on
        self.activations = torch.randn(256, 1024, generator=g).to(device)
        self.layer = (torch.randn(1024, 1024, generator=g) * 0.03).to(device)
        self.bucket = torch.randn(1 << 20, generator=g).to(device)  # 4 MiB of gradients all-reduced per step

    def _dtensor(self, t: torch.Tensor) -> Any:
        from torch.distributed.tensor import DTensor, Shard

        cols = self.global_shape[1]
        return DTensor.from_local(t, self.mesh, [Shard(0)], run_check=False, shape=self.global_shape, stride=(cols, 1))

    def state_dict(self) -> dict[str, Any]:
        momentum = [self.optimizer.state[p]["momentum_buffer"] for p in self.params]
        return {
            "model": {f"w{i}": self._dtensor(p.detach()) for i, p in enumerate(self.params)},
            "optim": {f"w{i}": self._dtensor(m) for i, m in enumerate(momentum)},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

    def forward_backward(self, matmuls: int) -> None:
        x = self.activations
        for _ in range(matmuls):
            x = torch.tanh(x @ self.layer)
        dist.all_reduce(self.bucket)

    def nbytes(self) -> int:
        return 2 * sum(p.numel() * 4 for p in self.params)

    def sync(self) -> None:
        """Wait for the GPU's queued work, so the host's clock reads the steps' real time."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def loop_phase(
    system: str, model: LoopModel, interval: int, saves: int, matmuls: int, base: Path, ctx: dict[str, Any]
) -> dict[str, Any]:
    """`saves` saves, each followed by `interval` steps; the phase ends when the last save is done.
    system: none (the baseline), stalwart, dcp_async, dcp_sync."""

    state = {"train": model}
    steps = interval * (saves + 1)
    blocked: list[float] = []
    pending: Any = None  # stalwart: SaveHandle; dcp_async: AsyncSaveResponse
    staging: Any = None  # dcp_async: staging_completion still to wait for before the next step
    handles = []
    model.sync()
    dist.barrier()
    t0, cpu0 = time.perf_counter(), time.process_time()
    for step in range(1, steps + 1):
        model.forward_backward(matmuls)
        if staging is not None:  # DCP: the step may not run before the copy is done
            w0 = time.perf_counter()
            staging.result()
            blocked[-1] += time.perf_counter() - w0
            staging = None
        model.optimizer.step()  # Stalwart's pre-step hook waits here if its copy is not done
        if step % interval == 0 and step < steps:
            path = base / system / f"step-{step}"
            b0 = time.perf_counter()
            if system == "stalwart":
                pending = ctx["ckpt"].save(state, step)
                handles.append(pending)
            elif system == "dcp_async":
                if pending is not None:
                    pending.upload_completion.result()  # one save in flight
                pending = ctx["dcp"].async_save(state, path)
                staging = pending.staging_completion
            elif system == "dcp_sync":
                ctx["dcp"].sync_save(state, path)
            if system != "none":
                blocked.append(time.perf_counter() - b0)
    model.sync()
    tail = time.perf_counter()
    if system == "stalwart" and pending is not None:
        pending.wait()
    elif system == "dcp_async" and pending is not None:
        pending.upload_completion.result()
    if blocked:
        blocked[-1] += time.perf_counter() - tail  # the last save's write, as the next save would wait for it
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    out: dict[str, Any] = {"elapsed": elapsed, "cpu": cpu, "steps": steps, "blocked": blocked}
    if system == "stalwart":
        results = [h.wait() for h in handles]
        assert all(r.committed for r in results), [r.error for r in results]
        # in save() plus at the next optimizer step (both inside the loop's time)
        out["blocked"] = [b + r.step_wait_seconds for b, r in zip(blocked, results, strict=True)]
        out["in_call"] = [r.stall_seconds for r in results]
        out["step_wait"] = [r.step_wait_seconds for r in results]
        out["writer_cpu"] = [r.writer_cpu_seconds for r in results]
        out["save_total"] = [r.total_seconds for r in results]
    dist.barrier()
    if dist.get_rank() == 0:
        shutil.rmtree(base / system, ignore_errors=True)
    return out


def loop_systems(args: argparse.Namespace) -> list[str]:
    return ["stalwart", "dcp_async", "dcp_sync"] if with_dcp_async(args) else ["stalwart", "dcp_sync"]


def run_loop(args: argparse.Namespace, base: Path) -> dict[str, Any]:
    from stalwart.checkpoint import Checkpointer, RetentionPolicy, open_storage

    model = LoopModel(args.loop_gb, rank_device(args))
    ctx: dict[str, Any] = {
        "ckpt": Checkpointer(open_storage(str(base / "stalwart")), retention=RetentionPolicy(keep_last=1)),
        "dcp": DCPAnchors(cuda=args.device == "cuda"),
    }
    state = {"train": model}
    ctx["ckpt"].save(state, 0).wait()  # warm-ups: Stalwart's buffers and plan, DCP's stager and plan cache
    ctx["dcp"].sync_save(state, base / "dcp-warm" / "sync")
    if with_dcp_async(args):
        ctx["dcp"].async_save(state, base / "dcp-warm" / "async").upload_completion.result()
    dist.barrier()
    if dist.get_rank() == 0:
        shutil.rmtree(base / "dcp-warm", ignore_errors=True)
    # the step's time alone, for the report
    model.sync()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(10):
        model.forward_backward(args.matmuls)
        model.optimizer.step()
    model.sync()
    step_s = (time.perf_counter() - t0) / 10
    rounds: list[dict[str, Any]] = []
    for _ in range(args.rounds):
        phases: dict[str, Any] = {}
        for interval in args.intervals:
            for system in ("none", *loop_systems(args)):
                phases[f"{system}@{interval}"] = loop_phase(
                    system, model, interval, args.loop_saves, args.matmuls, base, ctx
                )
        rounds.append(phases)
    ctx["ckpt"].close()
    ctx["dcp"].close()
    return {"step_s": step_s, "bytes_per_rank": model.nbytes(), "rounds": rounds}


def rank_device(args: argparse.Namespace) -> torch.device:
    if args.device == "cuda":
        return torch.device("cuda", dist.get_rank() % torch.cuda.device_count())
    return torch.device("cpu")


def is_cuda(state: dict[str, Any]) -> bool:
    return any(t.to_local().is_cuda for t in state.values())


def rank_main(args: argparse.Namespace) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    device = rank_device(args)
    if device.type == "cuda":
        torch.cuda.set_device(device)  # before the device meshes, which would pick LOCAL_RANK's GPU
        torch.zeros(1, device=device)
    base = Path(args.dir)
    results: dict[str, Any] = {}
    if "isolated" in args.parts:
        state = make_state(args.gb, "rows", fill=True, device=device)
        target = make_state(args.gb, "rows", fill=False, device=device)
        resharded = make_state(args.gb, "cols", fill=False, device=device)
        regrouped = make_state(args.gb, "rows2", fill=False, device=device)
        results["bytes_per_rank"] = nbytes(state)
        for _ in range(args.repeats):  # systems interleaved, so a busier minute hits all of them
            dcp_async = with_dcp_async(args)
            runs = (("stalwart", run_stalwart), ("dcp", run_dcp), ("torchsnapshot", run_torchsnapshot))
            for name, fn in runs:
                if name not in args.systems and not (name == "dcp" and "dcp_sync" in args.systems):
                    continue
                if name == "dcp":
                    fn = functools.partial(run_dcp, with_async=dcp_async)
                folder = base / name
                if rank == 0:
                    shutil.rmtree(folder, ignore_errors=True)
                    folder.mkdir(parents=True)
                dist.barrier()
                results.setdefault(name, []).append(fn(state, target, resharded, folder, regrouped))
                dist.barrier()
                if rank == 0:
                    shutil.rmtree(folder, ignore_errors=True)  # keep the disk (and page cache) for the next one
        del state, target, resharded, regrouped
    if "loop" in args.parts:
        results["loop"] = run_loop(args, base / "loop")
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


D2H_MAX_GB = 4.0  # the copy that measures the device-to-host bandwidth: the state's size, at most this


def d2h_bandwidth(gb: float) -> float:
    """Pinned device-to-host copy bandwidth (bytes/s) of GPU 0, one copy of `gb` GB: the physical
    limit of staging a GPU's state (median of 3 copies after a warm-up)."""
    src = torch.ones(int(gb * (1 << 30)) // 4, device="cuda")
    dst = torch.empty(src.shape, dtype=src.dtype, pin_memory=True)
    times = []
    for _ in range(4):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    del src, dst
    torch.cuda.empty_cache()
    return int(gb * (1 << 30)) // 4 * 4 / statistics.median(times[1:])


def device_text(args: argparse.Namespace) -> str:
    if args.device != "cuda":
        return f"{os.cpu_count()} CPU cores"
    gpus = torch.cuda.device_count()
    shared = f", {args.ranks} ranks sharing them" if args.ranks > gpus else ""
    return f"state on {gpus} x {torch.cuda.get_device_name(0)}{shared}, {os.cpu_count()} CPU cores"


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
        argv = [sys.executable, __file__, "--rank-main", "--dir", str(folder), *args.forward]
        procs.append(spawn(argv, env=env))
    try:
        codes = [p.wait(timeout=5400) for p in procs]
    finally:
        for p in procs:
            stop_process(p, grace=5)
    if any(codes):
        raise SystemExit(f"benchmark ranks exited {codes}")
    return [json.loads((folder / f"rank-{r}.json").read_text()) for r in range(args.ranks)]


def slowest(results: list[dict[str, Any]], system: str, key: str) -> float | str:
    """The median over repeats of the slowest rank's figure."""
    per_repeat = []
    for i in range(len(results[0][system])):
        values = [r[system][i][key] for r in results]
        if any(isinstance(v, str) for v in values):
            return next(v for v in values if isinstance(v, str))
        per_repeat.append(max(values))
    return statistics.median(per_repeat)


def fmt(v: float | str, digits: int = 3) -> str:
    return v if isinstance(v, str) else f"{v:.{digits}f}"


def isolated_report(args: argparse.Namespace, results: list[dict[str, Any]], dd: float, d2h: float | None) -> list[str]:
    total_bytes = sum(r["bytes_per_rank"] for r in results)
    keys = ("stall", "staged", "total", "load", "load_regroup", "load_reshard")
    s = {k: slowest(results, "stalwart", k) for k in keys}
    rows = [("Stalwart save()", s["stall"], s["staged"], s["total"], s["load"], s["load_regroup"], s["load_reshard"])]
    dkeys = ("sync_total", "async_stall", "async_staged", "async_total", "load", "load_regroup", "load_reshard")
    if "dcp" in args.systems or "dcp_sync" in args.systems:
        d = {k: slowest(results, "dcp", k) for k in dkeys}
        loads = (d["load"], d["load_regroup"], d["load_reshard"])
        rows += [
            ("DCP save (sync)", d["sync_total"], d["sync_total"], d["sync_total"], *loads),
            ("DCP async_save", d["async_stall"], d["async_staged"], d["async_total"], "-", "-", "-"),
        ]
    if "torchsnapshot" in args.systems:
        t = {k: slowest(results, "torchsnapshot", k) for k in dkeys}
        loads = (t["load"], t["load_regroup"], t["load_reshard"])
        rows += [
            ("torchsnapshot take", t["sync_total"], t["sync_total"], t["sync_total"], *loads),
            ("torchsnapshot async_take", t["async_stall"], t["async_staged"], t["async_total"], "-", "-", "-"),
        ]
    lines = [
        "### Isolated save and load",
        "",
        f"State: {total_bytes / 1e9:.2f} GB over {args.ranks} gloo ranks (FSDP-style row shards), "
        f"{device_text(args)}. Times: the slowest rank's, in seconds, median of {args.repeats} repeats "
        "(systems interleaved). No optimizer runs here, so "
        "Stalwart copies every tensor inside save(); in a loop the optimizer's tensors are copied behind it.",
        "",
        "| system | caller held | all tensors copied | committed | load (same layout) | "
        "load (rows: 4 shards -> 2x2) | load (rows -> columns) |",
        "|---|---|---|---|---|---|---|",
        *[f"| {n} | {fmt(a)} | {fmt(b)} | {fmt(c)} | {fmt(x)} | {fmt(r)} | {fmt(e)} |" for n, a, b, c, x, r, e in rows],
        "",
        f"Raw disk write bandwidth (dd, 64 MiB blocks, fdatasync): {dd / 1e9:.2f} GB/s. "
        f"Stalwart's save throughput: {total_bytes / s['total'] / 1e9:.2f} GB/s "  # type: ignore[operator]
        f"({total_bytes / s['total'] / dd:.2f} of dd's).",  # type: ignore[operator]
    ]
    if d2h is not None:
        lines += [
            "",
            f"Pinned device-to-host copy bandwidth (GPU 0, one {min(args.gb, D2H_MAX_GB):.1f} GB copy): "
            f"{d2h / 1e9:.1f} GB/s, "
            f"so copying this state takes at least {total_bytes / d2h:.3f} s. Stalwart's copy (all tensors "
            f"copied): {total_bytes / float(s['staged']) / 1e9:.1f} GB/s "
            f"({total_bytes / float(s['staged']) / d2h:.2f} of the copy bandwidth).",
        ]
    if "dcp" in args.systems or "dcp_sync" in args.systems:
        lines += [
            "",
            "| load ratio (DCP / Stalwart) | measured |",
            "|---|---|",
            f"| same layout | {d['load'] / s['load']:.2f}x |",  # type: ignore[operator]
            f"| rows 4 -> 2x2 | {d['load_regroup'] / s['load_regroup']:.2f}x |",  # type: ignore[operator]
            f"| rows -> columns | {d['load_reshard'] / s['load_reshard']:.2f}x |",  # type: ignore[operator]
        ]
    return lines


def loop_summary(
    results: list[dict[str, Any]], intervals: list[int], systems: list[str]
) -> dict[str, dict[str, float]]:
    """Per system@interval: medians over rounds of the slowest rank's loop time, blocked time per save
    (slowest rank, median over saves) and slowdown per save against the same round's baseline."""
    rounds = len(results[0]["loop"]["rounds"])
    out: dict[str, dict[str, float]] = {}
    for interval in intervals:
        for system in systems:
            key = f"{system}@{interval}"
            slowdowns, blocked, in_call, step_wait, writer_cpu, totals, cpus = [], [], [], [], [], [], []
            for i in range(rounds):
                phase = [r["loop"]["rounds"][i][key] for r in results]
                base = max(r["loop"]["rounds"][i][f"none@{interval}"]["elapsed"] for r in results)
                base_cpu = sum(r["loop"]["rounds"][i][f"none@{interval}"]["cpu"] for r in results)
                saves = len(phase[0]["blocked"])
                slowdowns.append((max(p["elapsed"] for p in phase) - base) / saves)
                cpus.append((sum(p["cpu"] for p in phase) - base_cpu) / saves)
                blocked += [max(p["blocked"][j] for p in phase) for j in range(saves)]
                if system == "stalwart":
                    in_call += [max(p["in_call"][j] for p in phase) for j in range(saves)]
                    step_wait += [max(p["step_wait"][j] for p in phase) for j in range(saves)]
                    writer_cpu += [statistics.mean(p["writer_cpu"][j] for p in phase) for j in range(saves)]
                    totals += [max(p["save_total"][j] for p in phase) for j in range(saves)]
            row = {
                "slowdown": statistics.median(slowdowns),
                "blocked": statistics.median(blocked),
                "cpu": statistics.median(cpus),
            }
            row["slowdown_spread"] = max(slowdowns) - min(slowdowns)
            if system == "stalwart":
                row |= {
                    "in_call": statistics.median(in_call),
                    "step_wait": statistics.median(step_wait),
                    "writer_cpu": statistics.median(writer_cpu),
                    "save_total": statistics.median(totals),
                }
            out[key] = row
    return out


def loop_report(args: argparse.Namespace, results: list[dict[str, Any]]) -> list[str]:
    loop = results[0]["loop"]
    total = sum(r["loop"]["bytes_per_rank"] for r in results)
    summary = loop_summary(results, args.intervals, loop_systems(args))
    step_s = max(r["loop"]["step_s"] for r in results)
    lines = [
        "### In a training loop",
        "",
        f"{args.ranks} gloo ranks ({device_text(args)}); a step is {args.matmuls} matmuls "
        "(256x1024 by 1024x1024), an all-reduce of "
        f"4 MiB and an SGD-with-momentum step over the checkpointed weights: {step_s:.3f} s per step "
        f"without saves. Checkpoint: {total / 1e9:.2f} GB (weights and momentum, sharded). "
        f"{args.loop_saves} saves per phase, {len(loop['rounds'])} rounds; medians (blocked: over every save "
        "of every round, slowest rank; slowdown: over rounds, against the same round's run without saves).",
        "",
        "| interval (steps) | system | blocked per save (s) | loop slowdown per save (s) | spread of the slowdown "
        "| extra CPU per save, all ranks (s) |",
        "|---|---|---|---|---|---|",
    ]
    names = {"stalwart": "Stalwart", "dcp_async": "DCP async_save (fair)", "dcp_sync": "DCP save (sync)"}
    for interval in args.intervals:
        for system in loop_systems(args):
            row = summary[f"{system}@{interval}"]
            lines.append(
                f"| {interval} | {names[system]} | {row['blocked']:.4f} | {row['slowdown']:.3f} | "
                f"{row['slowdown_spread']:.3f} | {row['cpu']:.2f} |"
            )
    lines += ["", "| interval | Stalwart: in save() | at the next step | writer CPU per save | save to commit |"]
    lines.append("|---|---|---|---|---|")
    for interval in args.intervals:
        row = summary[f"stalwart@{interval}"]
        lines.append(
            f"| {interval} | {row['in_call']:.4f} s | {row['step_wait']:.4f} s | {row['writer_cpu']:.3f} s | "
            f"{row['save_total']:.2f} s |"
        )
    lines += ["", "| target | interval | measured | met? |", "|---|---|---|---|"]
    for interval in args.intervals:
        s, y = summary[f"stalwart@{interval}"], summary[f"dcp_sync@{interval}"]
        ratio_sync = y["blocked"] / s["blocked"] if s["blocked"] > 0 else float("inf")
        met = "yes" if ratio_sync >= 50 else "no"
        lines.append(f"| blocked >= 50x below DCP sync | {interval} | {ratio_sync:.0f}x | {met} |")
        if f"dcp_async@{interval}" not in summary:
            lines.append(f"| DCP async_save targets | {interval} | not run | - |")
            continue
        a = summary[f"dcp_async@{interval}"]
        lines.append(
            f"| blocked below DCP async_save | {interval} | {s['blocked']:.4f} s vs {a['blocked']:.4f} s | "
            f"{'yes' if s['blocked'] < a['blocked'] else 'no'} |"
        )
        half = s["slowdown"] <= 0.5 * a["slowdown"]
        lines.append(
            f"| slowdown <= half of DCP async_save's | {interval} | {s['slowdown']:.3f} s vs {a['slowdown']:.3f} s | "
            f"{'yes' if half else 'no'} |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--gb", type=float, default=1.0, help="state of the isolated part")
    parser.add_argument("--parts", nargs="+", default=["isolated", "loop"], choices=["isolated", "loop"])
    parser.add_argument("--systems", nargs="+", default=["stalwart", "dcp", "torchsnapshot"])
    parser.add_argument("--repeats", type=int, default=3, help="of the isolated part")
    parser.add_argument("--loop-gb", type=float, default=0.5, help="checkpoint of the loop part")
    parser.add_argument("--intervals", type=int, nargs="+", default=[40, 10], help="steps between saves")
    parser.add_argument("--loop-saves", type=int, default=3, help="saves per phase")
    parser.add_argument("--matmuls", type=int, default=6, help="per step, per rank")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where the state lives")
    parser.add_argument("--dir", default=None, help="where to write (default: a temp folder on the repo's disk)")
    parser.add_argument("--out", default=None, help="also write the report (markdown) here")
    parser.add_argument("--raw", default=None, help="also write every rank's numbers (JSON) here")
    parser.add_argument("--rank-main", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_main:
        rank_main(args)
        return
    args.forward = [a for a in sys.argv[1:] if a not in ("--out", args.out, "--raw", args.raw, "--dir", args.dir)]
    folder = Path(
        args.dir
        or tempfile.mkdtemp(prefix="bench-ckpt-", dir=ROOT / ".stalwart" if (ROOT / ".stalwart").exists() else None)
    )
    folder.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    try:
        print(f"measuring raw disk bandwidth in {folder} ...", flush=True)
        dd = dd_bandwidth(folder, args.gb)
        d2h = None
        if args.device == "cuda":
            print("measuring pinned device-to-host copy bandwidth ...", flush=True)
            d2h = d2h_bandwidth(min(args.gb, D2H_MAX_GB))
        print(f"running {args.ranks} ranks: {', '.join(args.parts)} ...", flush=True)
        results = launch(args, folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    lines = [
        f"Load average before / after: {load_before[0]:.1f} / {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores.",
        "",
        "Anchors: DCP sync = " + DCP_SYNC + "; DCP async = " + DCP_ASYNC.format(cuda=args.device == "cuda") + ".",
        "",
    ]
    if "isolated" in args.parts:
        lines += isolated_report(args, results, dd, d2h) + [""]
    if "loop" in args.parts:
        lines += loop_report(args, results)
    text = "\n".join(lines)
    print(text)
    if args.raw:
        Path(args.raw).write_text(json.dumps(results))
    if args.out:
        command = "python bench/bench_checkpoint.py " + " ".join(sys.argv[1:])
        Path(args.out).write_text(f"Measured on {time.strftime('%Y-%m-%d %H:%M')} with:\n\n    {command}\n\n{text}\n")


if __name__ == "__main__":
    main()
