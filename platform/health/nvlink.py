"""The NVLink probe: each GPU's links from `nvidia-smi nvlink -s`, judged against the node's own GPUs.

NVLink is where a node's GPUs talk to each other (tensor parallelism, the intra-node part of every
collective). A link that trained down leaves the GPU working but slower, so these findings are
degradations, not machine faults: NVLink errors the driver reports are Xid 74 (a machine fault, in
the GPU probe), and a slow intra-node collective fails the node's pre-flight bandwidth judgement.
A node whose GPUs report no active link (PCIe cards without a bridge) says "not available".
"""

from __future__ import annotations

import re
from collections.abc import Callable

from stalwart.health.nvidia_smi import run_nvidia_smi
from stalwart.health.records import Finding, ProbeResult, Reading, Severity
from stalwart.store.records import Record

PROBE = "nvlink"

_GPU = re.compile(r"^GPU (?P<index>\d+): (?P<name>[^(]*)(?:\(UUID: (?P<uuid>[^)]*)\))?")
_LINK = re.compile(r"^\s*Link (?P<link>\d+): (?P<state>.+?)\s*$")
_SPEED = re.compile(r"^(?P<gbps>[\d.]+) GB/s$")


class NvlinkGpu(Record):
    index: int
    name: str
    uuid: str | None = None
    links: dict[int, float | None] = {}  # link -> GB/s; None: <inactive>

    @property
    def active(self) -> list[int]:
        return [n for n, speed in self.links.items() if speed]

    @property
    def inactive(self) -> list[int]:
        return [n for n, speed in self.links.items() if not speed]


def parse_nvlink_status(text: str) -> list[NvlinkGpu]:
    """GPUs from `nvidia-smi nvlink -s` (or `--status`): one header per GPU, then a line per link
    (`Link 0: 26.562 GB/s`, `Link 4: <inactive>`), or NVML's word that every link is inactive."""
    gpus: list[NvlinkGpu] = []
    for line in text.splitlines():
        if m := _GPU.match(line.strip()):
            gpus.append(NvlinkGpu(index=int(m.group("index")), name=m.group("name").strip(), uuid=m.group("uuid")))
        elif gpus and (m := _LINK.match(line)):
            speed = _SPEED.match(m.group("state"))
            gpus[-1].links[int(m.group("link"))] = float(speed.group("gbps")) if speed else None
    return gpus


def evaluate_nvlink(gpus: list[NvlinkGpu]) -> ProbeResult:
    """Each linked GPU against the best-linked GPU of the node: fewer active links, or slower ones."""
    if not gpus:
        return ProbeResult.not_available(PROBE, "nvidia-smi nvlink -s listed no GPU")
    linked = [g for g in gpus if g.active]
    if not linked:
        return ProbeResult.not_available(PROBE, "no GPU of this node has an active NVLink (PCIe only)")
    most = max(len(g.active) for g in linked)
    fastest = max(speed or 0.0 for g in linked for speed in g.links.values())
    findings: list[Finding] = []
    for g in gpus:
        subject = f"gpu{g.index}"
        if not g.active:
            findings.append(
                Finding(
                    code="nvlink_none",
                    severity=Severity.INFO,
                    subject=subject,
                    message=f"{subject} has no active NVLink while {len(linked)} of the node's GPUs have "
                    f"{most}: not bridged, or its links are down",
                )
            )
            continue
        if len(g.active) < most:
            findings.append(
                Finding(
                    code="nvlink_link_inactive",
                    severity=Severity.WARNING,
                    subject=subject,
                    message=f"{subject}: {len(g.active)} of {most} NVLinks active "
                    f"(inactive: {', '.join(map(str, g.inactive)) or 'not listed'})",
                )
            )
        slow = sorted(n for n in g.active if (g.links[n] or 0.0) < fastest)
        if slow:
            findings.append(
                Finding(
                    code="nvlink_link_slow",
                    severity=Severity.WARNING,
                    subject=subject,
                    message=f"{subject}: NVLink {', '.join(map(str, slow))} below {fastest:g} GB/s "
                    f"({', '.join(f'{g.links[n]:g}' for n in slow)} GB/s)",
                )
            )
    readings: dict[str, Reading] = {"gpus_with_nvlink": len(linked), "nvlinks_per_gpu": most}
    for g in gpus:
        readings[f"gpu{g.index}_nvlinks_active"] = len(g.active)
    return ProbeResult.from_findings(PROBE, findings, readings)


class NvlinkProbe:
    name = PROBE

    def __init__(self, reader: Callable[[], str | None] | None = None, timeout: float = 20.0) -> None:
        self.reader = reader or (lambda: run_nvidia_smi(timeout=timeout, args=("nvlink", "-s")))

    def run(self) -> ProbeResult:
        try:
            text = self.reader()
        except TimeoutError as exc:
            return ProbeResult.not_available(PROBE, str(exc))
        if text is None:
            return ProbeResult.not_available(PROBE, "nvidia-smi is not installed")
        gpus = parse_nvlink_status(text)
        if not gpus:  # no driver: nvidia-smi says why on its first line
            first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "no output")
            return ProbeResult.not_available(PROBE, f"nvidia-smi nvlink -s: {first[:200]}")
        return evaluate_nvlink(gpus)
