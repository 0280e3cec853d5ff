"""`-o table|wide|json|yaml|jsonpath=...`, `--watch` and `-n` of the read commands, over a real etcd.

Two jobs: `out-plain` (a `stalwart run` job, namespace default) and `out-ml` submitted in namespace
`ml` (its etcd id `ml.out-ml`). A watch is driven by the test through the reads it makes: the test
changes the job once a read saw the previous state, and ends a watch that never ends by itself the
way a person does, with Ctrl-C (a KeyboardInterrupt in the main thread).
"""

from __future__ import annotations

import _thread
import functools
import json
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import typer
import yaml
from typer.testing import CliRunner

from stalwart.cli.main import app
from stalwart.cli.output import Output, OutputFormat, parse_output, render_jsonpath
from stalwart.ops.reading import EtcdReader
from stalwart.spec.model import FailureEvent
from stalwart.store import Store, keys
from stalwart.store.etcd_server import EtcdServer
from stalwart.store.records import (
    Assignment,
    Heartbeat,
    Incident,
    JobPhase,
    JobState,
    NodeAssignment,
    NodeRegistration,
    WorkerState,
    WorkerStatus,
)

PLAIN = "out-plain"
ML = "ml.out-ml"
runner = CliRunner()


def state(job: str, phase: JobPhase = JobPhase.RUNNING, restarts: int = 0) -> JobState:
    now = time.time()
    return JobState(
        job=job, phase=phase, generation=1, slots=["node-a"], created_at=now - 60, updated_at=now, restarts=restarts
    )


@pytest.fixture(scope="module")
def store(etcd: EtcdServer) -> Iterator[Store]:
    s = Store(etcd.endpoint)
    now = time.time()
    for job, namespace in ((PLAIN, "default"), (ML, "ml")):
        s.delete_prefix(keys.job_prefix(job))
        s.put(
            keys.job_spec(job), json.dumps({"kind": "TrainingJob", "metadata": {"name": job, "namespace": namespace}})
        )
        s.put(keys.job_state(job), state(job))
        s.put(
            keys.generation(job, 1),
            Assignment(
                job=job,
                generation=1,
                world_size=1,
                master_addr="127.0.0.1",
                master_port=1,
                created_at=now,
                nodes=[NodeAssignment(node="node-a", node_rank=0, role="trainer", first_rank=0, local_world_size=1)],
            ),
        )
        s.put(
            keys.node_registration(job, "node-a"),
            NodeRegistration(node="node-a", job=job, host="host-a", agent_pid=1, registered_at=now, lease_id=1),
        )
        worker = WorkerStatus(
            local_rank=0, rank=0, pid=4242, step=10, state=WorkerState.RUNNING, started_at=now
        )  # no progress yet: "starting" whatever the clock says, so a watch sees only the test's changes
        s.put(keys.node_heartbeat(job, "node-a"), Heartbeat(node="node-a", generation=1, sent_at=now, workers=[worker]))
    s.put(
        keys.incident(ML, "inc-0001-cccccc"),
        Incident(
            id="inc-0001-cccccc",
            job=ML,
            failure_class=FailureEvent.WORKER_CRASH,
            generation=1,
            node="node-a",
            rank=0,
            exit_code=1,
            action="restart",
            failed_at=now - 30,
            detected_at=now - 29,
        ),
    )
    yield s
    for job in (PLAIN, ML):
        s.delete_prefix(keys.job_prefix(job))
    s.close()


def stalwart(store: Store, *args: str) -> Any:
    return runner.invoke(app, [*args, "--etcd", store.endpoint], env={"COLUMNS": "200"})


def test_output_formats_parse_as_kubectl_spells_them() -> None:
    assert parse_output("table") == Output()
    assert parse_output("WIDE").format is OutputFormat.WIDE
    assert parse_output("yaml").format is OutputFormat.YAML
    assert parse_output("jsonpath={.items[*].job}") == Output(OutputFormat.JSONPATH, "{.items[*].job}")
    for bad, says in (
        ("xml", "not an output format"),
        ("jsonpath", "needs a template"),
        ("json=x", "takes no"),
        ("jsonpath={range .items[*]}{.job}{end}", "not supported"),
        ("jsonpath={.items[}", "not a JSONPath"),
    ):
        with pytest.raises(typer.BadParameter, match=says):
            parse_output(bad)


