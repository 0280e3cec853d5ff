"""Failure classes and their rates, from published data; every figure carries its source.

The simulator's arrivals come from here, so a reader can check each number against its paper.
Hardware-driven classes scale linearly with the job's GPU count; all rates scale linearly with
time (Poisson arrivals). Classes the papers do not give a number for are marked `estimate=True`
and say so in their `source`.
"""

from __future__ import annotations

from enum import Enum

from pydantic import BaseModel, ConfigDict, Field

from stalwart.spec.model import FailureEvent

LLAMA3 = (
    "Dubey et al., The Llama 3 Herd of Models, arXiv:2407.21783 (2024), Sec. 3.3.4, Table 5: "
    "419 unexpected interruptions in a 54-day snapshot of 405B pre-training on 16,384 H100 GPUs"
)
LLAMA3_URL = "https://arxiv.org/abs/2407.21783"
BYTEROBUST = (
    "Wan et al., Robust LLM Training Infrastructure at ByteDance (ByteRobust), SOSP 2025, "
    "arXiv:2509.16293: 97% ETTR over three months on 9,600 GPUs"
)
BYTEROBUST_URL = "https://arxiv.org/abs/2509.16293"
MEGASCALE = (
    "Jiang et al., MegaScale: Scaling Large Language Model Training to More Than 10,000 GPUs, "
    "NSDI 2024, arXiv:2402.15627: collective initialisation of 2,048 GPUs cut from 1,047 s to "
    "under 5 s, and under 30 s for more than 10,000 GPUs"
)
MEGASCALE_URL = "https://arxiv.org/abs/2402.15627"

# Llama 3's observation window, the basis of every Llama-derived rate.
LLAMA3_GPUS = 16_384
LLAMA3_DAYS = 54.0


class Basis(str, Enum):
    """What a rate is proportional to."""

    GPU = "gpu"  # failures per GPU-day: scales with the job's size
    JOB = "job"  # failures per job-day: code, data and numerics do not grow with the GPU count


class Detection(str, Enum):
    """How the failure shows itself, which decides each strategy's detection latency."""

    CRASH = "crash"  # a worker exits (CUDA error, Xid, exception): seen in seconds
    MACHINE = "machine"  # a machine signal (Xid, ECC, disk, NIC) from the node agent's probes
    LEASE = "lease"  # the node vanishes: its heartbeat lease lapses
    HANG = "hang"  # no progress; nothing exits
    NAN = "nan"  # the loss goes NaN (or spikes)
    SLOW = "slow"  # one node slows the whole synchronous job down
    PLANNED = "planned"  # a code/config/firmware update that needs the workers restarted


