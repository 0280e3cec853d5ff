"""One rank of a Megatron-style TP x PP x DP training step on CPU (gloo), with faults to inject.

Run by capture.py as N real processes (torchrun environment: RANK, WORLD_SIZE, MASTER_ADDR, ...).
The function names follow Megatron-core's (forward_step, backward_step, recv_forward,
send_backward, reduce_from_tensor_model_parallel_region, finalize_model_grads, ...), so the stacks
captured from these ranks read like a real Megatron job's. The rank order is Megatron's default
(tp fastest, then dp, then pp). Each step writes one JSON line of timings to --out/metrics-rank-R.jsonl
and the last finished step to --out/progress-rank-R.

Faults (--fault, at --fault-rank, one rank or several separated by commas, from --fault-step on):
  sleep-forward    hang: the rank stalls in user code inside forward_step, before its TP all-reduce
  sleep-data       hang: the rank stalls in its data iterator (get_batch), before the step starts
  sleep-optimizer  hang: the rank stalls before the data-parallel gradient all-reduce
  recv             hang: the rank posts one receive too many (a message that never comes)
  slow             slowdown: the rank sleeps --slow-ms inside forward compute every step
  slow-data        slowdown: the rank's data iterator (get_batch) takes --slow-ms longer every micro-batch
  slow-optimizer   slowdown: the rank's optimizer step takes --slow-ms longer, before its grad-norm all-reduce
  exception        every rank hits the same user-code bug (its learning-rate schedule is too short)
  exception-loss   the last stage's ranks hit a user-code bug in the loss (a shape mismatch in torch)
  exception-one    only --fault-rank raises (a KeyError in its data pipeline)
  nan              the batch holds an inf: the loss is NaN on every rank, which raises
  disk-full        the rank writes its checkpoint shard to /dev/full (ENOSPC)
  segfault         the rank dereferences NULL through ctypes (SIGSEGV)
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import math
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

HIDDEN = 64
MICRO_BATCHES = 2
HANG_LIMIT_S = 600.0  # an injected hang ends by itself after this: nothing runs forever


class Args(argparse.Namespace):
    tp: int
    pp: int
    dp: int
    steps: int
    fault: str
    fault_rank: str
    fault_step: int
    slow_ms: float
    out: Path
    timeout: float
    sdk: bool
    work: int


class Parallel:
    """This rank's coordinates and process groups (Megatron's order: tp fastest, then dp, then pp)."""

    def __init__(self, tp: int, pp: int, dp: int) -> None:
        self.rank = dist.get_rank()
        self.tp_size, self.pp_size, self.dp_size = tp, pp, dp
        self.tp_rank = self.rank % tp
        self.dp_rank = (self.rank // tp) % dp
        self.pp_rank = self.rank // (tp * dp)
        self.tp_group = self.dp_group = self.mp_group = None
        for p in range(pp):  # every rank creates every group, in the same order
            for d in range(dp):
                ranks = [self.to_rank(t, d, p) for t in range(tp)]
                g = dist.new_group(ranks)
                if self.rank in ranks:
                    self.tp_group = g
        for p in range(pp):
            for t in range(tp):
                ranks = [self.to_rank(t, d, p) for d in range(dp)]
                g = dist.new_group(ranks)
                if self.rank in ranks:
                    self.dp_group = g
        for d in range(dp):
            ranks = [self.to_rank(t, d, p) for p in range(pp) for t in range(tp)]
            g = dist.new_group(ranks)
            if self.rank in ranks:
                self.mp_group = g

    def to_rank(self, t: int, d: int, p: int) -> int:
        return t + self.tp_size * (d + self.dp_size * p)

    @property
    def first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def last_stage(self) -> bool:
        return self.pp_rank == self.pp_size - 1

    @property
    def prev_rank(self) -> int:
        return self.to_rank(self.tp_rank, self.dp_rank, self.pp_rank - 1)

    @property
    def next_rank(self) -> int:
        return self.to_rank(self.tp_rank, self.dp_rank, self.pp_rank + 1)


# ------------------------------------------------------------------------------------------ faults
class Fault:
    def __init__(self, args: Args, par: Parallel) -> None:
        self.kind = args.fault
        self.mine = par.rank in {int(r) for r in str(args.fault_rank).split(",") if r.strip()}
        self.step_from = args.fault_step
        self.slow_s = args.slow_ms / 1000.0
        self.step = 0

    def active(self, kind: str, everyone: bool = False) -> bool:
        return self.kind == kind and (self.mine or everyone) and self.step >= self.step_from


def injected_hang() -> None:
    """Where a stalled rank waits: in user code, as a rank stuck on a lock or a dead data source."""
    deadline = time.monotonic() + HANG_LIMIT_S
    while time.monotonic() < deadline:
        time.sleep(0.05)


# ------------------------------------------------------------------------------------ tp mappings
def _reduce(x: torch.Tensor, par: Parallel) -> torch.Tensor:
    if par.tp_size > 1:
        dist.all_reduce(x, group=par.tp_group)
    return x


def reduce_from_tensor_model_parallel_region(x: torch.Tensor, par: Parallel) -> torch.Tensor:
    return _reduce(x, par)


def reduce_grad_from_tensor_model_parallel_region(g: torch.Tensor, par: Parallel) -> torch.Tensor:
    return _reduce(g, par)


# ---------------------------------------------------------------------------------- p2p (pipeline)
def _communicate(tensor: torch.Tensor | None, peer: int, recv: bool) -> torch.Tensor:
    if recv:
        buf = torch.empty(HIDDEN, HIDDEN)
        dist.recv(buf, src=peer)
        return buf
    assert tensor is not None
    dist.send(tensor.contiguous(), dst=peer)
    return tensor


def recv_forward(par: Parallel) -> torch.Tensor:
    return _communicate(None, par.prev_rank, recv=True)


def send_forward(y: torch.Tensor, par: Parallel) -> None:
    _communicate(y, par.next_rank, recv=False)


def recv_backward(par: Parallel) -> torch.Tensor:
    return _communicate(None, par.next_rank, recv=True)


def send_backward(g: torch.Tensor, par: Parallel) -> None:
    _communicate(g, par.prev_rank, recv=False)


# ------------------------------------------------------------------------------------------- model
class StageModel:
    """A row-parallel linear layer and a tanh: the TP shard of one pipeline stage."""

    def __init__(self, par: Parallel, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed + par.rank)
        self.weight = torch.randn(HIDDEN, HIDDEN, generator=g) / math.sqrt(HIDDEN)
        self.grad = torch.zeros_like(self.weight)
        self.saved: list[tuple[torch.Tensor, torch.Tensor]] = []


def forward_compute(model: StageModel, x: torch.Tensor, fault: Fault) -> torch.Tensor:
    if fault.active("slow"):
        time.sleep(fault.slow_s)  # a slow GPU: the kernels take longer
    if Work.matmuls:  # real CPU-bound work, so that a CPU-throttled rank falls behind
        a = torch.ones(Work.size, Work.size)
        for _ in range(Work.matmuls):
            a = torch.tanh(a @ a / Work.size)
        x = x + a[:HIDDEN, :HIDDEN] * 0.0
    return x @ model.weight


class Work:
    """Extra compute per forward (--work N: N matmuls of 256 x 256); 0 keeps the step communication-bound."""

    matmuls = 0
    size = 256


class Timer:
    """Wall time spent computing (not communicating) in the current step: a per-rank metric."""

    compute_s = 0.0
    data_s = 0.0  # in get_batch
    optimizer_s = 0.0  # in the optimizer step, its grad-norm all-reduce left out


def forward_step(model: StageModel, x: torch.Tensor, par: Parallel, fault: Fault) -> torch.Tensor:
    t0 = time.perf_counter()
    y = forward_compute(model, x, fault)
    Timer.compute_s += time.perf_counter() - t0
    if fault.active("sleep-forward"):
        injected_hang()
    y = reduce_from_tensor_model_parallel_region(y, par)
    out = torch.tanh(y)
    model.saved.append((x, out))
    return out


def backward_step(model: StageModel, g: torch.Tensor, par: Parallel) -> torch.Tensor:
    t0 = time.perf_counter()
    x, out = model.saved.pop()
    g = g * (1 - out * out)
    model.grad += x.t() @ g
    gx = g @ model.weight.t()
    Timer.compute_s += time.perf_counter() - t0
    return reduce_grad_from_tensor_model_parallel_region(gx, par)


def loss_func(out: torch.Tensor, fault: Fault) -> tuple[torch.Tensor, torch.Tensor]:
    if fault.active("exception-loss", everyone=True):
        target = torch.zeros(HIDDEN, HIDDEN // 2)  # the user's bug: labels of the wrong width
        loss = torch.nn.functional.mse_loss(out @ target.t(), target)
    loss = (out * out).mean()
    return loss, 2 * out / out.numel()


# ---------------------------------------------------------------------------------------- schedule
def get_batch(step: int, micro: int, par: Parallel, fault: Fault) -> torch.Tensor:
    t0 = time.perf_counter()
    try:
        return _next_sample(step, micro, par, fault)
    finally:
        Timer.data_s += time.perf_counter() - t0


def _next_sample(step: int, micro: int, par: Parallel, fault: Fault) -> torch.Tensor:
    if fault.active("sleep-data"):
        injected_hang()
    if fault.active("slow-data"):
        time.sleep(fault.slow_s)  # a slow filesystem or a starved loader
    if fault.active("exception-one"):
        shards: dict[str, str] = {}
        return shards[f"shard-{step}-{micro}"]  # type: ignore[return-value]
    g = torch.Generator().manual_seed(1000 * step + micro + 7 * par.dp_rank)
    x = torch.randn(HIDDEN, HIDDEN, generator=g)
    if fault.active("nan", everyone=True):
        x[0, 0] = float("inf")  # a corrupt sample: inf - inf in tanh's gradient makes the loss NaN
        x[0, 1] = float("-inf")
    return x


def forward_backward_pipelining(step: int, model: StageModel, par: Parallel, fault: Fault) -> float:
    """GPipe order: every micro-batch forward, then every one backward (blocking p2p, no deadlock)."""
    losses: list[torch.Tensor] = []
    grads: list[torch.Tensor] = []
    for micro in range(MICRO_BATCHES):
        x = get_batch(step, micro, par, fault) if par.first_stage else recv_forward(par)
        if fault.active("recv") and micro == MICRO_BATCHES - 1 and not par.first_stage:
            recv_forward(par)  # the extra receive: it waits for a message that is never sent
        out = forward_step(model, x, par, fault)
        if par.last_stage:
            loss, g = loss_func(out, fault)
            losses.append(loss)
            grads.append(g)
        else:
            send_forward(out, par)
    for _micro in range(MICRO_BATCHES):
        if fault.active("recv") and par.first_stage and _micro == 0:
            recv_backward(par)  # stage 0 has no forward receive: it posts an extra backward one
        g = grads.pop() if par.last_stage else recv_backward(par)
        gx = backward_step(model, g, par)
        if not par.first_stage:
            send_backward(gx, par)
    return float(sum(losses) / MICRO_BATCHES) if losses else 0.0


def all_reduce_data_parallel_grads(model: StageModel, par: Parallel) -> None:
    if par.dp_size > 1:
        dist.all_reduce(model.grad, group=par.dp_group)
        model.grad /= par.dp_size


def finalize_model_grads(model: StageModel, par: Parallel, fault: Fault) -> None:
    if fault.active("sleep-optimizer"):
        injected_hang()
    all_reduce_data_parallel_grads(model, par)


def get_grad_norm(model: StageModel, par: Parallel) -> float:
    sq = (model.grad * model.grad).sum().reshape(1)
    dist.all_reduce(sq, group=par.mp_group)
    return float(sq.sqrt())


def clip_grads_prepare(fault: Fault) -> None:
    if fault.active("slow-optimizer"):
        time.sleep(fault.slow_s)  # an offloaded optimizer on a busy CPU


def optimizer_step(model: StageModel, par: Parallel, lr: float, fault: Fault) -> float:
    t0 = time.perf_counter()
    clip_grads_prepare(fault)
    t1 = time.perf_counter()
    norm = get_grad_norm(model, par)
    t2 = time.perf_counter()
    scale = min(1.0, 1.0 / (norm + 1e-6))
    model.weight -= lr * scale * model.grad
    model.grad.zero_()
    Timer.optimizer_s += (t1 - t0) + (time.perf_counter() - t2)
    return norm


def save_checkpoint(model: StageModel, step: int, fault: Fault) -> None:
    """The checkpoint shard of a rank; the disk-full fault points it at /dev/full."""
    if fault.active("disk-full"):
        with open("/dev/full", "wb") as f:
            torch.save(model.weight, f)
            f.flush()


def report_loss(loss: float, par: Parallel) -> float:
    """The last stage's loss, shared with every rank (as Megatron logs it); NaN raises everywhere."""
    t = torch.tensor([loss if par.last_stage else 0.0])
    dist.all_reduce(t)
    value = float(t.item()) / (par.tp_size * par.dp_size)
    if not math.isfinite(value):
        raise FloatingPointError(f"loss is {value} at step {par_step}")
    return value


