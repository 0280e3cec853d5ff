"""The worker SDK in a training process: no grpc, the loss check, phase times, fault hooks only on request."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from stalwart import worker_contract as contract
from stalwart.agents.worker_sdk import layout, report_step
from stalwart.signatures import classify_exit


def run(code: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("STALWART_")}
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env={**clean, **(env or {})}
    )


def test_a_training_process_imports_no_grpc_and_no_fault_code() -> None:
    """The acceptance check, verbatim; and under an agent (the SDK installs itself at import) with no
    fault injected, neither the etcd client nor the faults package is loaded, no fault signal handled."""
    out = run("import stalwart.agents.worker_sdk, sys; assert 'grpc' not in sys.modules")
    assert out.returncode == 0, out.stderr
    out = run(
        "import signal, sys, stalwart.agents.worker_sdk\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('grpc', 'pyetcd', 'etcd3', 'torch')"
        " or m in ('stalwart.store.client', 'stalwart.faults')))\n"
        "print(signal.getsignal(signal.SIGUSR2) is signal.SIG_DFL)\n",
        {contract.PROGRESS_SOCKET: "/nonexistent"},
    )
    assert out.stdout.split() == ["[]", "True"], out.stdout + out.stderr


@pytest.mark.parametrize("loss", [float("nan"), float("inf"), -float("inf")])
def test_a_nan_or_infinite_loss_raises_the_nan_failure_the_signatures_classify(loss: float) -> None:
    with pytest.raises(FloatingPointError) as info:
        report_step(45, loss=loss)
    line = f"FloatingPointError: {info.value}"  # the last line of the worker's traceback
    assert line.startswith("FloatingPointError: loss is ")
    assert classify_exit(1, ["Traceback (most recent call last):", line]).failure_class == "nan_loss"


def test_step_reports_carry_the_phase_times(tmp_path: Path) -> None:
    path = str(tmp_path / "progress.sock")
    inbox = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    inbox.bind(path)
    inbox.settimeout(30)
    try:
        out = run(
            "import time\n"
            "from stalwart.agents.worker_sdk import StepTimer\n"
            "timer = StepTimer()\n"
            "for step in (1, 2):\n"
            "    with timer.phase('data'):\n"
            "        time.sleep(0.02)\n"
            "    with timer.phase('compute'):\n"
            "        pass\n"
            "    with timer.phase('comm'):\n"
            "        pass\n"
            "    time.sleep(0.05)  # in no phase: 'other'\n"
            "    timer.report(step, loss=2.5, tokens=64)\n",
            {contract.PROGRESS_SOCKET: path, contract.RANK: "3", contract.LOCAL_RANK: "1", contract.GENERATION: "4"},
        )
        assert out.returncode == 0, out.stderr
        reports: list[dict[str, Any]] = []
        while len(reports) < 2:  # a datagram holds one report or several, a line each
            reports += [json.loads(line) for line in inbox.recv(65536).splitlines()]
        first, second = reports
    finally:
        inbox.close()
    assert (second["rank"], second["local_rank"], second["generation"], second["step"]) == (3, 1, 4, 2)
    phases = second["phases"]
    assert phases["data"] >= 0.02 and phases["compute"] >= 0 and phases["comm"] >= 0
    assert phases["optimizer"] is None  # not measured
    assert phases["other"] >= 0.05 and first["phases"]["other"] is None  # no previous step to measure from
    assert second["step_time"] >= phases["data"]


def test_fault_hooks_load_when_the_environment_names_faults() -> None:
    out = run(
        "import signal, sys\n"
        "from stalwart.agents.worker_sdk import report_step\n"
        "print('armed', 'stalwart.faults' in sys.modules, signal.getsignal(signal.SIGUSR2) is not signal.SIG_DFL)\n"
        "for step in range(1, 10):\n"
        "    report_step(step)\n"
        "    print('stepped', step, flush=True)\n",
        {contract.PROGRESS_SOCKET: "/nonexistent", contract.FAULT_HOOKS: '{"signals": true, "crash_after_steps": 3}'},
    )
    assert out.stdout.split()[:3] == ["armed", "True", "True"], out.stdout + out.stderr
    assert out.returncode == 134 and out.stdout.split().count("stepped") == 2  # a silent death at step 3


def test_the_layout_comes_from_the_worker_contract() -> None:
    assert layout({"WORLD_SIZE": "8"}) == (1, 1, 1, 1, 8)
    assert layout({"WORLD_SIZE": "8", "STALWART_TP": "2", "STALWART_PP": "2"}) == (2, 2, 1, 1, 2)
    assert layout({"WORLD_SIZE": "4", "STALWART_TP": "2", "STALWART_DP": "1", "STALWART_PP": "2"}).dp == 1


def test_the_sample_log_keeps_each_steps_newest_generation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Generation 1 trains steps 1-3 and dies mid-line; generation 2 resumes at step 3 (its checkpoint
    was step 2): step 3 counts once, with generation 2's samples."""
    from stalwart.agents.worker_sdk import SampleLog, trained_samples

    for rank, generation, steps in ((0, 1, (1, 2, 3)), (1, 1, (1, 2, 3)), (0, 2, (3, 4)), (1, 2, (3, 4))):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("STALWART_GENERATION", str(generation))
        log = SampleLog(tmp_path)
        for step in steps:
            offset = 100 * generation if step == 3 else 0
            log.write(step, [10 * step + rank + offset])
        log.close()
    with (tmp_path / "rank-0.jsonl").open("a") as f:
        f.write('{"step": 4, "gener')  # a worker killed in the middle of a line
    assert trained_samples(tmp_path) == {1: [10, 11], 2: [20, 21], 3: [230, 231], 4: [40, 41]}
    SampleLog(None).write(1, [1])  # outside an audit: nothing written, nothing raised
