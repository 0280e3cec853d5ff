"""The worker contract: every environment variable a node agent gives a training process.

One module, as the etcd keys are one module (stalwart.store.keys): the agent's launcher writes these
(stalwart.agents.launcher.worker_env), and the worker SDK, the checkpoint engine, the data loader and
the examples read them. It sits at the bottom of the layers and imports nothing, so the standalone
checkpoint engine and data loader may read it too.

torchrun's variables come first, so an unmodified torchrun-style script runs; Stalwart's all start
with STALWART_. A worker outside Stalwart has none of them, and every reader falls back to running
alone (no progress socket: the SDK's calls are no-ops).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

# -- torchrun's ------------------------------------------------------------------------------------
RANK = "RANK"
LOCAL_RANK = "LOCAL_RANK"
WORLD_SIZE = "WORLD_SIZE"
LOCAL_WORLD_SIZE = "LOCAL_WORLD_SIZE"
GROUP_RANK = "GROUP_RANK"  # the node's rank
GROUP_WORLD_SIZE = "GROUP_WORLD_SIZE"  # the nodes in the worker's world
ROLE_NAME = "ROLE_NAME"
ROLE_RANK = "ROLE_RANK"  # the rank among the workers of its role
ROLE_WORLD_SIZE = "ROLE_WORLD_SIZE"  # the workers of its role
MASTER_ADDR = "MASTER_ADDR"
MASTER_PORT = "MASTER_PORT"
RUN_ID = "TORCHELASTIC_RUN_ID"
RESTART_COUNT = "TORCHELASTIC_RESTART_COUNT"
MAX_RESTARTS = "TORCHELASTIC_MAX_RESTARTS"  # the job's failurePolicy.maxRestarts
ERROR_FILE = "TORCHELASTIC_ERROR_FILE"  # where torchelastic's @record writes the worker's exception
TORCHRUN = (
    RANK,
    LOCAL_RANK,
    WORLD_SIZE,
    LOCAL_WORLD_SIZE,
    GROUP_RANK,
    GROUP_WORLD_SIZE,
    ROLE_NAME,
    ROLE_RANK,
    ROLE_WORLD_SIZE,
    MASTER_ADDR,
    MASTER_PORT,
    RUN_ID,
    RESTART_COUNT,
    MAX_RESTARTS,
    ERROR_FILE,
)

# -- who and when ------------------------------------------------------------------------------------
JOB = "STALWART_JOB"
NODE = "STALWART_NODE"
GENERATION = "STALWART_GENERATION"  # the generation this worker belongs to
CODE_VERSION = "STALWART_CODE_VERSION"
PROGRESS_SOCKET = "STALWART_PROGRESS_SOCKET"  # the agent's Unix datagram socket (worker SDK reports)
LAUNCHED_AT = "STALWART_LAUNCHED_AT"  # when the agent started this worker (Unix time): its start-up is measured from it

# -- the parallel layout (the role's spec.parallelism; DP is what the world leaves) -------------------
TENSOR_PARALLEL = "STALWART_TP"
PIPELINE_PARALLEL = "STALWART_PP"
CONTEXT_PARALLEL = "STALWART_CP"
EXPERT_PARALLEL = "STALWART_EP"
DATA_PARALLEL = "STALWART_DP"

# -- checkpoints ---------------------------------------------------------------------------------------
CHECKPOINT_URI = "STALWART_CHECKPOINT_URI"
CHECKPOINT_INTERVAL = "STALWART_CHECKPOINT_INTERVAL"
CHECKPOINT_KEEP = "STALWART_CHECKPOINT_KEEP"
CHECKPOINT_MEMORY_URI = "STALWART_CHECKPOINT_MEMORY_URI"  # this node's memory store, its peer, the others
CHECKPOINT_TOKEN = "STALWART_CHECKPOINT_TOKEN"  # the memory stores' per-job token (never in a URI)
RESUME_MAX_STEP = "STALWART_RESUME_MAX_STEP"  # a rollback: load no checkpoint newer than this
# A file the agent writes when the controller asks every rank to checkpoint (JSON: id, step, reason):
# worker_sdk.checkpoint_requested(step) reads it.
CHECKPOINT_REQUEST = "STALWART_CHECKPOINT_REQUEST"

# -- data ------------------------------------------------------------------------------------------------
DATA_CONFIG = "STALWART_DATA_CONFIG"  # the loader's DataConfig, as JSON
DATA_MICRO_BATCH = "STALWART_DATA_MICRO_BATCH"  # samples per forward pass
# Micro-batches a rank accumulates per optimizer step: 1, unless a role running below its replicas
# keeps the declared global batch (spec.data.globalBatchOnResize: Keep).
DATA_ACCUMULATION = "STALWART_DATA_ACCUMULATION"
DATALOADER_SHM = "STALWART_DATALOADER_SHM"  # the node's shadow loader segment

# -- replay ----------------------------------------------------------------------------------------------
REPLAY_STEPS = "STALWART_REPLAY_STEPS"  # a replay generation's workers stop, successfully, after this many

# -- the RLHF data plane (stalwart.rlhf: a job with spec.dataPlane) ---------------------------------------
ETCD = "STALWART_ETCD"  # HOST:PORT of the job's etcd, where the data-plane endpoints are
DATAPLANE = "STALWART_DATAPLANE"  # the spec's dataPlane section, as JSON
DATAPLANE_TOKEN = "STALWART_DATAPLANE_TOKEN"  # shared by the job's roles; the data plane's servers refuse others
NODE_ADDRESS = "STALWART_NODE_ADDRESS"  # where this node's servers listen and are reached (the pod IP)
ROLE_GENERATION = "STALWART_ROLE_GENERATION"  # the worker's role's own generation (multi-role jobs)

# -- fault injection (tests and demos only; stalwart.faults.worker_faults reads it) ----------------------
FAULT_HOOKS = "STALWART_FAULT_HOOKS"

STALWART = (
    JOB,
    NODE,
    GENERATION,
    CODE_VERSION,
    PROGRESS_SOCKET,
    LAUNCHED_AT,
    TENSOR_PARALLEL,
    PIPELINE_PARALLEL,
    CONTEXT_PARALLEL,
    EXPERT_PARALLEL,
    DATA_PARALLEL,
    CHECKPOINT_URI,
    CHECKPOINT_INTERVAL,
    CHECKPOINT_KEEP,
    CHECKPOINT_MEMORY_URI,
    CHECKPOINT_TOKEN,
    RESUME_MAX_STEP,
    CHECKPOINT_REQUEST,
    DATA_CONFIG,
    DATA_MICRO_BATCH,
    DATA_ACCUMULATION,
    DATALOADER_SHM,
    REPLAY_STEPS,
    ETCD,
    DATAPLANE,
    DATAPLANE_TOKEN,
    NODE_ADDRESS,
    ROLE_GENERATION,
    FAULT_HOOKS,
)


def int_var(name: str, environ: Mapping[str, str] | None = None) -> int | None:
    """An integer variable of the contract, or None when unset or not an integer."""
    raw = (os.environ if environ is None else environ).get(name, "").strip()
    try:
        return int(raw) if raw else None
    except ValueError:
        return None


def resume_max_step(environ: Mapping[str, str] | None = None) -> int | None:
    """The rollback bound the controller set for this generation, if any."""
    return int_var(RESUME_MAX_STEP, environ)