par_step = 0


def get_learning_rate(step: int, fault: Fault) -> float:
    """A warm-up schedule; the exception fault makes it too short, as a wrong config would."""
    schedule = [1e-3 * min(1.0, (s + 1) / 10) for s in range(1_000)]
    if fault.active("exception", everyone=True):
        schedule = schedule[: fault.step_from - 1]
    return schedule[step - 1]


def train_step(step: int, model: StageModel, par: Parallel, fault: Fault) -> dict[str, float]:
    t0 = time.perf_counter()
    c0 = time.process_time()
    Timer.compute_s = Timer.data_s = Timer.optimizer_s = 0.0
    lr = get_learning_rate(step, fault)
    loss = forward_backward_pipelining(step, model, par, fault)
    t1 = time.perf_counter()
    finalize_model_grads(model, par, fault)
    norm = optimizer_step(model, par, lr, fault)
    if fault.active("segfault"):
        ctypes.string_at(0)
    save_checkpoint(model, step, fault)
    loss = report_loss(loss, par)
    t2 = time.perf_counter()
    cpu = time.process_time() - c0
    return {
        "step": step,
        "step_time_s": t2 - t0,
        "pipeline_time_s": t1 - t0,
        "sync_time_s": t2 - t1,
        "compute_time_s": Timer.compute_s,
        "data_time_s": Timer.data_s,
        "optimizer_time_s": Timer.optimizer_s,
        "cpu_percent": 100.0 * cpu / max(t2 - t0, 1e-9),
        "loss": loss,
        "grad_norm": norm,
    }


