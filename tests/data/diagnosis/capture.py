"""Capture the diagnosis fault corpus from real runs (run by hand; the results are committed).

Every case is a real multi-process gloo run on loopback with a fault injected: the 3D-parallel
emulation (emulate_3d.py, Megatron's names and rank order) or the example job
(examples/pretrain_tiny.py). Stacks are captured with stalwart.agents.stacks, the production
capture path (py-spy --native, or the worker SDK's faulthandler), so their format is what the
diagnosis service sees in production. Ranks are placed on emulated nodes, `--rpn` consecutive
ranks per node (node-0, node-1, ...), and every case is labeled with the machine(s) at fault.

    .venv/bin/python tests/data/diagnosis/capture.py list
    .venv/bin/python tests/data/diagnosis/capture.py run NAME [NAME ...]   # (re)capture some cases
    .venv/bin/python tests/data/diagnosis/capture.py missing                # the cases not captured yet
    .venv/bin/python tests/data/diagnosis/capture.py compose                # the machine faults, from real parts
    .venv/bin/python tests/data/diagnosis/capture.py all                    # every case, ~20-40 minutes

Output: corpus/cases/NAME.json (the evidence bundle, stack texts by reference, and the labels) and
corpus/stacks.json.gz (every distinct stack text once, the process id templated out).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from tempfile import TemporaryDirectory

from stalwart.agents.stacks import StackDump, StackTarget, capture_stacks, recapture
from stalwart.net import free_port
from stalwart.processes import spawn, stop_process, wait_for

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
CORPUS = HERE / "corpus"
EMULATE = HERE / "emulate_3d.py"
EXAMPLE = REPO / "examples" / "pretrain_tiny.py"
PID_MARK = "<<pid>>"
LOG_TAIL = 40


@dataclass
class Scenario:
    name: str
    kind: str  # hang | slowdown | crash | metrics
    description: str
    tp: int = 1
    pp: int = 1
    dp: int = 2
    rpn: int = 2  # ranks per emulated node
    fault: str = "none"
    rank: int = -1
    more_ranks: list[int] = field(default_factory=list)  # further faulty ranks (several machines at once)
    step: int = 4
    script: str = "emulate"  # emulate | example
    method: str = "py-spy"  # py-spy | faulthandler
    extra: list[str] = field(default_factory=list)
    throttle: float = 0.0  # SIGSTOP duty cycle for the faulty rank (CPU throttling), 0..1
    nice: int = 0  # the faulty rank's niceness: at 19 on a busy host the kernel starves it of CPU
    truncate: int = 0  # bytes: the first capture is cut there, and the agent's recapture takes it again
    faulty_nodes: list[str] | None = None  # default: the faulty rank's node (none for user code)
    failure_class: str = ""
    blame: str = ""

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.dp

    def node_of(self, rank: int) -> str:
        return f"node-{rank // self.rpn}"


# ----------------------------------------------------------------------------------- launching
class Run:
    """N real ranks of a script, each with its own log; stopped (all of them) on exit."""

    def __init__(self, sc: Scenario, workdir: Path, timeout: float = 600.0) -> None:
        self.sc = sc
        self.dir = workdir
        self.out = workdir / "out"
        self.out.mkdir(parents=True, exist_ok=True)
        port = free_port()
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: list[Path] = []
        for rank in range(sc.world):
            env = {
                **os.environ,
                "RANK": str(rank),
                "WORLD_SIZE": str(sc.world),
                "LOCAL_RANK": str(rank % sc.rpn),
                "LOCAL_WORLD_SIZE": str(sc.rpn),
                "GROUP_RANK": str(rank // sc.rpn),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                "OMP_NUM_THREADS": "1",
                "PYTHONWARNINGS": "ignore",
                "PYTHONFAULTHANDLER": "1",
            }
            if sc.script == "emulate":
                argv = [
                    sys.executable,
                    str(EMULATE),
                    "--tp",
                    str(sc.tp),
                    "--pp",
                    str(sc.pp),
                    "--dp",
                    str(sc.dp),
                    "--fault",
                    sc.fault,
                    "--fault-rank",
                    ",".join(map(str, [sc.rank, *sc.more_ranks])),
                    "--fault-step",
                    str(sc.step),
                    "--out",
                    str(self.out),
                    "--timeout",
                    str(timeout),
                    *sc.extra,
                ]
                if sc.method == "faulthandler":
                    argv.append("--sdk")
            else:
                env["STALWART_CHECKPOINT_URI"] = str(workdir / "ckpt")
                argv = [sys.executable, str(EXAMPLE), *sc.extra]
            log = workdir / f"rank-{rank}.log"
            with open(log, "wb") as f:
                self.procs.append(spawn(argv, env=env, cwd=workdir, stdout=f))
            self.logs.append(log)

    def progress(self) -> list[int]:
        out = []
        for r in range(self.sc.world):
            p = self.out / f"progress-rank-{r}"
            try:
                out.append(int(p.read_text() or 0))
            except (OSError, ValueError):
                out.append(0)
        return out

    def wait_stalled(self, at_least: int, quiet: float = 3.0, timeout: float = 180.0) -> None:
        """Until every rank has passed step `at_least` and none has progressed for `quiet` seconds."""
        last, since = None, time.monotonic()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            now = self.progress()
            if any(p.poll() is not None for p in self.procs):
                raise RuntimeError(f"a rank exited early:\n{self.tail(0)}")
            if now != last:
                last, since = now, time.monotonic()
            elif min(now) >= at_least and time.monotonic() - since >= quiet:
                return
            time.sleep(0.2)
        raise TimeoutError(f"the run never stalled: progress {last}")

    def wait_progress(self, step: int, timeout: float = 180.0) -> None:
        if not wait_for(lambda: min(self.progress()) >= step, timeout, 0.2):
            raise TimeoutError(f"no rank reached step {step}: {self.progress()}")

    def stacks(self, native: bool = True) -> list[StackDump]:
        methods = ("faulthandler",) if self.sc.method == "faulthandler" else ("py-spy",)
        targets = [StackTarget(pid=p.pid, rank=r, log_path=self.logs[r]) for r, p in enumerate(self.procs)]
        if self.sc.truncate:  # cut short, then taken again as the agent does (py-spy --native)
            first = capture_stacks(targets, timeout=60, methods=methods, native=False, max_bytes=self.sc.truncate)
            return recapture(first, targets, timeout=60, max_bytes=self.sc.truncate)
        dumps = capture_stacks(targets, timeout=60, methods=methods, native=native)
        bad = [d for d in dumps if not d.text]
        if bad:
            raise RuntimeError(f"stack capture failed: {[(d.rank, d.error) for d in bad]}")
        return dumps

    def wait_exit(self, timeout: float) -> list[int | None]:
        deadline = time.monotonic() + timeout
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        return [p.poll() for p in self.procs]

    def tail(self, rank: int, n: int = LOG_TAIL) -> list[str]:
        text = self.logs[rank].read_text(errors="replace")
        return text.splitlines()[-n:]

    def stop(self) -> None:
        for p in self.procs:
            stop_process(p, grace=2)


# ------------------------------------------------------------------------------------ recording
class Texts:
    """Every distinct stack text once (gzip JSON), the pid replaced by a marker."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.items: dict[str, str] = {}
        if path.exists():
            self.items = json.loads(gzip.decompress(path.read_bytes()))

    def add(self, text: str, pid: int) -> str:
        templ = text.replace(str(pid), PID_MARK)
        key = hashlib.sha1(templ.encode()).hexdigest()[:12]
        self.items[key] = templ
        return key

    def save(self, keep: set[str]) -> None:
        items = {k: v for k, v in sorted(self.items.items()) if k in keep}
        self.path.write_bytes(gzip.compress(json.dumps(items, indent=0).encode(), mtime=0))


