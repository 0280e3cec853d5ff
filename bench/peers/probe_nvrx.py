"""What NVIDIA Resiliency Extension does on this machine (CPU, gloo): its in-process restart Wrapper
around a two-rank training function, and its local checkpoint manager. Prints each part's outcome
(the exact exception where it fails) for the peers report; exits 0 either way."""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
import sys
import tempfile
import time
import traceback
import typing
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import TinyGPT, batch_for, loss_of, sample_ids


def _where(exc: BaseException) -> str:
    """The exception and the library frame that raised it (the probe's report line)."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "site-packages" in f.filename] or list(
        traceback.extract_tb(exc.__traceback__)
    )
    where = ""
    if frames:
        f = frames[-1]
        where = f" (at {f.filename.split('site-packages/')[-1]}:{f.lineno}: {f.line})"
    return "".join(traceback.format_exception_only(type(exc), exc)).strip() + where


def _rank_main(rank: int, world: int, port: int, queue: mp.Queue) -> None:  # type: ignore[type-arg]
    import nvidia_resiliency_ext.inprocess as inprocess

    os.environ.update(
        {"RANK": str(rank), "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    )
    os.environ.setdefault("LOCAL_RANK", str(rank))

    def train(call_wrapper=None):  # type: ignore[no-untyped-def]  # unannotated: the Wrapper reads annotations
        dist.init_process_group("gloo", timeout=timedelta(seconds=30))
        model = torch.nn.parallel.DistributedDataParallel(TinyGPT())
        optim = torch.optim.AdamW(model.parameters())
        for step in range(1, 4):
            loss = loss_of(model, batch_for(sample_ids(step, rank, world)))
            optim.zero_grad()
            loss.backward()
            optim.step()
        return step

    try:
        wrapped = inprocess.Wrapper(
            store_kwargs={"port": port + 1},
            health_check=None,
        )(train)
        queue.put((rank, f"in-process Wrapper: trained {wrapped()} steps"))
    except BaseException as exc:
        queue.put((rank, "in-process Wrapper: " + _where(exc)))


def _run_ranks(target: Callable[..., None], timeout: float, silent: str) -> list[str]:
    """Run `target(rank, 2, port, queue)` in 2 spawned ranks; what each said, or `silent`."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=target, args=(r, 2, port, queue)) for r in range(2)]
    for p in procs:
        p.start()
    out = []
    for _ in procs:
        try:
            rank, said = queue.get(timeout=timeout)
            out.append(f"rank {rank}: {said}")
        except Exception:
            out.append(silent)
            break
    for p in procs:
        p.join(timeout=10)
        if p.is_alive():
            p.kill()
            p.join()
    return out


def probe_inprocess() -> list[str]:
    return _run_ranks(_rank_main, 120, "a rank said nothing within 120 s")


