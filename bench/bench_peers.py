"""The open-source peers side by side: Stalwart, torchrun, DLRover and torchft on the same job and faults.

    .venv/bin/python bench/bench_peers.py --setup    # .venv-peers: the `peers` extra's pins, this machine's torch
    # by hand: python3.11 -m venv .venv-peers && .venv-peers/bin/pip install -c constraints/cpu.txt \
    #     torch==2.13.0 'dlrover[k8s]==0.6.1' torchft==0.2.0 nvidia-resiliency-ext==0.4.1 numpy
    .venv/bin/python bench/bench_peers.py            # 3 repeats, systems interleaved (about an hour, 2 cores)
    .venv/bin/python bench/bench_peers.py --repeats 1 --keep /tmp/peers   # one pass, every log kept
    .venv/bin/python bench/bench_peers.py --stop-at 06:00 --output bench/results/peers-a.md   # no run starts later
    .venv/bin/python bench/bench_peers.py --repeats 0 --systems stalwart dlrover --output bench/results/peers-b.md
    .venv/bin/python bench/bench_peers.py --report-from bench/results/peers-a.json bench/results/peers-b.json

Every pass rewrites its .json after each run, so a pass cut short keeps what it measured; `--report-from`
merges passes into one report and its .json (every run's cells, the newest pass's checkpoint blocked times);
`--repeats 0` runs only the clean runs and the blocked-time measurement.

Stalwart runs from .venv (`stalwart run` of examples/pretrain-tiny.yaml, 2 nodes x 2 gloo workers, its
faults injected by `--inject`, figures from the incident the controller recorded); every peer runs
from .venv-peers (`peers` extra: dlrover 0.6.1, torchft 0.2.0, nvidia-resiliency-ext 0.4.1 with this
machine's torch) with the example's model and step (bench/peers/common.py), 4 ranks in 2 "nodes",
each configured as its documentation recommends for the least downtime (bench/peers/train_*.py).

Faults, the same for every system, at step FAULT_STEP of STEPS, a checkpoint every INTERVAL steps:
- kill-worker: rank 3 SIGKILLed;
- lost-node: node 1's processes (its launcher or agent and its workers) SIGKILLed together; for a
  peer the harness starts the replacement node at once (a scheduler's best case; Stalwart uses its
  warm standby);
- hang: rank 3 SIGSTOPped (no socket closes); a system that has not restarted a rank HANG_WAIT
  seconds later (or whose other ranks finished without it) is marked so. Each peer notices a hang
  as its documentation has it, set low: torch's collective timeout (10 s) for torchrun and DLRover,
  torchft's gloo timeout (5 s) and lighthouse heartbeat; NVRx's Wrapper (soft 5 s, hard 10 s) in the
  probe.

Measured per system and fault: failure -> the first step trained by the restarted ranks, steps
redone (the restarted rank's newest step before the failure minus the step it resumed from), and
whether the steps' sample ids equal the system's own clean run. Per system, from the clean run: the
training loop's blocked time per checkpoint (Stalwart's from bench/peers/train_stalwart_ckpt.py, the
same loop with Stalwart's engine). NVRx is probed (bench/peers/probe_nvrx.py): what it says on CPU
goes in the report with its published figures. Writes bench/results/peers.md and .json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parents[1]
PEERS = REPO / "bench" / "peers"
PEERS_VENV = REPO / ".venv-peers"
RESULTS = REPO / "bench" / "results"
EXAMPLE = REPO / "examples" / "pretrain-tiny.yaml"
SYSTEMS = ("stalwart", "torchrun", "dlrover", "torchft")
FAULTS = ("kill-worker", "lost-node", "hang")
STEPS, FAULT_STEP, INTERVAL = 40, 25, 10
RANKS, FAULTY_RANK, FAULTY_NODE = 4, 3, 1
HANG_WAIT = 120.0  # seconds a hung rank is left before the cell reads "not recovered"
RUN_TIMEOUT = 300.0
PEER_VERSIONS = {"dlrover": "0.6.1", "torchft": "0.2.0", "nvidia-resiliency-ext": "0.4.1"}


# ------------------------------------------------------------------------------- audit (pure)
@dataclass
class StepLine:
    rank: int
    step: int
    pid: int
    t: float
    ids: list[int]


def read_audit(folder: Path) -> list[StepLine]:
    """Every completed step of every rank from the `rank-R.jsonl` files (bench/peers/common.py)."""
    out = []
    for path in sorted(folder.glob("rank-*.jsonl")):
        rank = int(path.stem.split("-")[1])
        for line in path.read_text().splitlines():
            if line.strip():
                rec = json.loads(line)
                out.append(StepLine(rank, int(rec["step"]), int(rec["pid"]), float(rec["t"]), list(rec["ids"])))
    return out


def trained(lines: Iterable[StepLine]) -> dict[int, list[int]]:
    """Step -> the sample ids trained at that step, each rank's newest attempt of it winning."""
    newest: dict[tuple[int, int], StepLine] = {}
    for line in lines:
        key = (line.step, line.rank)
        if key not in newest or line.t >= newest[key].t:
            newest[key] = line
    out: dict[int, list[int]] = {}
    for (step, _), line in newest.items():
        out.setdefault(step, []).extend(line.ids)
    return {step: sorted(ids) for step, ids in sorted(out.items())}


@dataclass
class Recovery:
    first_step: float | None  # seconds from the failure to the first step of a restarted rank
    steps_redone: int | None
    resumed_at: int | None  # the step the restarted ranks trained first
    others_pause: float | None  # the longest gap between steps of ranks that were never restarted


def recovery(lines: Sequence[StepLine], failed_at: float, old_pids: set[int]) -> Recovery:
    """What the audit says about one failure: the processes started after it (pids not seen before)
    are the restarted ranks; their first step is the recovery's end."""
    new = [line for line in lines if line.pid not in old_pids and line.t > failed_at]
    if not new:
        return Recovery(None, None, None, _others_pause(lines, failed_at, restarted=set()))
    first = min(new, key=lambda line: line.t)
    restarted = {line.rank for line in new}
    redone = 0
    for rank in restarted:
        before = [line.step for line in lines if line.rank == rank and line.pid in old_pids]
        resumed = min(line.step for line in new if line.rank == rank)
        redone = max(redone, (max(before) - resumed + 1) if before else 0)
    return Recovery(first.t - failed_at, redone, first.step, _others_pause(lines, failed_at, restarted))


