"""A rollout worker: generates a group of answers per prompt with the newest weights it may use.

Torchrun-style (RANK names the worker; no process group: rollout workers share nothing, so one can
die and come back while the others go on). It leases prompts from the relay, only those its weights
are fresh enough for (maxWeightStaleness), fetches newer weights between generations (whole
versions only, checked before use), and submits the groups with the log-probabilities it sampled.
"""

from __future__ import annotations

import argparse
import os

import torch
from policy import build_policy, generate

from stalwart import logs
from stalwart.agents.worker_sdk import report_work
from stalwart.rlhf.connection import ChannelFinished, DataPlaneUnavailable
from stalwart.rlhf.contract import DataPlaneContext
from stalwart.rlhf.messages import Group, Sample, Stage
from stalwart.rlhf.relay_client import RelayClient
from stalwart.rlhf.weights import WeightSubscriber, size_bound


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--group", type=int, default=8, help="samples per prompt (the actor's --group)")
    parser.add_argument("--groups-per-lease", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rank = int(os.environ.get("RANK", "0"))
    ctx = DataPlaneContext.from_env()
    logs.configure()
    log = logs.get_logger("rlhf.rollout", job=ctx.job, role="rollout", rank=rank)
    name = f"rollout-{rank}"
    policy = build_policy(args.seed).eval()
    weights = WeightSubscriber(ctx, name, max_bytes=size_bound(policy.state_dict()))
    relay = RelayClient(ctx, name)
    generator = torch.Generator().manual_seed(args.seed * 7919 + rank + os.getpid())
    generated = 0

    def refresh(wait: float, need: bool) -> bool:
        """Load a newer whole version if there is one; False once the actor has finished. Unless we
        `need` newer weights, an unreachable actor (restarting) is no reason to stop generating."""
        try:
            state = weights.fetch(wait=wait, patience=None if need else 0.0)
        except DataPlaneUnavailable:
            return True
        except ChannelFinished:
            return False
        if state is not None:
            policy.load_state_dict(state)  # between generations: never a half-loaded version
        return True

    while refresh(wait=0.0 if weights.version is not None else 5.0, need=weights.version is None):
        if weights.version is None:
            continue
        reply = relay.lease(Stage.ROLLOUT, args.groups_per_lease, have_version=weights.version)
        if reply.status == "done":
            break
        if reply.status == "need-newer-weights" and not refresh(wait=5.0, need=True):
            break
        if reply.status != "ok":
            continue  # "empty": nothing to do with these weights within the lease's wait
        report_work(len(reply.prompts))
        prompts = torch.tensor([p.tokens for p in reply.prompts])
        answers, logprobs = generate(policy, prompts, args.group, generator)
        groups = [
            Group(
                prompt=prompt,
                version=weights.version,
                samples=[
                    Sample(tokens=answers[k].tolist(), logprobs=logprobs[k].tolist())
                    for k in range(i * args.group, (i + 1) * args.group)
                ],
            )
            for i, prompt in enumerate(reply.prompts)
        ]
        result = relay.submit(Stage.ROLLOUT, reply.lease_id, groups)
        generated += result.accepted
        if result.stale_weights and not refresh(wait=5.0, need=True):
            break
    log.info("rollout done", fields={"groups": generated, "weights": str(weights.version)})
    relay.close()
    weights.close()


if __name__ == "__main__":
    main()
