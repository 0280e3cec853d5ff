"""The node's data plane: what outlives every restart of the workers, not the node.

- The shadow data loader (stalwart.dataloader): a process beside the workers that has the next
  batches ready; with a warm standby, pre-warmed to the last checkpoint's position when it is
  promoted.
- The host-memory checkpoint store: this node's checkpoint copies, and its peer's second copies.
  The peer is a node outside every parallel group of this node's ranks (stalwart.checkpoint.peers,
  fed by the job's Topology), so one failure domain never holds both copies of a shard.
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stalwart.checkpoint.memory_auth import TOKEN_ENV
from stalwart.handover import spawn_listening
from stalwart.logs import ContextLogger
from stalwart.processes import stop_process
from stalwart.spec import DataSettings, TrainingJob
from stalwart.spec.topology import Topology
from stalwart.store.records import Assignment, NodeAssignment

if TYPE_CHECKING:
    from stalwart.dataloader import DataConfig, ShadowLoaderSupervisor
    from stalwart.dataloader.shadow_supervisor import ForkLoader


class DataPlaneError(RuntimeError):
    """The data plane cannot start (no shards, a bad data section): the agent exits with it."""


def _absolute(path: str | None, job_dir: Path) -> str | None:
    return path if path is None or Path(path).is_absolute() else str(job_dir / path)


def data_config(settings: DataSettings, job_dir: Path) -> DataConfig:
    """The loader's config from the job spec, with shard paths made absolute (relative to the job file)."""
    from stalwart.dataloader import DataConfig, SourceSpec

    sources = []
    for src in settings.sources:
        patterns = [p if Path(p).is_absolute() else str(job_dir / p) for p in src.shards]
        if not any(glob.glob(p) for p in patterns):
            hint = {
                "stok": "build them with `stalwart data build OUT_DIR TEXT_FILES...`",
                "hf": "name your parquet, jsonl or arrow files",
                "megatron": "name your Megatron .bin files (their .idx beside them)",
            }[src.format]
            raise FileNotFoundError(
                f"data source {src.name!r}: no {src.format} files match {src.shards} (relative to {job_dir}); {hint}"
            )
        sources.append(
            SourceSpec(
                name=src.name,
                shards=patterns,
                format=src.format,
                tokenizer=_absolute(src.tokenizer, job_dir),
                text_field=src.text_field,
                eos_token=src.eos_token,
                index_dir=_absolute(src.index_dir, job_dir),
            )
        )
    return DataConfig(
        sources=sources,
        weights={s.name: s.weight for s in settings.sources},
        seq_len=settings.seq_len,
        seed=settings.seed,
    )


def start_shadow_loader(
    settings: DataSettings,
    job_dir: Path,
    job: str,
    node: str,
    lanes: int,
    log: Path | None = None,
    fork: ForkLoader | None = None,
) -> ShadowLoaderSupervisor:
    from stalwart.dataloader import ShadowLoaderSupervisor

    config = data_config(settings, job_dir)
    return ShadowLoaderSupervisor(
        config, job=job, node=node, lanes=lanes, max_micro_batch=settings.micro_batch, log_path=log, fork=fork
    ).start()


def memory_peer(node: str, topology: Topology) -> str | None:
    """Where this node's second checkpoint copy goes: a node outside every parallel group of its ranks
    (the next node in ring order when the layout leaves none)."""
    from stalwart.checkpoint.peers import choose_peers

    return choose_peers(topology.rank_nodes, topology.parallel_groups()).get(node)


# A worker's environment variable may hold at most 128 KiB (Linux's MAX_ARG_STRLEN); the list of
# every node's store is ~16 bytes a node, so past this many bytes it goes into a file beside the job.
NODES_INLINE_BYTES = 16 << 10


def memory_uri(
    node: str,
    job: str,
    assignment: Assignment,
    peer: str | None,
    memory: Mapping[str, str],
    spill_dir: Path | None = None,
) -> str | None:
    """This node's memory store, its `peer` (memory_peer: outside every parallel group of its ranks)
    for the second copy, and every node of the generation to read from after a node was replaced. `memory`: node
    -> its store ("address:port"), as the assignment carries them. A list longer than
    NODES_INLINE_BYTES is written to a file in `spill_dir` and named by `nodes_file=`."""
    stores = {n.node: store for n in assignment.nodes if (store := memory.get(n.node))}
    if node not in stores:
        return None
    query = [f"peer={stores[peer]}"] if peer is not None and peer in stores else []
    others = ",".join(stores[n] for n in sorted(stores) if n != node)
    if len(others) > NODES_INLINE_BYTES and spill_dir is not None:
        path = spill_dir / f"memory-stores-g{assignment.generation}.txt"
        spill_dir.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".partial")
        partial.write_text(others)
        partial.replace(path)  # a worker never reads half a list
        query.append(f"nodes_file={path}")
    else:
        query.append("nodes=" + others)
    return f"mem://{stores[node]}/{job}?" + "&".join(query)