def main() -> None:
    global par_step
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--pp", type=int, default=2)
    p.add_argument("--dp", type=int, default=2)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--fault", default="none")
    p.add_argument("--fault-rank", default="-1", help="rank, or ranks separated by commas")
    p.add_argument("--fault-step", type=int, default=5)
    p.add_argument("--slow-ms", type=float, default=50.0)
    p.add_argument("--work", type=int, default=0, help="extra 256x256 matmuls per forward (CPU-bound compute)")
    p.add_argument("--timeout", type=float, default=600.0, help="gloo timeout, seconds")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--sdk", action="store_true", help="install the worker SDK (faulthandler dumps on SIGUSR1)")
    args = p.parse_args(namespace=Args())
    if args.sdk:
        from stalwart.agents.worker_sdk import install

        install()
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout))
    assert dist.get_world_size() == args.tp * args.pp * args.dp, "WORLD_SIZE must be tp*pp*dp"
    par = Parallel(args.tp, args.pp, args.dp)
    torch.set_num_threads(1)
    fault = Fault(args, par)
    Work.matmuls = args.work
    model = StageModel(par)
    args.out.mkdir(parents=True, exist_ok=True)
    progress = args.out / f"progress-rank-{par.rank}"
    with open(args.out / f"metrics-rank-{par.rank}.jsonl", "w") as metrics:
        for step in range(1, args.steps + 1):
            fault.step = par_step = step
            row = train_step(step, model, par, fault)
            metrics.write(json.dumps({"rank": par.rank, "at": time.time(), **row}) + "\n")
            metrics.flush()
            progress.write_text(str(step))
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {par.rank} done", file=sys.stderr)


if __name__ == "__main__":
    main()