class FailureClass(BaseModel):
    """One published failure category, mapped onto the controller's event vocabulary."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    event: FailureEvent | None = Field(description="The controller's event; None for planned updates.")
    detection: Detection
    count: float = Field(ge=0, description="Occurrences observed in the basis window.")
    basis: Basis
    basis_gpus: int = Field(gt=0, description="GPUs in the observed job (for Basis.GPU).")
    basis_days: float = Field(gt=0)
    nodes: int = Field(1, ge=1, description="Nodes the failure takes out (or a hang's suspect group).")
    machine_at_fault: bool = Field(description="A machine is to blame (evict it once found).")
    slow_factor: float = Field(1.0, ge=1.0, description="Step-time multiplier while a straggler runs.")
    estimate: bool = False
    source: str

    def per_second(self, gpus: int) -> float:
        """Arrival rate for a job of `gpus` GPUs, in failures per second."""
        scale = gpus / self.basis_gpus if self.basis is Basis.GPU else 1.0
        return self.count * scale / (self.basis_days * 86_400.0)


def _llama(
    name: str, count: int, event: FailureEvent, detection: Detection, *, machine: bool, nodes: int = 1
) -> FailureClass:
    return FailureClass(
        name=name,
        event=event,
        detection=detection,
        count=count,
        basis=Basis.GPU,
        basis_gpus=LLAMA3_GPUS,
        basis_days=LLAMA3_DAYS,
        nodes=nodes,
        machine_at_fault=machine,
        source=f"Llama 3 Table 5: {name}, {count} of 419",
    )


M, L, H = FailureEvent.MACHINE_FAULT, FailureEvent.LOST_NODE, FailureEvent.HANG
# Llama 3 Table 5, all 18 root-cause categories (counts sum to 419). How each category manifests
# is our mapping: GPU, NIC, SSD and board faults raise machine signals (Xid/ECC/link/disk); power,
# chassis, CPU, host-memory and unplanned host maintenance take the node away (lease lapses);
# switches, cables and NCCL watchdog timeouts stall collectives (a hang, whose suspect group of
# two nodes is evicted); silent data corruption surfaces as a NaN/loss spike on a faulty GPU that
# the stop-time checks find; software bugs and dependencies are worker crashes with no machine.
LLAMA3_TABLE5: tuple[FailureClass, ...] = (
    _llama("Faulty GPU", 148, M, Detection.MACHINE, machine=True),
    _llama("GPU HBM3 memory", 72, M, Detection.MACHINE, machine=True),
    _llama("Software bug", 54, FailureEvent.WORKER_CRASH, Detection.CRASH, machine=False),
    _llama("Network switch/cable", 35, H, Detection.HANG, machine=True, nodes=2),
    _llama("Host maintenance (unplanned)", 32, L, Detection.LEASE, machine=True),
    _llama("GPU SRAM memory", 19, M, Detection.MACHINE, machine=True),
    _llama("GPU system processor", 17, M, Detection.MACHINE, machine=True),
    _llama("NIC", 7, M, Detection.MACHINE, machine=True),
    _llama("NCCL watchdog timeout", 7, H, Detection.HANG, machine=True, nodes=2),
    _llama("Silent data corruption", 6, FailureEvent.NAN_LOSS, Detection.NAN, machine=True),
    _llama("GPU thermal interface + sensor", 6, M, Detection.MACHINE, machine=True),
    _llama("SSD", 3, M, Detection.MACHINE, machine=True),
    _llama("Power supply", 3, L, Detection.LEASE, machine=True),
    _llama("Server chassis", 2, L, Detection.LEASE, machine=True),
    _llama("IO expansion board", 2, M, Detection.MACHINE, machine=True),
    _llama("Dependency", 2, FailureEvent.WORKER_CRASH, Detection.CRASH, machine=False),
    _llama("CPU", 2, L, Detection.LEASE, machine=True),
    _llama("System memory", 2, L, Detection.LEASE, machine=True),
)

# Llama 3 also reports 47 planned interruptions in the same 54 days (automated maintenance such as
# firmware upgrades, and operator-initiated configuration or dataset updates).
PLANNED_UPDATES = FailureClass(
    name="Planned update (code/config/firmware)",
    event=None,
    detection=Detection.PLANNED,
    count=47,
    basis=Basis.GPU,
    basis_gpus=LLAMA3_GPUS,
    basis_days=LLAMA3_DAYS,
    machine_at_fault=False,
    source="Llama 3 Sec. 3.3.4: 47 planned interruptions of 466 in 54 days",
)

# ByteRobust's Table 1 lists implicit failures (hangs, MFU decline), NaN values and user-code
# errors beside the explicit hardware ones, but its figures could not be retrieved for this work.
# These three classes therefore carry labeled estimates, per job over 90 days at 9,600 GPUs.
ESTIMATED_CLASSES: tuple[FailureClass, ...] = (
    FailureClass(
        name="Straggler / MFU decline",
        event=FailureEvent.SLOWDOWN,
        detection=Detection.SLOW,
        count=15,
        basis=Basis.GPU,
        basis_gpus=9_600,
        basis_days=90,
        machine_at_fault=True,
        slow_factor=2.5,
        estimate=True,
        source="ESTIMATE: ByteRobust Table 1 lists MFU decline as an implicit failure; "
        "15 per 90 days at 9,600 GPUs, each a 2.5x straggler, is our assumption",
    ),
    FailureClass(
        name="NaN / loss spike (numerics)",
        event=FailureEvent.NAN_LOSS,
        detection=Detection.NAN,
        count=5,
        basis=Basis.JOB,
        basis_gpus=9_600,
        basis_days=90,
        machine_at_fault=False,
        estimate=True,
        source="ESTIMATE: ByteRobust Table 1 lists NaN values; 5 per 90-day job is our assumption",
    ),
    FailureClass(
        name="User-code exception (deterministic)",
        event=FailureEvent.USER_CODE_ERROR,
        detection=Detection.CRASH,
        count=3,
        basis=Basis.JOB,
        basis_gpus=9_600,
        basis_days=90,
        machine_at_fault=False,
        estimate=True,
        source="ESTIMATE: 3 per 90-day job, of the order of Llama 3's 3 significant manual "
        "interventions in 54 days; each recurs on retry and needs a human fix",
    ),
)


def default_classes(*, include_estimates: bool = True, include_planned: bool = True) -> list[FailureClass]:
    """Llama 3's 18 categories, plus (optionally) planned updates and the estimated classes."""
    out = list(LLAMA3_TABLE5)
    if include_planned:
        out.append(PLANNED_UPDATES)
    if include_estimates:
        out.extend(ESTIMATED_CLASSES)
    return out


def expected_counts(classes: list[FailureClass], gpus: int, days: float) -> dict[str, float]:
    """Expected arrivals per class over `days` for a `gpus`-GPU job (the Poisson means)."""
    return {c.name: c.per_second(gpus) * days * 86_400.0 for c in classes}