def test_jsonpath_sees_a_list_as_kubectl_does() -> None:
    rows = [{"job": "a", "phase": "Running", "ranks": [0, 1]}, {"job": "b", "phase": "Failed", "ranks": []}]
    assert render_jsonpath("{.items[*].job}", rows) == "a b"
    assert render_jsonpath('{.items[?(@.phase=="Failed")].job}', rows) == "b"
    assert render_jsonpath('{.items[0].job}{"\\t"}{.items[0].ranks}', rows) == "a\t[0, 1]"
    assert render_jsonpath("phase={.phase}", {"phase": "Running"}) == "phase=Running"


def test_json_yaml_and_jsonpath_are_the_same_typed_rows(store: Store) -> None:
    as_json = json.loads(stalwart(store, "jobs", "-o", "json").stdout)
    as_yaml = yaml.safe_load(stalwart(store, "jobs", "-o", "yaml").stdout)
    assert as_yaml == [{**row, "age_seconds": as_yaml[i]["age_seconds"]} for i, row in enumerate(as_json)]
    mine = {r["job"]: r for r in as_json if r["job"] in (PLAIN, ML)}
    assert mine[ML]["namespace"] == "ml" and mine[PLAIN]["namespace"] == "default"
    names = stalwart(store, "jobs", "-o", "jsonpath={.items[*].job}").stdout.split()
    assert {PLAIN, ML} <= set(names) and names == [r["job"] for r in as_json]


def test_wide_adds_columns_to_the_table(store: Store) -> None:
    table = stalwart(store, "jobs").stdout
    wide = stalwart(store, "jobs", "-o", "wide").stdout
    assert "namespace" not in table and "tokens/s" not in table
    assert "namespace" in wide and "tokens/s" in wide and "reason" in wide
    status_wide = stalwart(store, "status", PLAIN, "-o", "wide").stdout
    assert "pid" in status_wide and "4242" in status_wide
    assert "pid" not in stalwart(store, "status", PLAIN).stdout
    assert "policy" in stalwart(store, "incidents", "-o", "wide").stdout
    assert "faults" in stalwart(store, "node", "list", "-o", "wide").stdout


def test_namespace_qualifies_the_job_and_filters_listings(store: Store) -> None:
    assert stalwart(store, "status", "out-ml", "-n", "ml", "-o", "jsonpath={.job}").stdout.strip() == ML
    listed = stalwart(store, "jobs", "-n", "ml", "-o", "jsonpath={.items[*].job}")
    assert listed.stdout.split() == [ML]
    assert "reads etcd, not the Kubernetes API" not in listed.stderr  # it reads either (ops.reading)
    incidents = yaml.safe_load(stalwart(store, "incidents", "-n", "ml", "-o", "yaml").stdout)
    assert [i["id"] for i in incidents] == ["inc-0001-cccccc"]
    assert yaml.safe_load(stalwart(store, "incidents", "-n", "elsewhere", "-o", "yaml").stdout) == []
    machines = json.loads(stalwart(store, "node", "list", "-n", "ml", "-o", "json").stdout)
    assert {m["job"] for m in machines} == {ML}
    help_text = runner.invoke(app, ["logs", "--help"], env={"COLUMNS": "200"}).stdout
    assert "reads etcd only" in help_text


def reads_seen(monkeypatch: pytest.MonkeyPatch, module: Any, name: str) -> tuple[list[Any], threading.Condition]:
    """Wrap the command's ops reader: every result it returns is recorded, and waiters are told."""
    seen: list[Any] = []
    changed = threading.Condition()
    reader: Callable[..., Any] = getattr(module, name)

    def recording(*args: Any) -> Any:
        value = reader(*args)
        with changed:
            seen.append(value)
            changed.notify_all()
        return value

    monkeypatch.setattr(module, name, recording)
    return seen, changed