def dump_case(doc: dict) -> str:  # type: ignore[type-arg]
    """JSON that diffs well and stays small: one line per key, per stack row, per round, per log, per node."""

    def compact(v: object) -> str:
        return json.dumps(v, separators=(",", ":"), ensure_ascii=False)

    out = ["{"]
    items = list(doc.items())
    for i, (key, value) in enumerate(items):
        end = "," if i < len(items) - 1 else ""
        if isinstance(value, list) and value and isinstance(value[0], (dict, list)):
            rows = ",\n  ".join(compact(v) for v in value)
            out.append(f" {json.dumps(key)}: [\n  {rows}\n ]{end}")
        else:
            out.append(f" {json.dumps(key)}: {compact(value)}{end}")
    out.append("}")
    return "\n".join(out) + "\n"


def stack_rows(dumps: list[StackDump], sc: Scenario, texts: Texts) -> list[dict]:  # type: ignore[type-arg]
    return [
        {
            "rank": d.rank,
            "node": sc.node_of(d.rank or 0),
            "method": d.method.value,
            "pid": d.pid,
            "text_ref": texts.add(d.text, d.pid),
        }
        for d in dumps
    ]


def node_series(run: Run, sc: Scenario, skip: int = 2) -> list[dict]:  # type: ignore[type-arg]
    """Per-node metric series from the ranks' per-step records, aggregated as a heartbeat's vector is:
    step time mean and max over the node's ranks, tokens/s summed, CPU % mean, compute time mean and max
    (and data and optimizer time, where the run recorded them)."""
    rows: dict[int, list[dict]] = {}  # type: ignore[type-arg]
    for r in range(sc.world):
        p = run.out / f"metrics-rank-{r}.jsonl"
        rows[r] = [json.loads(x) for x in p.read_text().splitlines() if x.strip()] if p.exists() else []
    steps = min(len(v) for v in rows.values())
    tokens = 64 * 64 * 2  # HIDDEN x HIDDEN x MICRO_BATCHES per rank per step
    nodes: dict[str, list[int]] = {}
    for r in range(sc.world):
        nodes.setdefault(sc.node_of(r), []).append(r)
    out = []
    for node, ranks in nodes.items():
        names = (
            "step_time_s",
            "step_time_max_s",
            "tokens_per_second",
            "cpu_percent",
            "compute_time_s",
            "compute_time_max_s",
        )
        series: dict[str, list[float]] = {name: [] for name in names}
        for i in range(skip, steps):
            st = [rows[r][i]["step_time_s"] for r in ranks]
            series["step_time_s"].append(round(sum(st) / len(st), 6))
            series["step_time_max_s"].append(round(max(st), 6))
            series["tokens_per_second"].append(round(sum(tokens / s for s in st), 2))
            series["cpu_percent"].append(round(sum(rows[r][i]["cpu_percent"] for r in ranks) / len(ranks), 2))
            ct = [rows[r][i]["compute_time_s"] for r in ranks]
            series["compute_time_s"].append(round(sum(ct) / len(ct), 6))
            series["compute_time_max_s"].append(round(max(ct), 6))
            for phase in ("data", "optimizer"):  # own-work phases, where the run recorded them
                if all(f"{phase}_time_s" in rows[r][i] for r in ranks):
                    pt = [rows[r][i][f"{phase}_time_s"] for r in ranks]
                    series.setdefault(f"{phase}_time_s", []).append(round(sum(pt) / len(pt), 6))
                    series.setdefault(f"{phase}_time_max_s", []).append(round(max(pt), 6))
        out.append({"node": node, "series": series})
    return out