class DataPlane:
    def __init__(
        self,
        job: TrainingJob,
        job_dir: Path,
        node: str,
        address: str,
        log_dir: Path,
        log: ContextLogger,
        token: Callable[[], str],
        fork_loader: ForkLoader | None = None,
    ):
        """`token()` is the job's checkpoint token, which the memory store asks of every caller;
        `fork_loader` starts the shadow loader faster than a new interpreter (the fork server)."""
        self.job, self.job_dir, self.node, self.address = job, job_dir, node, address
        self.token = token
        self.fork_loader = fork_loader
        self.log_dir = log_dir
        self.log = log
        self.shadow_loader: ShadowLoaderSupervisor | None = None
        self.memory_store: subprocess.Popen[bytes] | None = None
        self.memory_port: int | None = None

    def start(self) -> None:
        self._start_shadow_loader()
        self._start_memory_store()

    def _start_shadow_loader(self) -> None:
        data = self.job.spec.data
        if data is None:
            return
        lanes = max(r.processes_per_node for r in self.job.spec.roles)
        try:
            self.shadow_loader = start_shadow_loader(
                data,
                self.job_dir,
                self.job.name,
                self.node,
                lanes,
                log=self.log_dir / "shadow-loader.log",
                fork=self.fork_loader,
            )
        except (OSError, ValueError) as exc:
            raise DataPlaneError(f"cannot start the shadow data loader: {exc}") from None
        self.log.info(
            "shadow loader started", fields={"segment": self.shadow_loader.name, "forked": self.shadow_loader.forked}
        )

    def _start_memory_store(self) -> None:
        checkpoint = self.job.spec.checkpoint
        if not checkpoint.memory:
            return
        argv = [
            sys.executable,
            "-m",
            "stalwart.checkpoint.memory_server",
            "--host",
            self.address,
            "--capacity-gib",
            str(checkpoint.memory_capacity_gib),
        ]
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_dir / "memory-store.log", "ab") as log:
            # The token by environment: argv is public. The store listens on the node's address only,
            # on a port bound here and handed over (spawn_listening).
            env = {**os.environ, TOKEN_ENV: self.token()}
            try:
                self.memory_store, port = spawn_listening(
                    argv, self.address, stdout=log, stderr=subprocess.STDOUT, env=env
                )
            except OSError as exc:
                raise DataPlaneError(f"cannot listen for the memory store on {self.address}: {exc}") from None
        self.memory_port = port

    @property
    def shadow_segment(self) -> str | None:
        return self.shadow_loader.name if self.shadow_loader is not None else None

    @property
    def data_config_json(self) -> str | None:
        return self.shadow_loader.config.model_dump_json() if self.shadow_loader is not None else None

    def prewarm_loader(
        self, topology: Topology, node: NodeAssignment, data_state: Mapping[str, Any]
    ) -> list[int] | None:
        """Have the shadow loader compute, from the loader's state at the checkpoint the workers will
        load, the batches they will ask for first (lane i serves local rank i's data-parallel rank).
        Returns those data-parallel ranks, or None when there is nothing to pre-warm."""
        from stalwart.dataloader import LoaderState

        data = self.job.spec.data
        if self.shadow_loader is None or data is None:
            return None
        layout = topology.role(node.role)
        ranks = [topology.coords(node.first_rank + i).dp for i in range(node.local_world_size)]
        state = LoaderState(seed=data.seed, **dict(data_state))
        self.shadow_loader.prewarm(state, dp_size=layout.dp, micro_batch=data.micro_batch, dp_ranks=ranks)
        return ranks

    def close(self) -> None:
        if self.memory_store is not None:
            stop_process(self.memory_store, grace=2.0)
            self.memory_store = None
        if self.shadow_loader is not None:
            self.shadow_loader.close()
            self.shadow_loader = None