def driver(
    seen: list[Any], changed: threading.Condition, steps: list[tuple[Callable[[Any], bool], Callable[[], None]]]
):  # type: ignore[no-untyped-def]
    """A thread that waits until a read satisfies each step's condition, then does the step's change."""

    def any_read(condition: Callable[[Any], bool]) -> bool:
        return any(condition(v) for v in seen)

    def run() -> None:
        for condition, act in steps:
            with changed:
                changed.wait_for(functools.partial(any_read, condition), timeout=60)
            act()

    thread = threading.Thread(target=run, name="watch-driver", daemon=True)
    thread.start()
    return thread


def test_status_watch_redraws_on_change_and_ends_when_the_job_finishes(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen, changed = reads_seen(monkeypatch, EtcdReader, "status")
    thread = driver(
        seen,
        changed,
        [
            (lambda r: r.restarts == 0, lambda: store.put(keys.job_state(PLAIN), state(PLAIN, restarts=1))),
            (
                lambda r: r.restarts == 1,
                lambda: store.put(keys.job_state(PLAIN), state(PLAIN, JobPhase.SUCCEEDED, restarts=1)),
            ),
        ],
    )
    try:
        result = stalwart(store, "status", PLAIN, "-w", "-o", 'jsonpath={.phase} {.restarts}{"\\n"}')
    finally:
        thread.join(timeout=60)
        store.put(keys.job_state(PLAIN), state(PLAIN))
    assert result.exit_code == 0, result.output
    # One document per change; the reads in between that changed nothing printed nothing.
    assert [line for line in result.stdout.splitlines() if line] == ["Running 0", "Running 1", "Succeeded 1"]
    assert len(seen) >= 3


def test_jobs_watch_prints_each_change_until_ctrl_c(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    seen, changed = reads_seen(monkeypatch, EtcdReader, "jobs")

    def phase(rows: list[Any]) -> str:
        return next(r.phase.value for r in rows if r.job == ML)

    thread = driver(
        seen,
        changed,
        [
            (lambda rows: phase(rows) == "Running", lambda: store.put(keys.job_state(ML), state(ML, JobPhase.FAILED))),
            (lambda rows: phase(rows) == "Failed", _thread.interrupt_main),
        ],
    )
    # interrupt_main acts as a Ctrl-C only where SIGINT raises KeyboardInterrupt: an earlier test in
    # this worker, or the xdist worker itself, may have left the signal ignored.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        result = stalwart(store, "jobs", "-n", "ml", "--watch", "--watch-timeout", "240", "-o", "json")
    finally:
        signal.signal(signal.SIGINT, previous)
        thread.join(timeout=60)
        store.put(keys.job_state(ML), state(ML))
    assert result.exit_code == 0, result.output
    assert [[r["phase"] for r in d] for d in json_documents(result.stdout)] == [["Running"], ["Failed"]]


def json_documents(text: str) -> list[Any]:
    """The JSON documents printed one after another."""
    decoder = json.JSONDecoder()
    documents, pos = [], 0
    while text[pos:].strip():
        pos += len(text[pos:]) - len(text[pos:].lstrip())
        document, pos = decoder.raw_decode(text, pos)
        documents.append(document)
    return documents


def test_a_watch_timeout_bounds_the_watch(store: Store) -> None:
    result = stalwart(store, "jobs", "-w", "--watch-timeout", "0", "-o", "jsonpath={.items[*].job}")
    assert result.exit_code == 0, result.output
    assert ML in result.stdout.split()


def test_every_on_call_command_takes_the_same_namespace_option() -> None:
    """The commands that reach the Kubernetes API (every acting one, and jobs, status and incidents:
    stalwart.ops.reading) share one help; the ones that read etcd only say so."""
    from stalwart.cli.job_actions import NAMESPACE_HELP

    root = typer.main.get_command(app)
    ctx = root.make_context("stalwart", ["version"])
    kubernetes = ["suspend", "resume", "check", "node evict", "node cordon", "node uncordon"]
    kubernetes += ["jobs", "status", "incidents"]
    etcd_only = ["incident", "logs", "diagnose", "node list"]
    for path in kubernetes + etcd_only:
        command: Any = root
        for part in path.split():
            command = command.get_command(ctx, part)
        option = next(p for p in command.params if "--namespace" in p.opts)
        assert option.opts == ["--namespace", "-n"], path
        if path in kubernetes:
            assert option.help == NAMESPACE_HELP, path
        else:
            assert "reads etcd only" in option.help, path