def _hang_rank(rank: int, world: int, port: int, queue: mp.Queue) -> None:  # type: ignore[type-arg]
    """The Wrapper configured to notice a hang quickly (soft 10 s, hard 20 s timeouts, manual pings every
    step): in its first iteration rank 1 stops at step HANG_STEP (a loop that never pings); the cell's
    figure is the hang's start to the first step rank 1 trains in the restarted iteration. What the
    training function needs is imported and built once before the Wrapper: an import interrupted by
    the Wrapper's timeout leaves a half-initialized module behind."""
    import nvidia_resiliency_ext.inprocess as inprocess
    import torch._dynamo  # DDP's construction imports these; here, not under the Wrapper's timeout
    import torch._inductor.custom_graph_pass

    warm = TinyGPT()
    loss_of(warm, batch_for(sample_ids(1, rank, world))).backward()
    torch.optim.AdamW(warm.parameters()).step()

    os.environ.update(
        {"RANK": str(rank), "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    )
    os.environ.setdefault("LOCAL_RANK", str(rank))
    marks: dict[str, float] = {}
    notes: list[str] = []

    def train(call_wrapper=None):  # type: ignore[no-untyped-def]  # unannotated: the Wrapper reads annotations
        iteration = call_wrapper.iteration
        if dist.is_initialized():
            dist.destroy_process_group()
        store = dist.TCPStore("127.0.0.1", port + 2 + iteration, world, rank == 0, timeout=timedelta(seconds=60))
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timedelta(seconds=10))
        model = torch.nn.parallel.DistributedDataParallel(TinyGPT())
        optim = torch.optim.AdamW(model.parameters())
        for step in range(1, HANG_STEP + 3):
            if iteration == 0 and rank == 1 and step == HANG_STEP:
                marks["hung_at"] = time.time()
                try:
                    while True:  # hung: Python runs (so an async exception can land), no progress is reported
                        time.sleep(0.05)
                except BaseException as exc:  # the Wrapper's interruption: when it came, and which
                    marks["noticed_after"] = time.time() - marks["hung_at"]
                    notes.append(f"{type(exc).__name__}: {exc}")
                    raise
            if iteration > 3:
                raise SystemExit(f"gave up after {iteration} in-process restarts")
            loss = loss_of(model, batch_for(sample_ids(step, rank, world)))
            optim.zero_grad()
            loss.backward()
            optim.step()
            call_wrapper.ping()
            if iteration > 0 and "first_step_after" not in marks:
                marks["first_step_after"] = time.time()
        return iteration

    # The Wrapper passes itself to the parameter annotated CallWrapper, read as an object (not a string).
    train.__annotations__["call_wrapper"] = typing.Optional[inprocess.CallWrapper]  # noqa: UP045
    try:
        wrapped = inprocess.Wrapper(
            store_kwargs={"port": port + 1},
            health_check=None,
            soft_timeout=timedelta(seconds=10),
            hard_timeout=timedelta(seconds=20),
            monitor_thread_interval=timedelta(seconds=0.5),
            monitor_process_interval=timedelta(seconds=0.5),
            progress_watchdog_interval=timedelta(seconds=0.5),
            last_call_wait=timedelta(seconds=0.5),
        )(train)
        iteration = wrapped()
        if rank == 1 and "first_step_after" in marks:
            queue.put(
                (
                    rank,
                    f"hang: restarted in process (iteration {iteration}), first step "
                    f"{marks['first_step_after'] - marks['hung_at']:.2f} s after the hang began",
                )
            )
        else:
            queue.put((rank, f"hang: finished iteration {iteration}"))
    except BaseException as exc:
        noticed = (
            f"noticed {marks['noticed_after']:.2f} s after the hang began ({notes[0]}); then "
            if "noticed_after" in marks
            else ""
        )
        queue.put((rank, f"hang: {noticed}{_where(exc)}"))


HANG_STEP = 3


def probe_hang() -> list[str]:
    return _run_ranks(_hang_rank, 180, "hang: a rank said nothing within 180 s")


def probe_local_checkpoint() -> str:
    try:
        from nvidia_resiliency_ext.checkpointing.local.basic_state_dict import BasicTensorAwareStateDict
        from nvidia_resiliency_ext.checkpointing.local.ckpt_managers.local_manager import LocalCheckpointManager

        os.environ.update({"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"})
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])
        dist.init_process_group("gloo", rank=0, world_size=1)
        with tempfile.TemporaryDirectory() as tmp:
            manager = LocalCheckpointManager(tmp)
            state = BasicTensorAwareStateDict({"model": TinyGPT().state_dict()})
            manager.save(state, 1, is_async=False)
            return "local checkpoint manager: saved step 1"
    except BaseException as exc:
        return "local checkpoint manager: " + _where(exc)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    print(f"torch {torch.__version__}, cuda available: {torch.cuda.is_available()}")
    for line in probe_inprocess():
        print(line)
    for line in probe_hang():
        print(line)
    print(probe_local_checkpoint())
