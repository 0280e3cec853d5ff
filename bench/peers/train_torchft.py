"""torchft's recommended loop (its train_ddp example): each replica group has a Manager that joins
the lighthouse's quorum every step; a failed group is restarted (here by its `torchrun
--max-restarts`, or the harness for a lost node) and recovers the live state from a healthy peer
while the other groups keep training. No periodic checkpoint: recovery reads a peer's memory.

Replica group `REPLICA_GROUP_ID` of `NUM_REPLICA_GROUPS` trains the data shard of that index; the
quorum is synchronous (use_async_quorum=False) so the step a sample id belongs to is known before
the forward pass, which the audit needs."""

import os
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torchft import DistributedDataParallel, Manager, Optimizer, ProcessGroupGloo

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import Audit, TinyGPT, batch_for, loss_of, parse_args, sample_ids


class FaultTolerantDDP(DistributedDataParallel):
    """torchft's DDP whose comm hook also accepts the Manager's `_DummyWork` (an errored step). No
    `from __future__ import annotations` here: DDP checks the hook's return annotation at runtime."""

    @staticmethod
    def _comm_hook(state: Manager, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        work = state.allreduce(bucket.buffer())
        work.wait()
        if state.errored() is not None:  # this step will not commit: hand DDP a finished future
            done: torch.futures.Future[torch.Tensor] = torch.futures.Future()
            done.set_result(bucket.buffer())
            return done
        fut = work.get_future()
        inner = getattr(fut, "_fut", None)  # a _ManagedFuture's own future, as torchft's hook returns
        return inner if inner is not None else fut  # type: ignore[return-value]


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    group = int(os.environ["REPLICA_GROUP_ID"])
    groups = int(os.environ["NUM_REPLICA_GROUPS"])
    torch.manual_seed(0)
    model = TinyGPT()
    inner = torch.optim.AdamW(model.parameters(), lr=args.lr)

    def load_state_dict(state: dict[str, Any]) -> None:
        model.load_state_dict(state["model"])
        inner.load_state_dict(state["optim"])

    def state_dict() -> dict[str, Any]:
        return {"model": model.state_dict(), "optim": inner.state_dict()}

    manager = Manager(
        pg=ProcessGroupGloo(timeout=timedelta(seconds=5)),
        min_replica_size=1,
        load_state_dict=load_state_dict,
        state_dict=state_dict,
        replica_id=f"peers_{group}",
        timeout=timedelta(seconds=30),  # train_ddp.py's; lower, a restarted group's first quorum times out
        use_async_quorum=False,
    )
    ddp = FaultTolerantDDP(manager, model)
    optim = Optimizer(manager, inner)
    audit = Audit(args.out, group)
    while manager.current_step() < args.steps:
        optim.zero_grad()  # the quorum, and a recovery from a peer when this group is behind
        step = manager.current_step() + 1
        ids = sample_ids(step, group, groups)
        loss = loss_of(ddp, batch_for(ids))
        loss.backward()  # gradients averaged across the quorum's groups
        optim.step()  # applied only when every participant commits
        time.sleep(args.step_delay)
        if manager.current_step() == step:
            audit.step(step, ids)
    audit.close()
    manager.shutdown()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