def _others_pause(lines: Sequence[StepLine], failed_at: float, restarted: set[int]) -> float | None:
    gaps = []
    for rank in {line.rank for line in lines} - restarted:
        times = sorted(line.t for line in lines if line.rank == rank)
        prev = [t for t in times if t <= failed_at]
        after = [t for t in times if t > failed_at]
        if prev and after:
            seq = [prev[-1], *after]
            gaps.append(max(b - a for a, b in zip(seq, seq[1:], strict=False)))
    return max(gaps) if gaps else None


def same_samples(run: dict[int, list[int]], clean: dict[int, list[int]]) -> bool:
    return run == clean


def median(values: Iterable[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return statistics.median(kept) if kept else None


# ---------------------------------------------------------------------------------- results
@dataclass
class Cell:
    system: str
    fault: str
    first_step: float | None = None
    steps_redone: int | None = None
    samples_equal: bool | None = None
    others_pause: float | None = None
    load_before: list[float] = field(default_factory=list)
    load_after: list[float] = field(default_factory=list)
    note: str = ""
    pass_index: int = 0  # which pass of a merged report it came from
    # Stalwart only: seconds from the fault to each stage of its incident (stalwart_phases)
    phases: dict[str, float] = field(default_factory=dict)


def summarize(cells: Sequence[Cell]) -> dict[tuple[str, str], dict[str, Any]]:
    """(system, fault) -> medians over the repeats, the runs' count, and every note seen."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for key in sorted({(c.system, c.fault) for c in cells}):
        runs = [c for c in cells if (c.system, c.fault) == key]
        measured = [c for c in runs if c.first_step is not None]
        out[key] = {
            "runs": len(runs),
            "recovered": len(measured),
            "first_step": median(c.first_step for c in measured),
            "steps_redone": median(float(c.steps_redone) for c in measured if c.steps_redone is not None),
            "samples_equal": (
                None if not measured else all(c.samples_equal for c in measured if c.samples_equal is not None)
            ),
            "others_pause": median(c.others_pause for c in runs),
            "notes": sorted({c.note for c in runs if c.note}),
        }
    return out


def _s(value: float | None, unit: str = "s") -> str:
    return "-" if value is None else f"{value:.2f} {unit}".strip()


def _cell(row: dict[str, Any] | None, published: str | None) -> str:
    if row is None:
        return "not run" + (f"; published: {published}" if published else "")
    if row["recovered"] == 0:
        reason = "; ".join(row["notes"])
        return f"not recovered ({reason})" + (f"; published: {published}" if published else "")
    text = f"{row['first_step']:.2f} s (n={row['recovered']}/{row['runs']})"
    return text


def build_report(
    cells: Sequence[Cell],
    blocked: dict[str, list[float]],
    context: dict[str, Any],
    published: dict[tuple[str, str], str],
    configs: dict[str, str],
) -> str:
    """The markdown report: the table (medians), the checkpoint column, each system's configuration,
    what could not run and why, the load."""
    table = summarize(cells)
    systems = [s for s in context["systems"] if s != "nvrx"]
    lines = [
        "# Peers benchmark: Stalwart, torchrun, DLRover, torchft (and NVRx) on the same job and faults",
        "",
        f"Generated by `{context['command']}` on {context['measured_at']} UTC.",
        f"Machine: {context['machine']}. Load average (1 min) before / after each run: "
        f"min {context['load_min']:.2f}, median {context['load_median']:.2f}, max {context['load_max']:.2f} "
        "(the machine is shared: read the figures as noisy).",
        "",
        f"Job: the pretraining example's model (TinyGPT, 2 layers, dim 64), batch 8 x 64 tokens per rank, "
        f"{RANKS} ranks in 2 nodes, gloo on CPU, {STEPS} steps, a checkpoint every {INTERVAL} steps, the fault "
        f"at step {FAULT_STEP}; medians of the runs each cell got (n below; repeats asked: {context['repeats']}), "
        "systems interleaved.",
        "",
        *[f"Note: {n}" for n in context.get("notes", [])],
        *([""] if context.get("notes") else []),
        "## Failure -> first step after recovery (median)",
        "",
        "| fault | " + " | ".join(systems) + " |",
        "|---|" + "---|" * len(systems),
    ]
    for fault in FAULTS:
        row = [_cell(table.get((s, fault)), published.get((s, fault))) for s in systems]
        lines.append(f"| {fault} | " + " | ".join(row) + " |")
    lines += ["", "## Steps redone, samples equal to the system's clean run", ""]
    lines += ["| fault | " + " | ".join(systems) + " |", "|---|" + "---|" * len(systems)]
    for fault in FAULTS:
        row = []
        for s in systems:
            r = table.get((s, fault))
            if r is None or r["recovered"] == 0:
                row.append("-")
                continue
            same = {True: "same samples", False: "samples differ", None: "-"}[r["samples_equal"]]
            row.append(f"{r['steps_redone']:.0f} redone, {same}")
        lines.append(f"| {fault} | " + " | ".join(row) + " |")
    pauses = [
        f"{s} {fault}: {_s(table[(s, fault)]['others_pause'])}"
        for s in systems
        for fault in FAULTS
        if (s, fault) in table and table[(s, fault)]["others_pause"] is not None
    ]
    if pauses:
        lines += [
            "",
            "The healthy ranks' longest pause between two steps after the failure (torchft's replicas that "
            "were not restarted keep training; elsewhere every rank restarts): " + "; ".join(pauses) + ".",
        ]
    lines += stalwart_phase_table(cells)
    lines += ["", "## Training loop blocked per checkpoint (clean run, every rank's saves)", ""]
    lines += ["| system | median | max | saves |", "|---|---|---|---|"]
    for s in systems:
        values = blocked.get(s) or []
        if values:
            lines.append(
                f"| {s} | {statistics.median(values) * 1000:.1f} ms | {max(values) * 1000:.1f} ms | {len(values)} |"
            )
        else:
            lines.append(f"| {s} | - | - | no periodic checkpoint in its recommended loop |")
    lines += ["", "## Against the acceptance bounds", "", *acceptance(table, blocked, systems)]
    lines += ["", "## Each system's configuration", ""]
    for s in context["systems"]:
        lines.append(f"- **{s}**: {configs[s]}")
    if context.get("nvrx_probe"):
        lines += ["", "## NVRx on this machine (exact output)", "", "```", context["nvrx_probe"].strip(), "```"]
    if published:
        lines += ["", "## Published figures used where a system could not run a case here", ""]
        for (s, fault), text in sorted(published.items()):
            lines.append(f"- {s}, {fault}: {text}")
    lines += ["", "## Every run", "", "| system | fault | first step | redone | samples | load | note |"]
    lines += ["|---|---|---|---|---|---|---|"]
    for c in cells:
        same = {True: "same", False: "differ", None: "-"}[c.samples_equal]
        load = f"{c.load_before[0]:.2f} -> {c.load_after[0]:.2f}" if c.load_before and c.load_after else "-"
        lines.append(
            f"| {c.system} | {c.fault} | {_s(c.first_step)} | {c.steps_redone if c.steps_redone is not None else '-'} "
            f"| {same} | {load} | {c.note} |"
        )
    return "\n".join(lines) + "\n"


PHASES = {
    "detected": "detected",
    "restarted": "new generation started",
    "first_step": "first step",
    "checks": "of which stop-time checks",
}


def stalwart_phase_table(cells: Sequence[Cell]) -> list[str]:
    """Where Stalwart's failure -> first step went, per fault (medians of the runs that recorded it)."""
    lines: list[str] = []
    for fault in FAULTS:
        runs = [c.phases for c in cells if c.system == "stalwart" and c.fault == fault and c.phases]
        if runs:
            values = [_s(median(run.get(key) for run in runs)) for key in PHASES]
            lines.append(f"| {fault} | " + " | ".join(values) + f" | {len(runs)} |")
    if not lines:
        return []
    return [
        "",
        "## Where Stalwart's recovery time went (median seconds after the fault)",
        "",
        "The controller's incident record (detected, the new generation's start, its first step) and the "
        "agents' stop-time checks (the slowest node's share; they run between detection and the restart "
        "after a crash or a hang with no clear suspect, not after a lost node, whose ranks move to the standby).",
        "",
        "| fault | " + " | ".join(PHASES.values()) + " | runs |",
        "|---|" + "---|" * (len(PHASES) + 1),
        *lines,
    ]


def acceptance(
    table: dict[tuple[str, str], dict[str, Any]], blocked: dict[str, list[float]], systems: list[str]
) -> list[str]:
    """Stalwart's medians against the best peer's that recovered: lost node at least 2x faster, a
    killed worker no slower, a hang (no bound; the ratio), checkpoint blocked time no higher than DLRover's."""
    out = []
    bounds = {"lost-node": 2.0, "kill-worker": 1.0, "hang": None}
    for fault, bound in bounds.items():
        ours = table.get(("stalwart", fault))
        peers = [
            (table[(s, fault)]["first_step"], s)
            for s in systems
            if s != "stalwart" and (s, fault) in table and table[(s, fault)]["first_step"] is not None
        ]
        if ours is None or ours["first_step"] is None or not peers:
            out.append(f"- {fault}: no ratio (Stalwart or every peer has no measured recovery)")
            continue
        best, who = min(peers)
        ratio = best / ours["first_step"]
        verdict = "" if bound is None else (" (holds)" if ratio >= bound else f" (does not hold: bound {bound:g}x)")
        out.append(
            f"- {fault}: Stalwart {ours['first_step']:.2f} s, best peer {who} {best:.2f} s: "
            f"{ratio:.1f}x faster{verdict}"
        )
    if blocked.get("stalwart") and blocked.get("dlrover"):
        ours_ms = statistics.median(blocked["stalwart"]) * 1000
        theirs_ms = statistics.median(blocked["dlrover"]) * 1000
        holds = "holds" if ours_ms <= theirs_ms else "does not hold"
        out.append(
            f"- checkpoint blocked time (median): Stalwart {ours_ms:.1f} ms, DLRover {theirs_ms:.1f} ms: "
            f"{theirs_ms / ours_ms:.1f}x ({holds}: no higher than DLRover's)"
        )
    return out


# --------------------------------------------------------------------------------- processes
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def peer_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STALWART_", "VIRTUAL_ENV"))}
    env.update({"OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", "PATH": f"{PEERS_VENV / 'bin'}:{env['PATH']}"})
    env.update(extra)
    return env


class Group:
    """Processes started in their own sessions, so a node dies whole (killpg) and none outlives the run."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, argv: list[str], env: dict[str, str]) -> None:
        log = open(self.logs / f"{name}.log", "ab")
        self.procs[name] = subprocess.Popen(
            argv, env=env, cwd=str(PEERS), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()

    def kill(self, name: str) -> None:
        """The launcher, its session and every descendant: DLRover's agent starts its workers in
        process groups of their own, which a killpg of the launcher's misses."""
        proc = self.procs.get(name)
        if proc is not None:
            try:
                family = psutil.Process(proc.pid).children(recursive=True)
            except psutil.NoSuchProcess:
                family = []
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            for child in family:
                try:
                    child.kill()
                except psutil.NoSuchProcess:
                    pass
            proc.wait()

    def done(self, names: Iterable[str]) -> bool:
        return all(self.procs[n].poll() is not None for n in names if n in self.procs)

    def close(self) -> None:
        for name in list(self.procs):
            try:
                os.killpg(self.procs[name].pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
            self.kill(name)


@dataclass
class Peer:
    """How one peer's nodes and services start: `nodes[n]` names node n's launchers."""

    name: str
    group: Group
    folder: Path
    nodes: dict[int, list[str]] = field(default_factory=dict)

    def launch_services(self) -> None: ...

    def launch_node(self, node: int) -> None:
        raise NotImplementedError

    def launchers(self) -> list[str]:
        return [n for names in self.nodes.values() for n in names]


def _train_args(script: str, folder: Path) -> list[str]:
    return [
        str(PEERS / script),
        "--out",
        str(folder / "audit"),
        "--ckpt-dir",
        str(folder / "ckpt"),
        "--steps",
        str(STEPS),
        "--interval",
        str(INTERVAL),
    ]


class Torchrun(Peer):
    def launch_services(self) -> None:
        self.port = free_port()

    def launch_node(self, node: int) -> None:
        argv = [str(PEERS_VENV / "bin" / "python"), "-m", "torch.distributed.run", "--nnodes", "2"]
        argv += ["--nproc-per-node", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{self.port}"]
        argv += ["--rdzv-id", "peers", "--max-restarts", "3", *_train_args("train_torchrun.py", self.folder)]
        name = f"node{node}-{time.monotonic_ns()}"
        # A fresh store per rendezvous round: with the agent's store shared (torch's default), restarted
        # workers read the previous round's gloo addresses (pytorch/pytorch#135712).
        self.group.start(name, argv, peer_env(TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1"))
        self.nodes[node] = [name]
        if node == 0:
            _wait_port(self.port)  # node 0 hosts the c10d store: the surviving node keeps it


class DLRover(Peer):
    def launch_services(self) -> None:
        self.port = free_port()
        argv = [str(PEERS_VENV / "bin" / "python"), "-u", "-m", "dlrover.python.master.main", "--port"]
        argv += [str(self.port), "--node_num", "2", "--job_name", "peers", "--platform", "local"]
        self.group.start("master", argv, peer_env())
        _wait_port(self.port)

    def launch_node(self, node: int) -> None:
        argv = [str(PEERS_VENV / "bin" / "dlrover-run"), "--nnodes", "2", "--nproc_per_node", "2"]
        argv += ["--max-restarts", "3", *_train_args("train_dlrover.py", self.folder)]
        env = peer_env(NODE_RANK=str(node), DLROVER_MASTER_ADDR=f"127.0.0.1:{self.port}")
        name = f"node{node}-{time.monotonic_ns()}"
        self.group.start(name, argv, env)
        self.nodes[node] = [name]


class TorchFT(Peer):
    def launch_services(self) -> None:
        self.port = free_port()
        argv = [str(PEERS_VENV / "bin" / "torchft_lighthouse"), "--min_replicas", "1", "--quorum_tick_ms", "100"]
        argv += ["--join_timeout_ms", "10000", "--bind", f"127.0.0.1:{self.port}"]
        self.group.start("lighthouse", argv, peer_env())
        _wait_port(self.port)

    def launch_node(self, node: int) -> None:
        names = []
        for group in (2 * node, 2 * node + 1):  # a node holds two replica groups of one rank each
            argv = [str(PEERS_VENV / "bin" / "python"), "-m", "torch.distributed.run", "--standalone"]
            argv += ["--nproc-per-node", "1", "--max-restarts", "3", *_train_args("train_torchft.py", self.folder)]
            env = peer_env(
                TORCHFT_LIGHTHOUSE=f"http://127.0.0.1:{self.port}",
                REPLICA_GROUP_ID=str(group),
                NUM_REPLICA_GROUPS=str(RANKS),
            )
            name = f"node{node}-group{group}-{time.monotonic_ns()}"
            self.group.start(name, argv, env)
            names.append(name)
        self.nodes[node] = names


PEER_CLASSES: dict[str, type[Peer]] = {"torchrun": Torchrun, "dlrover": DLRover, "torchft": TorchFT}


def _wait_port(port: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {timeout:.0f}s")


def _pids(audit: Path, rank: int | None = None) -> dict[int, int]:
    """pid -> rank, from the pid files the training scripts write."""
    out = {}
    for path in audit.glob("pid-*"):
        _, r, pid = path.name.split("-")
        if rank is None or int(r) == rank:
            out[int(pid)] = int(r)
    return out


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _steps_done(audit: Path, rank: int) -> int:
    path = audit / f"rank-{rank}.jsonl"
    if not path.exists():
        return 0
    lines = path.read_text().splitlines()
    return json.loads(lines[-1])["step"] if lines else 0


SHM = Path("/dev/shm")


def flash_checkpoints(shm: Path = SHM) -> set[Path]:
    """DLRover's Flash Checkpoint segments (`<job>_ckpt_shm_<rank>`): they outlive its runs here (the
    bench ends each with SIGKILL, so nothing unlinks them); each run removes the ones it left."""
    return set(shm.glob("*_ckpt_shm_*")) if shm.is_dir() else set()


def remove_new_flash_checkpoints(before: set[Path], shm: Path = SHM) -> None:
    for path in flash_checkpoints(shm) - before:
        path.unlink(missing_ok=True)


def run_peer(system: str, fault: str | None, folder: Path) -> tuple[Cell, list[StepLine], list[float]]:
    """One run of a peer: start its services and nodes, strike at FAULT_STEP, wait for the end."""
    folder.mkdir(parents=True)
    audit = folder / "audit"
    group = Group(folder)
    peer = PEER_CLASSES[system](system, group, folder)
    cell = Cell(system, fault or "clean", load_before=list(os.getloadavg()))
    failed_at, old_pids = 0.0, set()
    shm_before = flash_checkpoints()
    try:
        peer.launch_services()
        for node in (0, 1):
            peer.launch_node(node)
        deadline = time.monotonic() + RUN_TIMEOUT
        while fault is not None and _steps_done(audit, FAULTY_RANK) < FAULT_STEP:
            if time.monotonic() > deadline or group.done(peer.launchers()):
                raise RuntimeError(f"{system} did not reach step {FAULT_STEP} (logs in {folder})")
            time.sleep(0.02)
        if fault is not None:
            old_pids = set(_pids(audit))
            victim = max(p for p, r in _pids(audit, FAULTY_RANK).items() if _alive(p))
            failed_at = time.time()
            if fault == "kill-worker":
                os.kill(victim, signal.SIGKILL)
            elif fault == "hang":
                os.kill(victim, signal.SIGSTOP)
            else:
                for name in peer.nodes[FAULTY_NODE]:
                    group.kill(name)
                peer.launch_node(FAULTY_NODE)  # the replacement, at once
        # A hang gets HANG_WAIT to be noticed (a restarted rank); once one is, the run goes to its end.
        start = time.monotonic()
        while not group.done(peer.launchers()) and time.monotonic() - start < RUN_TIMEOUT:
            if fault == "hang" and not set(_pids(audit)) - old_pids:
                others_done = all(_steps_done(audit, r) >= STEPS for r in range(RANKS) if r != FAULTY_RANK)
                if others_done or time.monotonic() - start > HANG_WAIT:
                    break  # nothing restarted the hung rank: the healthy ones finished, or the wait ran out
            time.sleep(0.1)
        if not group.done(peer.launchers()) and fault != "hang":
            cell.note = f"did not finish in {RUN_TIMEOUT:.0f}s"
    except RuntimeError as exc:
        cell.note = str(exc)
    finally:
        group.close()
        remove_new_flash_checkpoints(shm_before)
        cell.load_after = list(os.getloadavg())
    lines = read_audit(audit) if audit.exists() else []
    if fault is not None and failed_at:
        rec = recovery(lines, failed_at, old_pids)
        cell.first_step, cell.steps_redone, cell.others_pause = rec.first_step, rec.steps_redone, rec.others_pause
        if rec.first_step is None and not cell.note:
            cell.note = f"no restarted rank trained within {HANG_WAIT if fault == 'hang' else RUN_TIMEOUT:.0f}s"
            if rec.others_pause is not None:
                cell.note += "; the other ranks trained on without it"
    blocked = [
        float(json.loads(line)["blocked"]) for p in audit.glob("ckpt-*.jsonl") for line in p.read_text().splitlines()
    ]
    return cell, lines, blocked


# ---------------------------------------------------------------------------------- Stalwart
def stalwart_job(folder: Path, samples: Path, fault: str | None) -> Path:
    import yaml

    doc = yaml.safe_load(EXAMPLE.read_text())
    # A name of its own: node-local resources (the loader's shared memory) are named by job and node,
    # and the example's own name may be running at the same time on a shared machine.
    doc["metadata"]["name"] = f"peers-{secrets.token_hex(4)}"
    role = doc["spec"]["roles"][0]
    command = list(role["command"])
    command[command.index("--steps") + 1] = str(STEPS)
    role["command"] = [*command, "--sample-log", str(samples)]
    role["workingDir"] = str(EXAMPLE.parent)
    for source in doc["spec"]["data"]["sources"]:
        source["shards"] = [str(EXAMPLE.parent / s) for s in source["shards"]]
    doc["spec"]["checkpoint"]["intervalSteps"] = INTERVAL
    doc["spec"]["faultTolerance"].update(
        {"preflight": False, "heartbeatIntervalSeconds": 0.5, "leaseTtlSeconds": 5, "stopGraceSeconds": 2}
    )
    if fault == "hang":
        doc["spec"]["faultTolerance"]["hangTimeoutFloorSeconds"] = 4
    path = folder / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


STALWART_FAULTS = {
    "kill-worker": f"kill-worker:rank={FAULTY_RANK},step={FAULT_STEP}",
    "lost-node": f"kill-node:node={FAULTY_NODE},step={FAULT_STEP}",
    "hang": f"hang-worker:rank={FAULTY_RANK},step={FAULT_STEP}",
}


def stalwart_samples(folder: Path) -> tuple[dict[int, list[int]], int | None]:
    """The SampleLog audit: step -> ids (newest generation per step), and the steps trained twice."""
    per: dict[tuple[int, int], tuple[int, list[int]]] = {}
    seen: dict[int, set[int]] = {}
    for path in folder.glob("rank-*.jsonl"):
        rank = int(path.stem.split("-")[1])
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            gen, step = int(rec.get("generation", 0)), int(rec["step"])
            seen.setdefault(step, set()).add(gen)
            if (step, rank) not in per or gen >= per[(step, rank)][0]:
                per[(step, rank)] = (gen, list(rec["ids"]))
    out: dict[int, list[int]] = {}
    for (step, _), (_, ids) in sorted(per.items()):
        out.setdefault(step, []).extend(ids)
    return {s: sorted(v) for s, v in out.items()}, sum(1 for gens in seen.values() if len(gens) > 1)


def run_stalwart(fault: str | None, folder: Path) -> tuple[Cell, dict[int, list[int]]]:
    folder.mkdir(parents=True)
    samples = folder / "samples"
    summary = folder / "summary.json"
    argv = [str(REPO / ".venv" / "bin" / "python"), "-m", "stalwart.cli.main", "run"]
    argv += [str(stalwart_job(folder, samples, fault)), "--workdir", str(folder / "run")]
    argv += ["--summary-json", str(summary), "--timeout", str(int(RUN_TIMEOUT))]
    if fault is not None:
        argv += ["--inject", STALWART_FAULTS[fault]]
    cell = Cell("stalwart", fault or "clean", load_before=list(os.getloadavg()))
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=RUN_TIMEOUT + 120)
    cell.load_after = list(os.getloadavg())
    (folder / "stalwart.log").write_text(proc.stdout + proc.stderr)
    ids, redone = stalwart_samples(samples) if samples.exists() else ({}, None)
    if not summary.exists():
        cell.note = f"no summary (exit {proc.returncode})"
        return cell, ids
    result = json.loads(summary.read_text())
    incidents = result["snapshot"]["incidents"]
    if fault is None:
        return cell, ids
    failed, inc = stalwart_incident(result)
    if result["phase"] != "Succeeded" or inc is None or inc.get("first_step_at") is None or failed is None:
        cell.note = f"phase {result['phase']}, {len(incidents)} incidents"
        return cell, ids
    cell.first_step = inc["first_step_at"] - failed
    cell.phases = stalwart_phases(inc, failed, folder / "run")
    cell.steps_redone = redone
    cell.note = f"{inc['failure_class']} -> {inc['action']}"
    return cell, ids


def stalwart_incident(result: dict[str, Any]) -> tuple[float | None, dict[str, Any] | None]:
    """The injected fault's time and the first incident detected after it, from `--summary-json`."""
    failed = result["faults"][0]["fired_at"] if result.get("faults") else None
    incidents = result["snapshot"]["incidents"]
    return failed, next((i for i in incidents if failed is None or i["detected_at"] >= failed), None)


def backfill_phases(cells: Sequence[Cell], pass_index: int, runs: Path) -> int:
    """Give a pass's Stalwart cells the phases of the runs it kept (`--keep` folders `NNN-stalwart-FAULT`,
    in the order the pass ran them and listed its cells); the number of cells filled."""
    folders = sorted(f for f in runs.glob("*-stalwart-*") if not f.name.endswith("-clean"))
    ours = [c for c in cells if c.system == "stalwart" and c.pass_index == pass_index]
    if [f.name.split("-", 2)[2] for f in folders] != [c.fault for c in ours]:
        raise SystemExit(f"--phases-from {pass_index}:{runs}: its Stalwart runs do not match the pass's cells")
    filled = 0
    for cell, folder in zip(ours, folders, strict=True):
        summary = folder / "summary.json"
        if cell.first_step is None or cell.phases or not summary.exists():
            continue
        failed, inc = stalwart_incident(json.loads(summary.read_text()))
        if failed is not None and inc is not None:
            cell.phases = stalwart_phases(inc, failed, folder / "run")
            filled += 1
    return filled


def stalwart_phases(incident: dict[str, Any], failed: float, workdir: Path) -> dict[str, float]:
    """Seconds from the fault to each stage of the incident, and the stop-time checks' own seconds:
    per check request the slowest node's (the agents run their shares at once), 0 when none ran."""
    keys = {"detected": "detected_at", "restarted": "restarted_at", "first_step": "first_step_at"}
    phases = {name: incident[key] - failed for name, key in keys.items() if incident.get(key) is not None}
    checks: dict[str, float] = {}
    for log in workdir.glob("nodes/*/agent.log"):
        for line in log.read_text().splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if rec.get("msg") == "node checks done" and rec.get("ts", 0.0) >= failed and "seconds" in rec:
                request = str(rec.get("request"))
                checks[request] = max(checks.get(request, 0.0), float(rec["seconds"]))
    phases["checks"] = sum(checks.values())
    return phases


def stalwart_blocked(folder: Path) -> list[float]:
    """Stalwart's engine in the peers' loop, under torchrun, from .venv (train_stalwart_ckpt.py)."""
    folder.mkdir(parents=True)
    shm = Path(tempfile.mkdtemp(prefix="stalwart-peers-", dir="/dev/shm" if Path("/dev/shm").is_dir() else None))
    argv = [str(REPO / ".venv" / "bin" / "python"), "-m", "torch.distributed.run", "--standalone"]
    argv += ["--nproc-per-node", str(RANKS), str(PEERS / "train_stalwart_ckpt.py"), "--out", str(folder / "audit")]
    argv += ["--ckpt-dir", str(shm), "--steps", str(STEPS), "--interval", str(INTERVAL)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    try:
        subprocess.run(argv, env=env, cwd=str(PEERS), capture_output=True, timeout=RUN_TIMEOUT, check=True)
    finally:
        subprocess.run(["rm", "-rf", str(shm)], check=False)
    return [
        float(json.loads(line)["blocked"])
        for p in (folder / "audit").glob("ckpt-*.jsonl")
        for line in p.read_text().splitlines()
    ]


# ---------------------------------------------------------------------------------- NVRx probe
def probe_nvrx() -> str:
    proc = subprocess.run(
        [str(PEERS_VENV / "bin" / "python"), str(PEERS / "probe_nvrx.py")],
        env=peer_env(),
        cwd=str(PEERS),
        capture_output=True,
        text=True,
        timeout=300,
    )
    # The probe's own lines are on stdout; torch's and NVRx's warnings on stderr would bury them.
    return proc.stdout[-3000:] if proc.stdout.strip() else proc.stderr[-3000:]


CONFIGS = {
    "stalwart": (
        "`stalwart run` of examples/pretrain-tiny.yaml (2 nodes x 2 workers, one warm standby, warm worker "
        "processes, checkpoints every 10 steps to host memory (this node and a peer) then storage, heartbeat "
        "0.5 s, lease 5 s, hang timeout floor 4 s); the example's own deterministic loader on its shards."
    ),
    "torchrun": (
        "torch 2.13 `torch.distributed.run --nnodes 2 --nproc-per-node 2 --rdzv-backend c10d --max-restarts 3` "
        "per node (node 0 hosts the c10d store), with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: with the agent's "
        "store shared (the default since torch 2.5) the restarted workers read the previous round's gloo "
        "addresses and fail in `Gloo connectFullMesh failed ... Connection refused` (pytorch/pytorch#135712: "
        "the store's keys are separated by TORCHELASTIC_RESTART_COUNT, which each agent counts for itself); "
        "DCP `dcp.save` every 10 steps, `dcp.load` of the newest at start; the process group's timeout 10 s "
        "(torch's only hang detection: a hung rank fails its partners' next collective), "
        "bench/peers/train_torchrun.py. A hang's restart also waits for torchrun's stop of the hung "
        "worker: SIGTERM, then SIGKILL 30 s later (a stopped process cannot exit on SIGTERM)."
    ),
    "dlrover": (
        "dlrover 0.6.1: its job master (`dlrover.python.master.main --platform local --node_num 2`) and "
        "`dlrover-run --nnodes 2 --nproc_per_node 2 --max-restarts 3` per node (DLROVER_MASTER_ADDR, NODE_RANK); "
        "Flash Checkpoint (`DdpCheckpointer.save_checkpoint`) to shared memory every 10 steps and to disk every "
        "5th, `load_checkpoint` at start; the process group's timeout 10 s (bench/peers/train_dlrover.py). "
        "Its master's hang detector (`--hang_detection`, `--hang_downtime` in minutes, at least 2) reads the "
        "GPU timer's metrics, so on CPU a hang is noticed by the collective timeout. Its standalone mode fails "
        "on torch 2.13 (`SubprocessHandler.__init__() missing 1 required positional argument: 'numa_options'` "
        "in `_launch_dlrover_local_master`), hence the master started by hand."
    ),
    "torchft": (
        "torchft 0.2.0: the wheel's `torchft_lighthouse --min_replicas 1 --quorum_tick_ms 100 --join_timeout_ms "
        "10000` (heartbeat timeout 5 s, its default); 4 replica groups of 1 rank (2 per node), each under "
        "`torchrun --standalone --max-restarts 3`; Manager(min_replica_size=1, timeout 30 s, ProcessGroupGloo "
        "timeout 5 s: its train_ddp.py's), synchronous quorum, torchft's Optimizer wrapper and its "
        "DistributedDataParallel with one fix: 0.2.0's comm hook asserts a managed future "
        "(`assert fut._fut`, torchft/ddp.py:76, still so upstream) but the Manager returns a plain "
        "`_DummyWork` once an allreduce failed, so without the fix a peer's death crashes every healthy "
        "group; with it they skip the step and go on. A restarted group recovers the live state from a "
        "healthy peer; no periodic checkpoint (bench/peers/train_torchft.py). A hang: the gloo timeout fails "
        "the step and the lighthouse drops the silent group; nothing restarts the hung (alive) process."
    ),
    "nvrx": (
        "nvidia-resiliency-ext 0.4.1: probed on this machine (bench/peers/probe_nvrx.py): the in-process "
        "restart Wrapper (a 2-rank gloo job; then a hang with soft/hard timeouts of 10/20 s and a progress "
        "ping per step) and the local checkpoint manager; see below for what it said."
    ),
}

# What the peers publish, for the cells not measured here (NVRx: see CONFIGS and the probe).
NVRX_INPROCESS = "https://nvidia.github.io/nvidia-resiliency-ext/inprocess/index.html"
PUBLISHED: dict[tuple[str, str], str] = {
    ("nvrx", "kill-worker"): (
        "no figure in seconds published; the in-process restart 'removes overheads associated with launching "
        "a new scheduler job, starting a container, initializing a new Python interpreter, loading "
        f"dependencies, and creating a new CUDA context' ({NVRX_INPROCESS}); a SIGKILLed rank is not restarted "
        "in process: the Wrapper excludes it and needs a spare rank or the in-job restart (ft_launcher)"
    ),
    ("nvrx", "lost-node"): (
        "no figure in seconds published; a lost node's ranks are excluded by the in-process Wrapper, replaced "
        f"from warm spares by the in-job restart ({NVRX_INPROCESS}, "
        "https://github.com/NVIDIA/nvidia-resiliency-ext/releases/tag/v0.3.0: 'Warm spare support')"
    ),
    ("nvrx", "hang"): (
        "the Wrapper's documented defaults in 0.4.1 are soft_timeout 60 s, hard_timeout 90 s; the probe sets them "
        "to 10 s / 20 s and measures its in-process restart on a 2-rank job whose rank 1 stops making progress "
        "(a Python loop, not SIGSTOP, which would also stop the Wrapper's own monitor thread): see the probe's "
        f"output below; not this job, so not in the table ({NVRX_INPROCESS})"
    ),
    ("dlrover", "lost-node"): (
        "'Flash Checkpoint: The distributed training can recover failures from the in-memory checkpoint in "
        "seconds' (https://github.com/intelligent-machine-learning/dlrover); a lost node's memory copy is gone, "
        "its ranks load the newest disk copy"
    ),
}


def setup() -> None:
    """Create .venv-peers with this machine's torch (a dry run first: no CUDA wheel may come)."""
    python = "python3.11"
    if not PEERS_VENV.exists():
        subprocess.run([python, "-m", "venv", str(PEERS_VENV)], check=True)
    pip = [str(PEERS_VENV / "bin" / "pip"), "install", "-c", str(REPO / "constraints" / "cpu.txt")]
    wanted = ["torch==2.13.0", *(f"{k}=={v}" for k, v in PEER_VERSIONS.items() if k != "dlrover")]
    wanted += ["dlrover[k8s]==" + PEER_VERSIONS["dlrover"], "numpy"]  # its master imports kubernetes
    dry = subprocess.run([*pip, "--dry-run", *wanted], capture_output=True, text=True, check=True)
    if "nvidia-cu" in dry.stdout or "nvidia_cu" in dry.stdout:
        raise SystemExit(f"pip would fetch CUDA wheels; refusing:\n{dry.stdout[-2000:]}")
    subprocess.run([*pip, *wanted], check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--setup", action="store_true", help="create .venv-peers, then stop")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS))
    parser.add_argument("--faults", nargs="+", choices=FAULTS, default=list(FAULTS))
    parser.add_argument("--keep", type=Path, default=None, help="keep every run's folder under this folder")
    parser.add_argument(
        "--stop-at",
        default=None,
        help="UTC HH:MM after which no new run starts: the pass ends with the runs done so far, probed and reported",
    )
    parser.add_argument("--output", type=Path, default=RESULTS / "peers.md")
    parser.add_argument(
        "--report-from",
        type=Path,
        nargs="+",
        default=None,
        help="rebuild the report from these runs' .json (one run's, or several merged: e.g. a hang-only pass)",
    )
    parser.add_argument(
        "--drop",
        action="append",
        default=[],
        help="with --report-from: leave out PASS:SYSTEM:FAULT (cells that measured nothing; say why in --note)",
    )
    parser.add_argument(
        "--phases-from",
        action="append",
        default=[],
        help="with --report-from: PASS:DIR, the --keep folder of pass PASS, for Stalwart's recovery phases",
    )
    parser.add_argument("--probe-nvrx", action="store_true", help="with --report-from: probe NVRx again")
    parser.add_argument(
        "--note", action="append", default=[], help="a line for the report's head (what went wrong in a pass)"
    )
    args = parser.parse_args()
    if args.setup:
        setup()
        return
    if args.report_from:
        rebuild_report(args)
        return
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind: every run's processes are killed
    if not (PEERS_VENV / "bin" / "python").exists():
        raise SystemExit(f"{PEERS_VENV} is missing: run `.venv/bin/python bench/bench_peers.py --setup` first")
    from stalwart.spec import ALLOWED_PATHS_ENV

    os.environ[ALLOWED_PATHS_ENV] = str(EXAMPLE.parent)
    loads: list[float] = []

    def context(nvrx: str = "(the NVRx probe runs at the end of a pass)") -> dict[str, Any]:
        return {
            "command": "python bench/bench_peers.py"
            + (f" --repeats {args.repeats}" if args.repeats != 3 else "")
            + (f" --systems {' '.join(args.systems)}" if list(args.systems) != list(SYSTEMS) else "")
            + (f" --faults {' '.join(args.faults)}" if list(args.faults) != list(FAULTS) else ""),
            "measured_at": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
            "machine": f"{platform.node()}: {os.cpu_count()} cores, {platform.platform()}",
            "repeats": args.repeats,
            "systems": [*args.systems, "nvrx"],
            "load_min": min(loads),
            "load_median": statistics.median(loads),
            "load_max": max(loads),
            "nvrx_probe": nvrx,
            "notes": list(args.note),
        }

    stop_at = _utc_today(args.stop_at) if args.stop_at else None
    cells: list[Cell] = []
    clean: dict[str, dict[int, list[int]]] = {}
    blocked: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="stalwart-bench-peers-") as tmp:
        root = args.keep or Path(tmp)
        count = 0

        def one(system: str, fault: str | None) -> None:
            nonlocal count
            if stop_at is not None and time.time() > stop_at:
                return
            count += 1
            folder = root / f"{count:03d}-{system}-{fault or 'clean'}"
            if system == "stalwart":
                cell, ids = run_stalwart(fault, folder)
            else:
                cell, lines, saves = run_peer(system, fault, folder)
                ids = trained(lines)
                if fault is None:
                    blocked[system] = saves
            if fault is None:
                clean[system] = ids
            else:
                if cell.first_step is not None and clean.get(system):
                    cell.samples_equal = same_samples(ids, clean[system])
                elif cell.first_step is not None:
                    cell.note += "; no clean run to compare the samples with (it failed)"
                cells.append(cell)
            loads.extend([cell.load_before[0], cell.load_after[0]])
            if cells:  # the report so far: a pass cut short still leaves what it measured
                save(cells, blocked, context(), args.output)
            print(
                f"  {system:<9} {fault or 'clean':<12} first step {_s(cell.first_step):>8}  redone "
                f"{cell.steps_redone if cell.steps_redone is not None else '-':>3}  samples "
                f"{cell.samples_equal}  load {cell.load_before[0]:.2f}->{cell.load_after[0]:.2f}  {cell.note}",
                flush=True,
            )

        print("clean runs (the reference samples, the checkpoint blocked time):", flush=True)
        for system in args.systems:
            one(system, None)
        if "stalwart" in args.systems and (stop_at is None or time.time() < stop_at):
            blocked["stalwart"] = stalwart_blocked(root / "stalwart-ckpt")
            save(cells, blocked, context(), args.output)
        for repeat in range(args.repeats):
            print(f"repeat {repeat + 1}/{args.repeats}:", flush=True)
            for fault in args.faults:
                for system in args.systems:
                    one(system, fault)
    save(cells, blocked, context(probe_nvrx()), args.output)


def rebuild_report(args: argparse.Namespace) -> None:
    """--report-from: merge passes' .json, fill Stalwart's phases, drop cells, add notes; write both."""
    cells, blocked, context = merge_runs([json.loads(p.read_text()) for p in args.report_from])
    for spec in args.phases_from:  # PASS:DIR, PASS the index of the .json in --report-from
        index, _, runs = spec.partition(":")
        print(f"phases of {backfill_phases(cells, int(index), Path(runs))} Stalwart runs from {runs}")
    for spec in args.drop:  # PASS:SYSTEM:FAULT, PASS the index of the .json in --report-from
        index, system, fault = spec.split(":")
        cells = [c for c in cells if not (c.pass_index == int(index) and (c.system, c.fault) == (system, fault))]
    context["notes"] = [*context.get("notes", []), *args.note]
    if args.probe_nvrx:
        context["nvrx_probe"] = probe_nvrx()
    save(cells, blocked, context, args.output)  # the merged cells too: a later --report-from reads them


def _utc_today(hhmm: str) -> float:
    """The epoch time of HH:MM UTC today (tomorrow when that is already past by more than 12 hours)."""
    try:
        hours, minutes = (int(x) for x in hhmm.split(":"))
    except ValueError:
        raise SystemExit(f"--stop-at {hhmm!r}: expected HH:MM (UTC)") from None
    now = time.time()
    day = now - now % 86400
    at = day + hours * 3600 + minutes * 60
    return at + 86400 if at < now - 12 * 3600 else at


def save(cells: list[Cell], blocked: dict[str, list[float]], context: dict[str, Any], output: Path) -> None:
    output.with_suffix(".json").write_text(
        json.dumps({"context": context, "cells": [asdict(c) for c in cells], "blocked": blocked}, indent=1) + "\n"
    )
    write_report(cells, blocked, context, output)


def merge_runs(runs: Sequence[dict[str, Any]]) -> tuple[list[Cell], dict[str, list[float]], dict[str, Any]]:
    """Several passes' .json as one: every cell, the last listed pass's blocked times per system, the
    load over all of them, every command."""
    cells = [Cell(**{**c, "pass_index": i}) for i, run in enumerate(runs) for c in run["cells"]]
    blocked: dict[str, list[float]] = {}
    for run in runs:  # the newest pass that measured a system's saves wins (e.g. a blocked-time pass)
        blocked.update({system: values for system, values in run["blocked"].items() if values})
    contexts = [run["context"] for run in runs]
    context = dict(contexts[0])
    context["command"] = "`, `".join(c["command"] for c in contexts)
    context["measured_at"] = ", ".join(c["measured_at"] for c in contexts)
    context["repeats"] = "/".join(str(c["repeats"]) for c in contexts)
    context["systems"] = list(dict.fromkeys(s for c in contexts for s in c["systems"]))
    probes = [c["nvrx_probe"] for c in contexts if "torch " in c.get("nvrx_probe", "")]  # a pass that probed
    context["nvrx_probe"] = probes[-1] if probes else context.get("nvrx_probe", "")
    context["load_min"] = min(c["load_min"] for c in contexts)
    context["load_max"] = max(c["load_max"] for c in contexts)
    context["load_median"] = statistics.median(c["load_median"] for c in contexts)
    return cells, blocked, context


def write_report(cells: Sequence[Cell], blocked: dict[str, list[float]], context: dict[str, Any], out: Path) -> None:
    report = build_report(cells, blocked, context, PUBLISHED, CONFIGS)
    out.write_text(report)
    print(report)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
