"""The actor: GRPO on the tiny policy, with DDP over its own world (gloo on CPU, NCCL on GPUs).

A torchrun-style script (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) that also reads the data-plane
contract (stalwart.rlhf.contract: STALWART_JOB, STALWART_ETCD, STALWART_DATAPLANE). Each step:

1. the prompts of the step come from the deterministic data loader (the global batch at the loader's
   position); rank 0 asks the relay for the next steps' prompts ahead of time (look-ahead);
2. each rank takes its share of the step's groups from the relay once generated, scored and
   referenced (it waits for them);
3. GRPO: advantages relative to each prompt's group, a clipped ratio against the rollout's
   log-probabilities, a KL penalty against the reference; DDP averages the gradients;
4. rank 0 writes the step to the ledger and publishes the new weights; every rank moves the relay's
   watermark (and says who the actor is to a relay that restarted: any rank may reach it first).

Checkpoints (stalwart.checkpoint) hold the model, the optimizer, the RNG, the loader's position and
the relay cursor (watermark and lineage), so a restarted actor resumes exactly: each prompt of an
epoch is trained on once, whatever failed (checked by `python -m stalwart.rlhf.ledger LEDGER`).
"""

from __future__ import annotations

import argparse
import math
import os
import time
import uuid
from pathlib import Path
from typing import Any

import task
import torch
import torch.distributed as dist
from policy import answer_logprobs, build_policy
from torch.nn.parallel import DistributedDataParallel as DDP

from stalwart import logs
from stalwart.agents.worker_sdk import report_save, report_step
from stalwart.checkpoint import Checkpointer, NoCheckpoint, RetentionPolicy, RNGState, TrainState, open_storage
from stalwart.dataloader import DeterministicLoader
from stalwart.rlhf.contract import DataPlaneContext
from stalwart.rlhf.cursor import RelayCursor
from stalwart.rlhf.ledger import CheckpointRecord, FinishRecord, Ledger, StartRecord, StepRecord
from stalwart.rlhf.lineage import WeightVersion
from stalwart.rlhf.messages import Group, PromptItem
from stalwart.rlhf.relay_client import RelayClient
from stalwart.rlhf.weights import WeightPublisher


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--prompts-per-step", type=int, default=16, help="prompts per step, all ranks together")
    parser.add_argument("--group", type=int, default=8, help="samples per prompt (GRPO's group)")
    parser.add_argument("--lr", type=float, default=6e-3)
    parser.add_argument("--kl", type=float, default=0.02, help="weight of the KL penalty against the reference")
    parser.add_argument("--clip", type=float, default=0.2, help="PPO clip range of the importance ratio")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--prompts", type=Path, default=None, help="prompt shard (default: data/rlhf-prompts.stok in the run folder)"
    )
    parser.add_argument("--num-prompts", type=int, default=8192, help="prompts in the shard (one epoch)")
    parser.add_argument(
        "--ledger",
        type=Path,
        default=None,
        help="default: ledger/actor.jsonl in the run folder (beside the checkpoints)",
    )
    parser.add_argument("--checkpoint-interval", type=int, default=None, help="default: the job's, else 10")
    parser.add_argument("--step-delay", type=float, default=0.0, help="extra seconds per step (demos)")
    parser.add_argument(
        "--hold-file",
        type=Path,
        default=None,
        help="demos and tests: train up to the step this file names, then wait for a larger one "
        "(no file: run free), so a fault can be injected at a known step without racing the run",
    )
    args = parser.parse_args()
    # Under `stalwart run` the checkpoints live in the run folder: the ledger and the prompts go there
    # too, so that two runs never share (or append to) one ledger.
    uri = os.environ.get("STALWART_CHECKPOINT_URI", "")
    run_dir = Path(uri).parent if uri and "://" not in uri else Path(".")
    args.ledger = args.ledger or run_dir / "ledger" / "actor.jsonl"
    args.prompts = (args.prompts or run_dir / "data" / "rlhf-prompts.stok").resolve()  # named from anywhere
    return args