def case_doc(sc: Scenario, **evidence: object) -> dict:  # type: ignore[type-arg]
    user = sc.failure_class in ("user_code_error", "nan_loss") or (
        sc.fault == "none" and not sc.throttle and not sc.nice
    )
    every = [sc.rank, *sc.more_ranks]
    faulty = (
        sc.faulty_nodes
        if sc.faulty_nodes is not None
        else ([] if user else sorted({sc.node_of(r) for r in every}, key=lambda n: int(n.split("-")[1])))
    )
    nodes = sorted({sc.node_of(r) for r in range(sc.world)}, key=lambda n: int(n.split("-")[1]))
    return {
        "name": sc.name,
        "description": sc.description,
        "source": f"captured: tests/data/diagnosis/capture.py run {sc.name}",
        "captured_at": time.strftime("%Y-%m-%d"),
        "truth": {"faulty_nodes": faulty, "failure_class": sc.failure_class, "blame": sc.blame},
        "topology": {
            "world_size": sc.world,
            "tp": sc.tp,
            "pp": sc.pp,
            "dp": sc.dp,
            "rank_nodes": {str(r): sc.node_of(r) for r in range(sc.world)},
        },
        "nodes": nodes,
        "kind": sc.kind,
        "fault": {
            "kind": "throttle" if sc.throttle else "starve" if sc.nice else sc.fault,
            "rank": sc.rank,
            "more_ranks": sc.more_ranks,
            "step": sc.step,
            "method": sc.method,
            "throttle": sc.throttle,
        },
        **evidence,
    }


# ------------------------------------------------------------------------------------- scenarios
def capture_hang(sc: Scenario, run: Run, texts: Texts) -> dict:  # type: ignore[type-arg]
    if sc.script == "example":
        run_wait_example(run, 5)
        os.kill(run.procs[sc.rank].pid, signal.SIGUSR2)  # the worker SDK hangs it at its next step
        time.sleep(4.0)
    else:
        run.wait_stalled(sc.step - 1)
        if max(run.progress()) > sc.step:  # a fault that never fired: the job ran to its end
            raise RuntimeError(f"the fault did not stop the job: progress {run.progress()}")
    return case_doc(sc, stacks=stack_rows(run.stacks(), sc, texts))


def run_wait_example(run: Run, step: int) -> None:
    """The example job prints its step on rank 0 only: wait for that line."""

    def reached() -> bool:
        if any(p.poll() is not None for p in run.procs):
            raise RuntimeError("\n".join(run.tail(0)))
        return any(line.startswith("step ") and int(line.split()[1]) >= step for line in run.tail(0, 400))

    if not wait_for(reached, 240, 0.3):
        raise TimeoutError("the example job did not reach its step")


