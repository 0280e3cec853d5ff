"""The reward worker: scores each answer with the task's rule (task.reward), no model involved.

Torchrun-style (RANK names the worker; workers share nothing). It leases generated groups from the
relay, scores every sample, and submits the rewards.
"""

from __future__ import annotations

import argparse
import os

import task

from stalwart import logs
from stalwart.agents.worker_sdk import report_work
from stalwart.rlhf.contract import DataPlaneContext
from stalwart.rlhf.messages import Group, Stage
from stalwart.rlhf.relay_client import RelayClient


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups-per-lease", type=int, default=16)
    args = parser.parse_args()
    rank = int(os.environ.get("RANK", "0"))
    ctx = DataPlaneContext.from_env()
    logs.configure()
    log = logs.get_logger("rlhf.reward", job=ctx.job, role="reward", rank=rank)
    relay = RelayClient(ctx, f"reward-{rank}")

    def score(groups: list[Group]) -> list[Group]:
        report_work(len(groups))
        return [
            Group(**{**g.model_dump(), "rewards": [task.reward(g.prompt.tokens, s.tokens) for s in g.samples]})
            for g in groups
        ]

    scored = relay.serve(Stage.REWARD, args.groups_per_lease, score)
    log.info("reward done", fields={"groups": scored})
    relay.close()


if __name__ == "__main__":
    main()