def main() -> None:
    args = parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.prompts_per_step % world:
        raise SystemExit(f"--prompts-per-step {args.prompts_per_step} must divide among {world} ranks")
    ctx = DataPlaneContext.from_env()
    if ctx.settings.relay_capacity < args.prompts_per_step:
        raise SystemExit(
            f"dataPlane.relayCapacity {ctx.settings.relay_capacity} cannot hold one step's "
            f"{args.prompts_per_step} prompts: raise it, or lower --prompts-per-step"
        )
    log = logs.get_logger("rlhf.actor", job=ctx.job, role="actor", rank=rank)
    logs.configure()
    task.write_prompts(args.prompts, args.num_prompts, args.seed)
    config = task.data_config(args.prompts, args.seed)
    loader = DeterministicLoader(config, dp_rank=0, dp_size=1, micro_batch=args.prompts_per_step)
    torch.manual_seed(args.seed)
    model = DDP(build_policy(args.seed))
    optim = torch.optim.AdamW(model.parameters(), lr=args.lr)
    cursor = RelayCursor()
    interval = args.checkpoint_interval or int(os.environ.get("STALWART_CHECKPOINT_INTERVAL", "10"))
    ckpt = Checkpointer(
        [open_storage(os.environ.get("STALWART_CHECKPOINT_URI", "checkpoints/rlhf-actor"))],
        retention=RetentionPolicy(keep_last=int(os.environ.get("STALWART_CHECKPOINT_KEEP", "3"))),
    )
    state = {"train": TrainState(model, optim), "rng": RNGState(), "prompts": loader, "relay": cursor}
    try:
        start = ckpt.load(state, fallback=True)  # the newest usable checkpoint
    except NoCheckpoint:
        start = 0
    if loader.position != start * args.prompts_per_step:
        raise SystemExit(f"checkpoint of step {start} holds loader position {loader.position}: another batch size?")
    incarnation = [uuid.uuid4().hex[:12] if rank == 0 else ""]
    dist.broadcast_object_list(incarnation, src=0)
    cursor.lineage = cursor.lineage.extend(incarnation[0], start)
    cursor.watermark = loader.position
    log = log.bind(incarnation=incarnation[0])

    relay = RelayClient(ctx, f"actor-{rank}", incarnation=incarnation[0])
    publisher = ledger = None
    if rank == 0:
        ledger = Ledger(args.ledger)
        ledger.write(
            StartRecord(
                incarnation=incarnation[0], base_step=start, prompts_per_step=args.prompts_per_step, data=config
            )
        )
        publisher = WeightPublisher(ctx).start()
        publisher.publish(WeightVersion(incarnation=incarnation[0], step=start), model.module.state_dict())
    relay.resume(cursor.lineage, cursor.watermark)  # every rank: any may be first at a new relay
    dist.barrier()  # no rank takes before the relay knows this incarnation
    log.info("actor started", fields={"resumed_from": start, "steps": args.steps, "world": world})

    lookahead = max(1, ctx.settings.relay_capacity // args.prompts_per_step - 1)
    share = args.prompts_per_step // world
    pending = None
    for step in range(start + 1, args.steps + 1):
        hold(args.hold_file, step, log)
        t0 = time.perf_counter()
        items = prompt_items(loader, step, loader.position)
        if rank == 0:  # look-ahead: the next steps' prompts start through the stages now
            ahead = [
                item
                for s in range(step + 1, min(step + lookahead, args.steps) + 1)
                for item in prompt_items(loader, s, loader.position + (s - step) * args.prompts_per_step)
            ]
            if ahead:
                relay.demand(ahead)
        mine = items[rank * share : (rank + 1) * share]
        groups = relay.take(mine, on_wait=lambda r: log.info("waiting for groups", fields={"at": r.waiting}))
        t_data = time.perf_counter()
        check_groups(groups, mine, args.group, cursor, step, ctx.settings.max_weight_staleness)
        loss, reward_sum, kl_sum = grpo_loss(model, groups, args.kl, args.clip)
        if not math.isfinite(loss.item()):
            raise FloatingPointError(f"the GRPO loss is {loss.item()} at step {step}")
        optim.zero_grad(set_to_none=True)
        loss.backward()
        optim.step()
        loader.position += args.prompts_per_step
        cursor.watermark = loader.position
        mine_stats = ([g.prompt.sample_id for g in groups], reward_sum, kl_sum, [g.version.step for g in groups])
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, mine_stats)
        if args.step_delay:
            time.sleep(args.step_delay)
        samples = args.prompts_per_step * args.group
        mean_reward = sum(g[1] for g in gathered) / samples
        if rank == 0:
            assert ledger is not None and publisher is not None
            ledger.write(
                StepRecord(
                    incarnation=incarnation[0],
                    step=step,
                    position=items[0].position,
                    sample_ids=[sid for g in gathered for sid in g[0]],
                    reward=mean_reward,
                    kl=sum(g[2] for g in gathered) / samples,
                    versions=sorted({v for g in gathered for v in g[3]}),
                )
            )
            publisher.publish(WeightVersion(incarnation=incarnation[0], step=step), model.module.state_dict())
        relay.advance(cursor.watermark)  # every rank, so each can tell a new relay where the actor is
        step_time = time.perf_counter() - t0
        # No loss: a policy-gradient loss hovers around zero and changes sign, so the loss-spike
        # detector would read noise as spikes (the NaN check is above).
        report_step(step, tokens=share * args.group * task.DIGITS, step_time=step_time)
        if rank == 0 and (step % 10 == 0 or step == start + 1):
            log.info(
                "step",
                fields={
                    "step": step,
                    "reward": round(mean_reward, 4),
                    "waited": round(t_data - t0, 3),
                    "step_time": round(step_time, 3),
                },
            )
        if pending is not None and pending.done():
            pending = committed(pending.wait(), ledger, incarnation[0], log)
        if step % interval == 0 or step == args.steps:
            if pending is not None:
                pending = committed(pending.wait(), ledger, incarnation[0], log)
            pending = ckpt.save(state, step)

    if pending is not None:
        committed(pending.wait(), ledger, incarnation[0], log)
    dist.barrier()
    if rank == 0:
        assert ledger is not None and publisher is not None
        ledger.write(FinishRecord(incarnation=incarnation[0], step=args.steps))
        relay.finish()
        publisher.close()
        ledger.close()
    relay.close()
    ckpt.close()
    loader.close()
    dist.barrier()
    dist.destroy_process_group()