class Throttle(threading.Thread):
    """CPU throttling as a CFS quota does it: the process is stopped for part of every period."""

    def __init__(self, pid: int, duty: float, period: float = 0.1) -> None:
        super().__init__(daemon=True)
        self.pid, self.duty, self.period = pid, duty, period
        self.stop_event = threading.Event()
        self.hold = threading.Event()  # set: leave it running (py-spy cannot attach to a stopped process)
        self.idle = threading.Event()

    def run(self) -> None:
        while not self.stop_event.is_set():
            if self.hold.is_set():
                self.idle.set()
                time.sleep(0.01)
                continue
            self.idle.clear()
            try:
                os.kill(self.pid, signal.SIGSTOP)
                time.sleep(self.period * self.duty)
                os.kill(self.pid, signal.SIGCONT)
            except ProcessLookupError:
                return
            time.sleep(self.period * (1 - self.duty))

    def pause(self) -> None:
        """Keep the process running for a stack capture (a CFS-throttled one can be read; a stopped one not)."""
        self.hold.set()
        self.idle.wait(5)

    def stop(self) -> None:
        self.stop_event.set()
        self.join(timeout=5)
        try:
            os.kill(self.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass


def capture_slowdown(sc: Scenario, run: Run, texts: Texts, rounds: int = 5) -> dict:  # type: ignore[type-arg]
    run.wait_progress(sc.step)
    if sc.nice:
        os.setpriority(os.PRIO_PROCESS, run.procs[sc.rank].pid, sc.nice)
    throttle = Throttle(run.procs[sc.rank].pid, sc.throttle) if sc.throttle else None
    if throttle:
        throttle.start()
    try:
        start = min(run.progress())
        run.wait_progress(start + 12)
        rows = []
        for _ in range(rounds):  # plain py-spy: a native dump takes seconds, a round must be a moment
            if throttle:
                throttle.pause()
            try:
                rows.append(stack_rows(run.stacks(native=False), sc, texts))
            finally:
                if throttle:
                    throttle.hold.clear()
            time.sleep(0.5)
        run.wait_progress(min(run.progress()) + 6)
    finally:
        if throttle:
            throttle.stop()
    return case_doc(sc, rounds=rows, metrics=node_series(run, sc))


def capture_crash(sc: Scenario, run: Run, texts: Texts) -> dict:  # type: ignore[type-arg]
    if sc.fault == "kill":
        run.wait_progress(sc.step)
        os.kill(run.procs[sc.rank].pid, signal.SIGKILL)  # the machine is gone: no word from the process
    codes = run.wait_exit(90)
    logs = []
    for r, code in enumerate(codes):
        logs.append({"rank": r, "node": sc.node_of(r), "exit_code": code, "lines": run.tail(r)})
    return case_doc(sc, logs=logs)


CAPTURE: dict[str, Callable[[Scenario, Run, Texts], dict]] = {  # type: ignore[type-arg]
    "hang": capture_hang,
    "slowdown": capture_slowdown,
    "metrics": capture_slowdown,
    "crash": capture_crash,
}


def _hang(
    name: str, tp: int, pp: int, dp: int, rpn: int, fault: str, rank: int, what: str, method: str = "py-spy"
) -> Scenario:
    if fault == "sleep-data" and rank >= tp * dp:
        raise ValueError(f"{name}: only the first pipeline stage reads data; rank {rank} is not on it")
    return Scenario(
        name=name,
        kind="hang",
        tp=tp,
        pp=pp,
        dp=dp,
        rpn=rpn,
        fault=fault,
        rank=rank,
        method=method,
        description=f"TP={tp} PP={pp} DP={dp}, {rpn} ranks per node: rank {rank} {what}",
        failure_class="hang",
        blame="node",
    )


_SLEEP = "stalls in user code inside forward_step, before its TP all-reduce"
_DATA = "stalls in its data iterator before the step"
_OPT = "stalls before the data-parallel gradient all-reduce"
_RECV = "posts one pipeline receive too many (a message that never comes)"

SCENARIOS: list[Scenario] = [
    # hangs: different parallel shapes, ranks, pipeline stages and fault kinds
    _hang("hang-t2p4d2-sleep-r5", 2, 4, 2, 2, "sleep-forward", 5, _SLEEP),
    _hang("hang-t2p4d2-sleep-r12", 2, 4, 2, 4, "sleep-forward", 12, _SLEEP),
    _hang("hang-t2p4d2-recv-r10", 2, 4, 2, 2, "recv", 10, _RECV),
    _hang("hang-t2p4d2-recv-r1", 2, 4, 2, 2, "recv", 1, _RECV),
    _hang("hang-t2p2d4-data-r6", 2, 2, 4, 4, "sleep-data", 6, _DATA),
    _hang("hang-t2p2d4-opt-r11", 2, 2, 4, 2, "sleep-optimizer", 11, _OPT),
    _hang("hang-t1p4d4-sleep-r9", 1, 4, 4, 2, "sleep-forward", 9, _SLEEP),
    _hang("hang-t1p4d4-recv-r14", 1, 4, 4, 4, "recv", 14, _RECV),
    _hang("hang-t4p2d2-sleep-r3", 4, 2, 2, 4, "sleep-forward", 3, _SLEEP),
    _hang("hang-t4p2d2-opt-r13", 4, 2, 2, 4, "sleep-optimizer", 13, _OPT),
    _hang("hang-t1p8d2-sleep-r7", 1, 8, 2, 2, "sleep-forward", 7, _SLEEP),
    _hang("hang-t1p8d2-recv-r12", 1, 8, 2, 4, "recv", 12, _RECV),
    Scenario(
        name="hang-t2p2d2-truncated-r5",
        kind="hang",
        tp=2,
        pp=2,
        dp=2,
        rpn=2,
        fault="sleep-forward",
        rank=5,
        truncate=700,
        failure_class="hang",
        blame="node",
        description="TP=2 PP=2 DP=2, 2 ranks per node: rank 5 "
        + _SLEEP
        + "; every first dump was cut at 700 bytes and taken again with py-spy --native (the agent's recapture)",
    ),
    _hang("hang-t2p4d1-sleep-r3", 2, 4, 1, 2, "sleep-forward", 3, _SLEEP),
    Scenario(
        name="hang-t2p2d4-node3-both",
        kind="hang",
        tp=2,
        pp=2,
        dp=4,
        rpn=2,
        fault="sleep-forward",
        rank=6,
        more_ranks=[7],
        failure_class="hang",
        blame="node",
        description="TP=2 PP=2 DP=4, 2 ranks per node: both ranks of node-3 stall (a machine-wide stall)",
    ),
    Scenario(
        name="hang-t1p4d4-two-r2-r13",
        kind="hang",
        tp=1,
        pp=4,
        dp=4,
        rpn=2,
        fault="sleep-forward",
        rank=2,
        more_ranks=[13],
        failure_class="hang",
        blame="node",
        description="TP=1 PP=4 DP=4, 2 ranks per node: ranks 2 and 13 (nodes 1 and 6) stall independently",
    ),
    _hang("hang-t2p2d2-fh-sleep-r2", 2, 2, 2, 2, "sleep-forward", 2, _SLEEP, method="faulthandler"),
    _hang("hang-t1p2d4-fh-recv-r5", 1, 2, 4, 2, "recv", 5, _RECV, method="faulthandler"),
    _hang("hang-t2p2d2-fh-data-r3", 2, 2, 2, 2, "sleep-data", 3, _DATA, method="faulthandler"),
    Scenario(
        name="hang-example-ddp-r1",
        kind="hang",
        dp=4,
        rpn=2,
        rank=1,
        script="example",
        fault="sdk-hang",
        extra=["--steps", "400"],
        failure_class="hang",
        blame="node",
        description="the example job (DDP, 4 ranks, 2 per node): the worker SDK hangs rank 1 (SIGUSR2)",
    ),
    Scenario(
        name="hang-example-ddp-r2",
        kind="hang",
        dp=4,
        rpn=2,
        rank=2,
        script="example",
        fault="sdk-hang",
        extra=["--steps", "400"],
        failure_class="hang",
        blame="node",
        description="the example job (DDP, 4 ranks, 2 per node): the worker SDK hangs rank 2 (SIGUSR2)",
    ),
    # slowdowns: stack rounds and per-step metrics
    Scenario(
        name="slow-t2p2d2-sleep-r5",
        kind="slowdown",
        tp=2,
        pp=2,
        dp=2,
        rpn=2,
        fault="slow",
        rank=5,
        extra=["--steps", "100000", "--slow-ms", "60"],
        failure_class="slowdown",
        blame="node",
        description="TP=2 PP=2 DP=2: rank 5's forward compute takes 60 ms longer (a slow GPU)",
    ),
    Scenario(
        name="slow-t1p2d4-sleep-r2",
        kind="slowdown",
        tp=1,
        pp=2,
        dp=4,
        rpn=2,
        fault="slow",
        rank=2,
        extra=["--steps", "100000", "--slow-ms", "40"],
        failure_class="slowdown",
        blame="node",
        description="TP=1 PP=2 DP=4: rank 2's forward compute takes 40 ms longer",
    ),
    Scenario(
        name="slow-t2p2d2-throttle-r3",
        kind="slowdown",
        tp=2,
        pp=2,
        dp=2,
        rpn=2,
        fault="none",
        rank=3,
        throttle=0.85,
        extra=["--steps", "100000", "--work", "8"],
        failure_class="slowdown",
        blame="node",
        description="TP=2 PP=2 DP=2, CPU-bound forward: rank 3 is CPU-throttled (stopped 85% of every 100 ms)",
    ),
    Scenario(
        name="slow-t1p2d4-starved-r6",
        kind="slowdown",
        tp=1,
        pp=2,
        dp=4,
        rpn=2,
        fault="none",
        rank=6,
        nice=19,
        extra=["--steps", "100000", "--work", "8"],
        failure_class="slowdown",
        blame="node",
        description="TP=1 PP=2 DP=4, CPU-bound forward: rank 6 is starved of CPU (nice 19 on a busy host)",
    ),
    Scenario(
        name="slow-t2p2d2-starved-r0",
        kind="slowdown",
        tp=2,
        pp=2,
        dp=2,
        rpn=2,
        fault="none",
        rank=0,
        nice=19,
        extra=["--steps", "100000", "--work", "8"],
        failure_class="slowdown",
        blame="node",
        description="TP=2 PP=2 DP=2, CPU-bound forward: rank 0 is starved of CPU (nice 19 on a busy host)",
    ),
    Scenario(
        name="slow-t2p2d2-data-r2",
        kind="slowdown",
        tp=2,
        pp=2,
        dp=2,
        rpn=2,
        fault="slow-data",
        rank=2,
        extra=["--steps", "100000", "--slow-ms", "30"],
        failure_class="slowdown",
        blame="node",
        description="TP=2 PP=2 DP=2: rank 2's data loader takes 30 ms longer per micro-batch (a slow filesystem)",
    ),
    Scenario(
        name="slow-t2p2d2-optimizer-r6",
        kind="slowdown",
        tp=2,
        pp=2,
        dp=2,
        rpn=2,
        fault="slow-optimizer",
        rank=6,
        extra=["--steps", "100000", "--slow-ms", "60"],
        failure_class="slowdown",
        blame="node",
        description="TP=2 PP=2 DP=2: rank 6's optimizer step takes 60 ms longer (an offloaded optimizer on a busy CPU)",
    ),
    Scenario(
        name="slow-t1p2d4-compute15-r5",
        kind="slowdown",
        tp=1,
        pp=2,
        dp=4,
        rpn=2,
        fault="slow",
        rank=5,
        extra=["--steps", "100000", "--slow-ms", "8"],
        failure_class="slowdown",
        blame="node",
        description="TP=1 PP=2 DP=4: rank 5's forward compute takes 8 ms more a micro-batch, 16 ms a step: "
        "about 1.5x the healthy step of this layout (33 ms, healthy-t1p2d4), a GPU throttled to two thirds",
    ),
    Scenario(
        name="healthy-t2p2d2",
        kind="slowdown",
        tp=2,
        pp=2,
        dp=2,
        rpn=2,
        extra=["--steps", "100000"],
        failure_class="none",
        blame="none",
        faulty_nodes=[],
        description="TP=2 PP=2 DP=2, no fault: nothing must be flagged",
    ),
    Scenario(
        name="healthy-t2p2d2-work",
        kind="slowdown",
        tp=2,
        pp=2,
        dp=2,
        rpn=2,
        extra=["--steps", "100000", "--work", "8"],
        failure_class="none",
        blame="none",
        faulty_nodes=[],
        description="TP=2 PP=2 DP=2, CPU-bound forward on a shared 2-core box, no fault: nothing must be flagged",
    ),
    Scenario(
        name="healthy-t1p2d4",
        kind="slowdown",
        tp=1,
        pp=2,
        dp=4,
        rpn=2,
        extra=["--steps", "100000"],
        failure_class="none",
        blame="none",
        faulty_nodes=[],
        description="TP=1 PP=2 DP=4, no fault: nothing must be flagged",
    ),
    # crashes
    Scenario(
        name="crash-user-exception-all",
        kind="crash",
        tp=2,
        pp=2,
        dp=2,
        rpn=2,
        fault="exception",
        step=3,
        extra=["--steps", "20", "--timeout", "20"],
        failure_class="user_code_error",
        blame="user_code",
        description="every rank raises the same IndexError (a learning-rate schedule too short)",
    ),
    Scenario(
        name="crash-user-exception-last-stage",
        kind="crash",
        tp=2,
        pp=2,
        dp=2,
        rpn=2,
        fault="exception-loss",
        step=3,
        extra=["--steps", "20", "--timeout", "20"],
        failure_class="user_code_error",
        blame="user_code",
        description="the last stage's ranks (4 ranks on 2 nodes) raise the same shape mismatch in the loss",
    ),
    Scenario(
        name="crash-user-exception-one",
        kind="crash",
        tp=1,
        pp=2,
        dp=2,
        rpn=2,
        fault="exception-one",
        rank=0,
        step=3,
        extra=["--steps", "20", "--timeout", "20"],
        failure_class="user_code_error",
        blame="user_code",
        description="rank 0 alone raises a KeyError in its data pipeline; the others lose their peer",
    ),
    Scenario(
        name="crash-nan",
        kind="crash",
        tp=2,
        pp=2,
        dp=2,
        rpn=2,
        fault="nan",
        rank=0,
        step=3,
        extra=["--steps", "20", "--timeout", "20"],
        failure_class="nan_loss",
        blame="job",
        description="a batch with inf values makes the loss NaN; every rank raises FloatingPointError",
    ),
    Scenario(
        name="crash-disk-full-r3",
        kind="crash",
        tp=2,
        pp=2,
        dp=2,
        rpn=2,
        fault="disk-full",
        rank=3,
        step=3,
        extra=["--steps", "20", "--timeout", "20"],
        failure_class="disk_full",
        blame="node",
        description="rank 3 writes its checkpoint shard to a full disk (/dev/full: ENOSPC)",
    ),
    Scenario(
        name="crash-segfault-r6",
        kind="crash",
        tp=2,
        pp=2,
        dp=2,
        rpn=2,
        fault="segfault",
        rank=6,
        step=3,
        extra=["--steps", "20", "--timeout", "20"],
        failure_class="segfault",
        blame="job",
        faulty_nodes=[],
        description="rank 6 dereferences NULL in native code (the code's bug, not the machine's)",
    ),
    Scenario(
        name="crash-kill-r5",
        kind="crash",
        tp=2,
        pp=2,
        dp=2,
        rpn=2,
        fault="kill",
        rank=5,
        step=3,
        extra=["--steps", "100000", "--timeout", "20"],
        failure_class="unknown",
        blame="node",
        description="rank 5's process vanishes (SIGKILL, no word in its log): its machine went away",
    ),
    Scenario(
        name="crash-example-nan",
        kind="crash",
        dp=2,
        rpn=1,
        script="example",
        fault="nan",
        extra=["--steps", "60", "--lr", "1e6"],
        failure_class="nan_loss",
        blame="job",
        description="the example job with a learning rate of 1e6: the loss becomes NaN on every rank",
    ),
    Scenario(
        name="crash-example-lr-overflow",
        kind="crash",
        dp=2,
        rpn=1,
        script="example",
        fault="exception",
        extra=["--steps", "60", "--lr", "1e38"],
        failure_class="user_code_error",
        blame="user_code",
        description="the example job with a learning rate of 1e38: Adam's update overflows float on every "
        "rank (a configuration error, before any NaN)",
    ),
    Scenario(
        name="crash-example-user-exception",
        kind="crash",
        dp=2,
        rpn=1,
        script="example",
        fault="exception",
        extra=["--steps", "20", "--shards", "/nonexistent/*.stok"],
        failure_class="user_code_error",
        blame="user_code",
        description="the example job pointed at token shards that do not exist",
    ),
]


# ------------------------------------------------------------------------------------ composition
# Machine faults a CPU box cannot produce (Xid, ECC, a GPU out of memory) are composed from real
# parts: the real logs of a real run whose rank was killed or raised, with that rank's last line (or
# its node's kernel log) replaced by a line recorded on a real machine with the fault (the signature
# database's samples and tests/data/health, each with its source).
HEALTH = REPO / "tests" / "data" / "health" / "kernel-log"
ECC_LINE = "RuntimeError: CUDA error: uncorrectable ECC error encountered"  # vllm-project/vllm#5222
ILLEGAL_LINE = "RuntimeError: CUDA error: an illegal memory access was encountered"  # VITA-Group/TEGNAS#19
OOM_LINE = (
    "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 22.00 MiB. GPU 0 has a total capacity "
    "of 23.65 GiB of which 11.06 MiB is free. Including non-PyTorch memory, this process has 23.60 GiB memory "
    "in use. Of the allocated memory 22.90 GiB is allocated by PyTorch, and 194.87 MiB is reserved by PyTorch "
    "but unallocated. If reserved but unallocated memory is large try setting "
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory "
    "Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
)  # pytorch#16417


def _traceback_with(lines: list[str], last: str) -> list[str]:
    """A real traceback (from a real run's log) whose exception line is `last`."""
    start = max(i for i, line in enumerate(lines) if "Traceback (most recent call last)" in line)
    prefix = lines[start].split("Traceback")[0]
    body = [line for line in lines[start:] if line.startswith(prefix)]
    return [*body[:-1], prefix + last]


def compose() -> None:
    cases = CORPUS / "cases"
    kill = json.loads((cases / "crash-kill-r5.json").read_text())
    one = json.loads((cases / "crash-user-exception-one.json").read_text())
    everyone = json.loads((cases / "crash-user-exception-all.json").read_text())
    real_tb = one["logs"][0]["lines"]  # rank 0's real traceback, "[rank0]: " prefixed
    victim = 5

    def variant(base: dict, name: str, description: str, source: str, truth: dict, logs: list[dict]) -> None:  # type: ignore[type-arg]
        doc = {
            **base,
            "name": name,
            "description": description,
            "truth": truth,
            "logs": logs,
            "source": f"composed: the real logs of {base['name']}; {source}",
            "fault": {**base.get("fault", {}), "kind": name.split("-")[1]},
        }
        (cases / f"{name}.json").write_text(dump_case(doc))
        print(f"{name}: composed")

    def replace(base: dict, rank: int, **fields: object) -> list[dict]:  # type: ignore[type-arg]
        return [{**log, **fields} if log["rank"] == rank else log for log in base["logs"]]

    tb = [line.replace("[rank0]", f"[rank{victim}]") for line in real_tb]
    xid79 = (HEALTH / "gpud-xid79-sxid.log").read_text().splitlines()
    xid48 = (HEALTH / "gpu-operator-1146-xid48-xid64.log").read_text().splitlines()
    oom = (HEALTH / "oom-docker-for-linux-1001.log").read_text().splitlines()
    node = kill["topology"]["rank_nodes"][str(victim)]
    machine = {"faulty_nodes": [node], "blame": "node"}
    variant(
        kill,
        "crash-xid79-r5",
        "rank 5's GPU fell off the bus (Xid 79 in its node's kernel log); its CUDA call "
        "failed and the other ranks lost their peer",
        "rank 5 ends in the illegal-memory-access line recorded in "
        "VITA-Group/TEGNAS#19, its kernel log is tests/data/health/kernel-log/gpud-xid79-sxid.log",
        {**machine, "failure_class": "xid"},
        replace(kill, victim, exit_code=1, lines=_traceback_with(tb, ILLEGAL_LINE), kernel_log=xid79),
    )
    variant(
        kill,
        "crash-xid48-r5",
        "rank 5 was killed while its node's kernel logged Xid 48 (double-bit ECC)",
        "rank 5 stays the real SIGKILLed rank, with the kernel log tests/data/health/kernel-log/"
        "gpu-operator-1146-xid48-xid64.log",
        {**machine, "failure_class": "xid"},
        replace(kill, victim, kernel_log=xid48),
    )
    variant(
        kill,
        "crash-ecc-r5",
        "rank 5 hit an uncorrectable ECC error",
        "rank 5's traceback ends in the line recorded in vllm-project/vllm#5222",
        {**machine, "failure_class": "ecc_error"},
        replace(kill, victim, exit_code=1, lines=_traceback_with(tb, ECC_LINE)),
    )
    variant(
        kill,
        "crash-cuda-error-r5",
        "rank 5 alone hit an illegal memory access (its GPU)",
        "rank 5's traceback ends in the line recorded in VITA-Group/TEGNAS#19",
        {**machine, "failure_class": "cuda_error"},
        replace(kill, victim, exit_code=1, lines=_traceback_with(tb, ILLEGAL_LINE)),
    )
    variant(
        kill,
        "crash-gpu-oom-r5",
        "rank 5 ran out of GPU memory (the job's size, not the machine)",
        "rank 5's traceback ends in the line recorded in pytorch/pytorch#16417",
        {"faulty_nodes": [], "blame": "user_code", "failure_class": "gpu_oom"},
        replace(kill, victim, exit_code=1, lines=_traceback_with(tb, OOM_LINE)),
    )
    variant(
        kill,
        "crash-cpu-oom-r5",
        "the kernel's OOM killer killed rank 5 (the job's host memory use)",
        "rank 5 stays the real SIGKILLed rank, with the kernel log tests/data/health/kernel-log/"
        "oom-docker-for-linux-1001.log",
        {"faulty_nodes": [], "blame": "user_code", "failure_class": "cpu_oom"},
        replace(kill, victim, kernel_log=oom),
    )
    every = [{**log, "lines": _traceback_with(log["lines"], ILLEGAL_LINE)} for log in everyone["logs"]]
    variant(
        everyone,
        "crash-cuda-error-all",
        "every rank hit the same illegal memory access: the code, not a GPU",
        "every rank's real traceback ends in the line recorded in VITA-Group/TEGNAS#19",
        {"faulty_nodes": [], "blame": "user_code", "failure_class": "cuda_error"},
        every,
    )


def capture(sc: Scenario, texts: Texts) -> dict:  # type: ignore[type-arg]
    with TemporaryDirectory(prefix=f"capture-{sc.name}-") as tmp:
        timeout = 20.0 if sc.kind == "crash" else 600.0
        run = Run(sc, Path(tmp), timeout=timeout)
        try:
            return CAPTURE[sc.kind](sc, run, texts)
        finally:
            run.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["list", "run", "all", "missing", "relabel", "compose"])
    parser.add_argument("names", nargs="*")
    args = parser.parse_args()
    by_name = {s.name: s for s in SCENARIOS}
    if args.command == "list":
        for s in SCENARIOS:
            print(f"{s.name:34} {s.kind:9} {s.description}")
        return
    if args.command == "compose":
        compose()
        return
    if args.command == "relabel":  # labels and descriptions from SCENARIOS, evidence kept as captured
        for f in sorted((CORPUS / "cases").glob("*.json")):
            doc = json.loads(f.read_text())
            if doc["name"] in by_name and doc["source"].startswith("captured"):
                fresh = case_doc(by_name[doc["name"]])
                doc.update({k: fresh[k] for k in ("description", "truth", "fault", "topology", "nodes", "kind")})
            f.write_text(dump_case(doc))
        return
    names = list(by_name) if args.command == "all" else args.names
    if args.command == "missing":
        names = [n for n in by_name if not (CORPUS / "cases" / f"{n}.json").exists()]
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise SystemExit(f"unknown scenarios: {unknown}")
    (CORPUS / "cases").mkdir(parents=True, exist_ok=True)
    texts = Texts(CORPUS / "stacks.json.gz")
    failed = []
    for name in names:
        t0 = time.monotonic()
        try:
            doc = capture(by_name[name], texts)
        except Exception as exc:  # one failed capture must not cost the others
            failed.append(name)
            print(f"{name}: FAILED after {time.monotonic() - t0:.0f}s: {exc!r}"[:2000], flush=True)
            continue
        (CORPUS / "cases" / f"{name}.json").write_text(dump_case(doc))
        texts.save(set(texts.items))
        print(f"{name}: captured in {time.monotonic() - t0:.0f}s", flush=True)
    used: set[str] = set()
    for f in (CORPUS / "cases").glob("*.json"):
        doc = json.loads(f.read_text())
        for row in doc.get("stacks", []) + [r for rnd in doc.get("rounds", []) for r in rnd]:
            used.add(row["text_ref"])
    texts.save(used)
    if failed:
        raise SystemExit(f"failed: {failed}")


if __name__ == "__main__":
    main()
