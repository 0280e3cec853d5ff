"""The reference worker: the log-probabilities of each answer under the initial policy (the KL anchor).

Torchrun-style (RANK names the worker; workers share nothing). The reference policy is the actor's
starting point, built from the same seed; it never changes.
"""

from __future__ import annotations

import argparse
import os

import torch
from policy import answer_logprobs, build_policy

from stalwart import logs
from stalwart.agents.worker_sdk import report_work
from stalwart.rlhf.contract import DataPlaneContext
from stalwart.rlhf.messages import Group, Stage
from stalwart.rlhf.relay_client import RelayClient


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups-per-lease", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0, help="the actor's --seed: the reference is its initial policy")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rank = int(os.environ.get("RANK", "0"))
    ctx = DataPlaneContext.from_env()
    logs.configure()
    log = logs.get_logger("rlhf.reference", job=ctx.job, role="reference", rank=rank)
    reference = build_policy(args.seed).eval()
    relay = RelayClient(ctx, f"reference-{rank}")

    def anchor(groups: list[Group]) -> list[Group]:
        report_work(len(groups))
        prompts = torch.tensor([g.prompt.tokens for g in groups for _ in g.samples])
        answers = torch.tensor([s.tokens for g in groups for s in g.samples])
        with torch.no_grad():
            logp = answer_logprobs(reference, prompts, answers).tolist()
        out, k = [], 0
        for g in groups:
            out.append(Group(**{**g.model_dump(), "ref_logprobs": logp[k : k + len(g.samples)]}))
            k += len(g.samples)
        return out

    done = relay.serve(Stage.REFERENCE, args.groups_per_lease, anchor)
    log.info("reference done", fields={"groups": done})
    relay.close()


if __name__ == "__main__":
    main()