def hold(path: Path | None, step: int, log: logs.ContextLogger, limit_seconds: float = 3600.0) -> None:
    """Wait before `step` while the hold file names an earlier step (see --hold-file)."""
    deadline = time.monotonic() + limit_seconds
    said = False
    while path is not None and time.monotonic() < deadline:
        try:
            until = int(path.read_text().strip())
        except (FileNotFoundError, ValueError):
            return
        if step <= until:
            return
        if not said:
            log.info("holding", fields={"before_step": step, "until": until, "file": str(path)})
            said = True
        time.sleep(0.05)


def prompt_items(loader: DeterministicLoader, step: int, position: int) -> list[PromptItem]:
    batch = loader.batch_at(position)
    return [
        PromptItem(
            sample_id=int(batch.sample_ids[i]),
            position=position + i,
            step=step,
            tokens=batch.tokens[i, : task.PROMPT_LEN].tolist(),
        )
        for i in range(batch.micro_batch)
    ]


def check_groups(
    groups: list[Group], items: list[PromptItem], group_size: int, cursor: RelayCursor, step: int, staleness: int
) -> None:
    """The relay promised these; a broken promise must stop training, not bend it."""
    for group, item in zip(groups, items, strict=True):
        if group.prompt != item:
            raise RuntimeError(f"the relay gave sample {group.prompt.sample_id} for sample {item.sample_id}")
        if len(group.samples) != group_size or group.rewards is None or group.ref_logprobs is None:
            raise RuntimeError(f"the group of sample {item.sample_id} is incomplete")
        if not cursor.lineage.valid(group.version) or group.version.step < step - 1 - staleness:
            raise RuntimeError(f"the group of sample {item.sample_id} was made with weights {group.version}")


def grpo_loss(
    model: torch.nn.Module, groups: list[Group], kl_coef: float, clip: float
) -> tuple[torch.Tensor, float, float]:
    """GRPO: each sample's advantage is its reward against its group's; clipped ratio; k3 KL to the reference."""
    prompts, answers, old, ref, rewards = [], [], [], [], []
    for group in groups:
        for i, sample in enumerate(group.samples):
            prompts.append(group.prompt.tokens)
            answers.append(sample.tokens)
            old.append(sample.logprobs)
            ref.append(group.ref_logprobs[i])  # type: ignore[index]
        rewards.append(group.rewards)
    r = torch.tensor(rewards)
    advantages = ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-4)).reshape(-1, 1)
    logp = answer_logprobs(model, torch.tensor(prompts), torch.tensor(answers))
    ratio = torch.exp(logp - torch.tensor(old))
    surrogate = torch.minimum(ratio * advantages, ratio.clamp(1 - clip, 1 + clip) * advantages)
    delta = torch.tensor(ref) - logp
    kl = torch.exp(delta) - delta - 1
    loss = (-surrogate + kl_coef * kl).mean()
    return loss, float(r.sum()), float(kl.detach().mean(1).sum())


def committed(result: Any, ledger: Ledger | None, incarnation: str, log: logs.ContextLogger) -> None:
    """A committed checkpoint goes to the ledger and the agent; a failed one is logged (the last one stands)."""
    if result.committed:
        report_save(result)  # the engine's result: the job's catalog gets its tiers, size and location
        if ledger is not None:
            ledger.write(CheckpointRecord(incarnation=incarnation, step=result.step))
    elif ledger is not None:
        log.warning("checkpoint failed", fields={"step": result.step, "error": str(result.error)})
    return None


if __name__ == "__main__":
    main()
