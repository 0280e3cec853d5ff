"""The simulated job, and how local measurements are carried to its size.

Rule: a component that does not depend on the job's size (control-plane decisions, process
restart on one node, lease expiry, timeouts) is taken as measured; a component that does
(collective initialisation, checkpoint bytes to move, a first step) is computed from the job's
size and a published or stated bandwidth. docs/simulator.md lists each one.
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field

from stalwart.simulator.measured import MeasuredRecovery


class JobModel(BaseModel):
    """A 9,600-GPU, 90-day pre-training job (defaults) and its infrastructure's speeds."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    gpus: int = Field(9_600, ge=8)
    gpus_per_node: int = Field(8, ge=1)
    days: float = Field(90.0, gt=0)
    step_seconds: float = Field(10.0, gt=0, description="One optimizer step at full speed.")
    # A 405B-class dense model (Llama 3's size) with bf16 weights, fp32 master weights and Adam
    # moments: about 16 bytes per parameter, sharded over all GPUs.
    parameters: float = Field(405e9, gt=0)
    checkpoint_bytes_per_parameter: float = Field(16.0, gt=0)
    # ESTIMATE: effective read bandwidth of one job from the remote store. Llama 3's Tectonic
    # sustains 2 TB/s for the whole cluster; one job is assumed to get 100 GB/s of it.
    remote_read_bytes_per_second: float = Field(100e9, gt=0)
    # ESTIMATE: a replacement node pulls its shards from peers' host memory over one 200 Gb/s NIC.
    peer_bytes_per_second: float = Field(25e9, gt=0)
    # MegaScale (NSDI'24): process-group initialisation of >10,000 GPUs in under 30 s.
    collective_init_seconds: float = Field(30.0, ge=0)
    # ESTIMATE: gang-scheduling 1,200 pods and starting their containers (images cached).
    requeue_scheduling_seconds: float = Field(300.0, ge=0)
    # ESTIMATE: a fresh node from the cluster's free pool: provisioning, pod start, then
    # pre-flight checks; the standby pool refills at this pace.
    provision_seconds: float = Field(600.0, ge=0)
    preflight_seconds: float = Field(120.0, ge=0)
    # ESTIMATE: GPU diagnostics plus intra- and inter-node collective tests over the job's nodes.
    stop_time_check_seconds: float = Field(180.0, ge=0)
    # ESTIMATE: stack capture and aggregation over 9,600 ranks (py-spy in parallel per node).
    stack_capture_floor_seconds: float = Field(30.0, ge=0)
    # ESTIMATE: a human reads a user-code traceback, fixes and resubmits.
    manual_fix_seconds: float = Field(2 * 3600.0, ge=0)
    # ESTIMATE: without automatic straggler detection, someone notices the MFU drop.
    human_straggler_seconds: float = Field(4 * 3600.0, ge=0)
    remote_checkpoint_interval_seconds: float = Field(1800.0, gt=0)

    @property
    def nodes(self) -> int:
        return math.ceil(self.gpus / self.gpus_per_node)

    @property
    def horizon_seconds(self) -> float:
        return self.days * 86_400.0

    @property
    def checkpoint_bytes(self) -> float:
        return self.parameters * self.checkpoint_bytes_per_parameter

    @property
    def shard_bytes_per_gpu(self) -> float:
        return self.checkpoint_bytes / self.gpus


class ScaledRecovery(BaseModel):
    """Recovery components for the simulated job, each with how it was obtained."""

    model_config = ConfigDict(frozen=True)

    in_place_restart_seconds: float  # healthy nodes restart their workers; a standby joins
    requeue_seconds: float  # every pod rescheduled, checkpoint read from remote storage
    checkpoint_stall_seconds: float  # blocking part of one in-memory save, per GPU shard
    stack_capture_seconds: float
    memory_restore_seconds: float
    remote_restore_seconds: float
    notes: dict[str, str]


def scale(measured: MeasuredRecovery, job: JobModel) -> ScaledRecovery:
    """Carry the local measurements to `job`'s size (see the module docstring for the rule).

    Hot-swap: the measured local figure (controller decision, standby promotion, worker restart on
    each node, the tiny model's load and first step) is kept whole as the size-independent part, an
    upper bound since it already contains a small init, load and step; to it we add collective
    initialisation at scale, restoring the per-GPU shard from host memory (and a replacement
    node's shards from peers), and one full-size step. Requeue: the measured relaunch plus gang
    scheduling, collective initialisation, the whole checkpoint read from remote storage and one
    step. The checkpoint stall: the per-GPU shard copied at the staging speed measured here (no
    credit for faster device-to-host copies on GPUs).
    """
    shard = job.shard_bytes_per_gpu
    staging = measured.staging_bytes_per_second
    memory_restore = shard / staging + shard * job.gpus_per_node / job.peer_bytes_per_second
    remote_restore = job.checkpoint_bytes / job.remote_read_bytes_per_second
    in_place = measured.hot_swap_seconds + job.collective_init_seconds + memory_restore + job.step_seconds
    requeue = (
        measured.requeue_seconds
        + job.requeue_scheduling_seconds
        + job.collective_init_seconds
        + remote_restore
        + job.step_seconds
    )
    stall = shard / staging
    capture = max(measured.stack_capture_seconds, job.stack_capture_floor_seconds)
    notes = {
        "in_place_restart": f"local hot-swap {measured.hot_swap_seconds:.1f} s + collective init "
        f"{job.collective_init_seconds:.0f} s + memory restore {memory_restore:.2f} s + one step "
        f"{job.step_seconds:.0f} s",
        "requeue": f"local requeue {measured.requeue_seconds:.1f} s + scheduling "
        f"{job.requeue_scheduling_seconds:.0f} s + collective init {job.collective_init_seconds:.0f} s + "
        f"remote restore {remote_restore:.0f} s ({job.checkpoint_bytes / 1e12:.2f} TB at "
        f"{job.remote_read_bytes_per_second / 1e9:.0f} GB/s) + one step {job.step_seconds:.0f} s",
        "checkpoint_stall": f"{shard / 1e9:.3f} GB per GPU at the measured staging speed {staging / 1e9:.2f} GB/s",
        "stack_capture": f"max(local {measured.stack_capture_seconds:.1f} s, floor at scale "
        f"{job.stack_capture_floor_seconds:.0f} s)",
    }
    return ScaledRecovery(
        in_place_restart_seconds=in_place,
        requeue_seconds=requeue,
        checkpoint_stall_seconds=stall,
        stack_capture_seconds=capture,
        memory_restore_seconds=memory_restore,
        remote_restore_seconds=remote_restore,
        notes=notes,
    )


def young_daly_interval(stall_seconds: float, mtbf_seconds: float) -> float:
    """The checkpoint interval that minimises stall plus expected lost work: sqrt(2 * stall * MTBF)
    (Young 1974; Daly 2006). Checkpointing more often costs more stalls than it saves."""
    if stall_seconds <= 0:
        return 0.0
    return math.sqrt(2.0 * stall_seconds * mtbf_seconds)
