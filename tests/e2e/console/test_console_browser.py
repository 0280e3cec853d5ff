"""The console in a real browser (Debian's Chromium, headless, driven by Playwright) against a real job.

One job run and one browser serve the whole module, in order: `stalwart run` with a hang injected
(rank 1 at step 30) and a warm standby; `stalwart console` in front of the same etcd, identifying
people from the headers a trusted authenticating proxy would add. The tests follow the job:

  1. the hang's incident appears on an open incidents page, without a reload, with its verdict and runbook;
  2. every page renders for the live job: the rank grid, the logs following live, stacks now with a verdict;
  3. a viewer cannot act (no buttons, the confirmation page and a POST are refused);
  4. an operator evicts a node through the confirmation page: it moves out of the job, a standby takes
     its ranks, and the audit trail shows who, when, why and the controller's answer;
  5. cordons a node (in etcd, shown on its card; it keeps its ranks), then uncordons it;
  6. runs the checks on a node: the controller's verdict appears in the audit trail;
  7. suspends the job (its nodes stop: Suspended, a grey stretch on the timeline), then resumes it: a
     new generation trains on from the newest checkpoint;
  8. a worker is killed (maxRestarts 0: the job fails): every page renders for the finished job;
  9. no request of the browser's went to any host but the console.

Every action goes through the page's own link, its confirmation page and the controller, and each
leaves one audit entry (who, how identified, why) with the controller's answer.

STALWART_SCREENSHOTS=DIR writes a screenshot of each page there (docs/console is the one the docs use).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.paths import REPO
from typer.testing import CliRunner

from stalwart.cli.main import app
from stalwart.net import free_port
from stalwart.processes import spawn, stop_process, wait_for
from stalwart.store import Store, keys
from stalwart.store.etcd_server import EtcdServer
from stalwart.store.nodes import read_nodes
from stalwart.store.records import (
    AuditEntry,
    CheckpointEntry,
    Cordon,
    Incident,
    JobPhase,
    JobStage,
    JobState,
    OperatorRequest,
    RequestStatus,
    WorkerStatus,
)

playwright_sync = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")

JOB_FILE = REPO / "tests" / "data" / "console" / "console-job.yaml"
JOB = "console-e2e"
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
OPERATOR = {"X-Forwarded-User": "olga", "X-Forwarded-Groups": "ml-team,sre"}
VIEWER = {"X-Forwarded-User": "vera", "X-Forwarded-Groups": "ml-team"}
SLOW = 600_000  # ms: what a starved 2-core machine may need (a job start, a recovery); the waits end on the state
SHOTS = os.environ.get("STALWART_SCREENSHOTS")

# One job serves the module: a test that waits for a recovery on a loaded machine needs more than 300 s.
pytestmark = pytest.mark.timeout(900)

if not CHROMIUM.exists():
    pytest.skip("Debian's chromium is not installed (make install installs it as root)", allow_module_level=True)


@dataclass
class World:
    store: Store
    base: str
    run_log: Path
    endpoint: str  # etcd's
    requests: list[str] = field(default_factory=list)


def state(store: Store) -> JobState | None:
    return store.get(keys.job_state(JOB), JobState)


def incidents(store: Store) -> list[Incident]:
    return sorted(store.get_prefix(keys.incidents_prefix(JOB), Incident), key=lambda i: i.failed_at)


def current_workers(store: Store) -> list[WorkerStatus]:
    s = state(store)
    beats = read_nodes(store, JOB).heartbeats.values()
    return [w for b in beats if s is not None and b.generation == s.generation for w in b.workers]


def training(store: Store, after: float = 0.0) -> bool:
    """Running, every rank of the current generation stepping, and (when `after`) a step since then."""
    s = state(store)
    if s is None or s.phase.value != "Running":
        return False
    workers = current_workers(store)
    return len(workers) == 4 and all(w.step is not None and (w.last_progress_at or 0) > after for w in workers)


def catalog(store: Store) -> list[CheckpointEntry]:
    return sorted(store.get_prefix(keys.checkpoints_prefix(JOB), CheckpointEntry), key=lambda c: -c.step)


def audit(store: Store) -> dict[str, AuditEntry]:
    return {e.id: e for e in store.get_prefix(keys.audit_prefix(JOB), AuditEntry)}


def confirm(page: Any, link: Any, button: str, reason: str) -> str:
    """Follow an action's link, give the reason on its confirmation page and confirm: the id of the audit
    entry the console wrote (the job page it comes back to names it)."""
    link.click()
    page.locator("section.confirm").wait_for()
    page.fill("#reason", reason)
    page.get_by_role("button", name=button, exact=True).click()
    page.wait_for_url(f"**/jobs/{JOB}?done=*")
    return str(page.url.split("done=", 1)[1].split("#", 1)[0])


def shot(page: Any, name: str) -> None:
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(SHOTS) / f"{name}.png"), full_page=True)


@pytest.fixture(scope="module")
def world(etcd: EtcdServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    store = Store(etcd.endpoint)
    store.delete_prefix(keys.job_prefix(JOB))
    workdir = tmp_path_factory.mktemp("console-e2e")
    port = free_port()
    stalwart_cmd = [sys.executable, "-m", "stalwart.cli.main"]
    console_argv = [*stalwart_cmd, "console", "--etcd", etcd.endpoint, "--port", str(port), "--refresh", "1"]
    console_argv += ["--trust-proxy", "127.0.0.1/32", "--operator-group", "sre", "--sample-seconds", "1"]
    run_argv = [*stalwart_cmd, "run", str(JOB_FILE), "--etcd", etcd.endpoint, "--workdir", str(workdir / "run")]
    run_argv += ["--inject", "hang-worker:rank=1,step=30", "--timeout", "3000"]
    with open(workdir / "console.log", "wb") as console_out:
        console = spawn(console_argv, stdout=console_out)
    run = None
    try:
        base = f"http://127.0.0.1:{port}"

        def serving() -> bool:
            try:
                return http.get(f"{base}/healthz").status_code == 200
            except httpx.HTTPError:
                return console.poll() is not None

        with httpx.Client(timeout=2) as http:  # one client for the polls: each `httpx.get` builds a TLS context
            up = wait_for(serving, 60, interval=0.2)
        assert up and console.poll() is None, (workdir / "console.log").read_text()
        with open(workdir / "run.out", "wb") as run_out:
            run = spawn(run_argv, stdout=run_out)
        yield World(store, base, workdir / "run.out", etcd.endpoint)
    finally:
        if run is not None:
            stop_process(run, grace=60)
        stop_process(console, grace=10)
        store.close()


@pytest.fixture(scope="module")
def browser(world: World) -> Iterator[Any]:
    with playwright_sync.sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


def context(browser: Any, world: World, headers: dict[str, str], **options: Any) -> Any:
    ctx = browser.new_context(extra_http_headers=headers, timezone_id="Asia/Tokyo", **options)
    ctx.on("request", lambda r: world.requests.append(r.url))
    ctx.set_default_timeout(SLOW)
    return ctx


@pytest.fixture(scope="module")
def operator(browser: Any, world: World) -> Iterator[Any]:
    ctx = context(browser, world, OPERATOR, viewport={"width": 1400, "height": 1000})
    yield ctx
    ctx.close()


@pytest.fixture(scope="module")
def viewer(browser: Any, world: World) -> Iterator[Any]:
    ctx = context(browser, world, VIEWER, viewport={"width": 390, "height": 844})  # a phone
    yield ctx
    ctx.close()


def unchanged(page: Any) -> bool:
    """The page was not reloaded since mark(page): what changed came in through htmx."""
    return bool(page.evaluate("window.__stalwartMark === 1"))


def mark(page: Any) -> None:
    page.evaluate("window.__stalwartMark = 1")


# -- 1. the incident appears live --------------------------------------------------------------------
def test_the_incident_appears_live_with_its_verdict_and_runbook(world: World, operator: Any) -> None:
    assert wait_for(lambda: state(world.store) is not None, 60, interval=0.2), "the job was never submitted"
    page = operator.new_page()
    page.goto(f"{world.base}/incidents?job={JOB}")
    if incidents(world.store):
        pytest.fail("the hang struck before the page was open: nothing left to see arrive")
    assert "no incidents in job" in page.inner_text("main")
    mark(page)

    def recorded_or_over() -> bool:
        s = state(world.store)
        return bool(incidents(world.store)) or (s is not None and s.phase.terminal)

    # The page is not reloaded: it is the store the test polls, to stop at once if the job ends instead.
    assert wait_for(recorded_or_over, 600, interval=0.5), "no incident, and the job is still running"
    s = state(world.store)
    assert incidents(world.store), f"the job ended with no incident: {s and s.reason}: {s and s.message}"
    card = page.locator("article.incident").first
    card.locator(".verdict").wait_for()  # the controller records the incident with its diagnosis
    hang = incidents(world.store)[0]
    text = card.inner_text()
    # What the controller recorded, as it recorded it: on a starved machine the diagnosis may get too
    # few stacks to name a node, and the controller then restarts in place instead of evicting.
    assert hang.failure_class.value == "Hang" and "Hang" in text, text
    assert hang.action in text and all(s in text for s in hang.suspects), text
    verdict = hang.verdict or {}
    assert str(verdict.get("failure_class")) in text and ("stack groups" in text) == bool(verdict.get("stack_groups"))
    assert "detected" in text and "restarted" in text and "first step" in text
    runbook = card.locator("details.runbook .markdown")
    assert runbook.is_visible() and "hang" in runbook.inner_text().lower()
    assert unchanged(page)
    # Times in the viewer's zone (the context is in Tokyo), not UTC.
    first_time = page.locator("time").first.inner_text()
    assert "UTC" not in first_time and ("GMT+9" in first_time or "JST" in first_time), first_time
    shot(page, "incidents")
    page.close()


# -- 2. every page of the live job ---------------------------------------------------------------------
def test_every_page_renders_for_the_live_job(world: World, operator: Any) -> None:
    hang = incidents(world.store)[0]
    assert wait_for(lambda: training(world.store, after=hang.failed_at + 1), 600, interval=0.5), "never recovered"
    page = operator.new_page()
    page.goto(f"{world.base}/jobs")
    row = page.locator(f"tr:has(a[href='/jobs/{JOB}'])")
    assert "Running" in row.inner_text() and "research" in row.inner_text() and "0 + 1 infra" in row.inner_text()
    shot(page, "jobs")

    page.goto(f"{world.base}/jobs/{JOB}")
    assert page.locator(".node").count() == 2 and page.locator("li.rank").count() == 4
    assert page.locator("li.rank.health-ok").count() >= 1
    grid = page.locator(".grid").inner_text()
    s = state(world.store)
    assert s is not None and all(n in grid for n in s.slots) and not any(n in grid for n in s.evicted), grid
    page.locator("rect.seg-down").first.wait_for(state="attached")  # the hang's downtime on the timeline
    assert "Sampled by this console" in page.inner_text("main")
    page.locator("p.reported:has-text('newest checkpoint: step')").wait_for()  # what the ranks saved

    # The catalog the controller writes from the saves the agents report: the spec's keepLast (2) newest
    # steps, each on a multiple of the interval, with its tiers, size and folder; the page shows them.
    # A step enters the catalog once its memory tier is committed; its file tier follows when the
    # background write finishes: wait for a catalog whose every step is on disk too. (The job trains on:
    # a newer step may enter, in memory only, at any moment after.)
    def on_disk() -> bool:
        entries = catalog(world.store)
        return bool(entries) and all(c.bytes and "file" in c.tiers for c in entries)

    assert wait_for(on_disk, 600, interval=0.5), f"no catalog with every step on disk: {catalog(world.store)}"
    entries = catalog(world.store)
    assert 1 <= len(entries) <= 2 and all(c.step % 10 == 0 for c in entries), entries
    assert all(c.tiers and c.uri.endswith(f"step-{c.step:010d}") for c in entries), entries
    assert any("file" in c.tiers for c in entries) and all(c.bytes for c in entries if "file" in c.tiers), entries
    # The page, once every row it shows has its size: a newer step may have entered since, in memory
    # first (about a second a checkpoint here), its file and size a moment later.
    rows = page.locator("section.card:has(h2:text-is('Checkpoints')) tbody tr")
    seen: list[list[list[str]]] = []

    def sizes_shown() -> bool:
        page.reload()
        rows.first.wait_for()
        seen.append(rows.evaluate_all("rows => rows.map(r => [...r.cells].map(c => c.innerText.trim()))"))
        return all("B" in r[2] for r in seen[-1])

    assert wait_for(sizes_shown, 600, interval=0.5), seen[-3:]
    shown = seen[-1]
    assert 1 <= len(shown) <= 2 and all(int(r[0]) % 10 == 0 for r in shown), shown
    assert all("file" in r[1] or "memory" in r[1] for r in shown) and any("file" in r[1] for r in shown), shown
    # `stalwart status` names the newest of them.
    status = CliRunner().invoke(app, ["status", JOB, "-o", "json", "--etcd", world.endpoint])
    assert status.exit_code == 0, status.output
    last = json.loads(status.stdout)["last_checkpoint"]
    assert last is not None and last["step"] % 10 == 0 and last["tiers"], last
    page.locator("svg.chart polyline").first.wait_for(state="attached")  # enough samples for a line
    shot(page, "job")

    page.goto(f"{world.base}/jobs/{JOB}/incidents/{hang.id}")
    assert "Runbook" in page.inner_text("main") and "Hang" in page.inner_text("main")
    shot(page, "incident")

    page.goto(f"{world.base}/jobs/{JOB}/logs?rank=0")
    log = page.locator("pre.log")
    log.wait_for()
    page.wait_for_function("document.querySelector('pre.log').textContent.includes('step ')")
    mark(page)
    before = log.inner_text()
    page.wait_for_function(
        "([before]) => document.querySelector('pre.log') && document.querySelector('pre.log').textContent !== before",
        arg=[before],
    )
    assert unchanged(page)  # the tail followed the job without a reload
    shot(page, "logs")

    page.goto(f"{world.base}/jobs/{JOB}/stacks")
    page.get_by_role("button", name="Capture stacks now").click()
    page.locator("#stacks .verdict").wait_for()
    assert "stack groups" in page.locator("#stacks").inner_text()
    assert "diagnosed by" in page.locator("#stacks").inner_text()
    shot(page, "stacks")
    page.close()


# -- 3. a viewer --------------------------------------------------------------------------------------
def test_a_viewer_sees_everything_and_cannot_act(world: World, viewer: Any) -> None:
    page = viewer.new_page()
    page.goto(f"{world.base}/jobs/{JOB}")
    page.locator("li.rank").first.wait_for()
    assert page.locator("a:has-text('Evict')").count() == 0 and page.locator("a:has-text('Suspend')").count() == 0
    # A phone-sized screen: nothing wider than the screen but the tables' own scrollers.
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1")
    shot(page, "job-phone")
    node = state(world.store).slots[1]  # type: ignore[union-attr]
    refused = page.goto(f"{world.base}/jobs/{JOB}/actions/evict?node={node}")
    assert refused is not None and refused.status == 403 and "may view but not act" in page.inner_text("main")
    posted = viewer.request.post(f"{world.base}/jobs/{JOB}/actions/evict", form={"node": node, "reason": "x"})
    assert posted.status == 403
    assert not world.store.get_prefix(keys.requests_prefix(JOB), OperatorRequest)
    page.close()


# -- 4. evict from the console ----------------------------------------------------------------------------
def test_evict_with_confirmation_moves_the_node_out_and_is_audited(world: World, operator: Any) -> None:
    def ready() -> bool:
        s = state(world.store)
        registered = read_nodes(world.store, JOB).registrations
        return s is not None and training(world.store) and any(n in registered for n in s.standbys)

    assert wait_for(ready, 600, interval=0.5), "no registered standby to take the node's ranks"
    s = state(world.store)
    assert s is not None
    target, standby = s.slots[1], s.standbys[0]
    page = operator.new_page()
    page.goto(f"{world.base}/jobs/{JOB}")
    page.locator(f".node:has(strong:text-is('{target}')) a:has-text('Evict')").click()
    assert page.url.endswith(f"/jobs/{JOB}/actions/evict?node={target}")
    assert f"Evict {target} in {JOB}?" in page.inner_text("h1")
    shot(page, "confirm")
    page.fill("#reason", "ECC errors rising on this machine")
    page.get_by_role("button", name=f"Evict {target}").click()
    page.wait_for_url(f"**/jobs/{JOB}?done=*")
    mark(page)
    audit = page.locator("#audit")
    assert "olga" in audit.inner_text() and "ECC errors rising on this machine" in audit.inner_text()
    audit.locator(".status-done").wait_for()  # the controller's answer, arriving live
    page.locator(f".grid .node:has(strong:text-is('{standby}'))").wait_for()  # the standby holds the ranks now
    assert page.locator(f".grid .node:has(strong:text-is('{target}'))").count() == 0
    assert unchanged(page)
    after = state(world.store)
    assert after is not None and target in after.evicted and standby in after.slots
    [entry] = world.store.get_prefix(keys.audit_prefix(JOB), AuditEntry)
    assert (entry.action, entry.node, entry.actor, entry.via) == ("evict", target, "olga", "proxy")
    request = world.store.get(keys.request(JOB, entry.request_id or "-"), OperatorRequest)
    assert request is not None and request.status is RequestStatus.DONE, request
    shot(page, "job-after-evict")
    page.close()


# -- 5. cordon, then uncordon ----------------------------------------------------------------------------
def test_cordon_then_uncordon_a_node_and_both_are_audited(world: World, operator: Any) -> None:
    assert wait_for(lambda: training(world.store), 600, interval=0.5), "not training after the eviction"
    s = state(world.store)
    assert s is not None
    target = s.slots[0]
    card = f".grid .node:has(strong:text-is('{target}'))"
    page = operator.new_page()
    page.goto(f"{world.base}/jobs/{JOB}")
    cordoned = confirm(page, page.locator(f"{card} a:text-is('Cordon')"), f"Cordon {target}", "NIC flaps; look first")
    mark(page)
    page.locator(f"#audit tr[id='{cordoned}'] .status-done").wait_for()  # the controller's answer, live
    page.locator(f"{card} .badge.cordon").wait_for()
    cordon = world.store.get(keys.cordon(target), Cordon)
    assert cordon is not None and cordon.by == "olga (console)" and cordon.reason == "NIC flaps; look first", cordon
    after = state(world.store)
    assert after is not None and target in after.slots and target not in after.evicted  # it keeps its ranks
    assert unchanged(page)
    shot(page, "job-cordoned")

    uncordoned = confirm(page, page.locator(f"{card} a:text-is('Uncordon')"), f"Uncordon {target}", "NIC swapped")
    mark(page)
    page.locator(f"#audit tr[id='{uncordoned}'] .status-done").wait_for()
    page.locator(f"{card} .badge.cordon").wait_for(state="detached")
    assert world.store.get(keys.cordon(target), Cordon) is None
    assert page.locator(f"{card} a:text-is('Cordon')").count() == 1 and unchanged(page)
    entries = audit(world.store)
    expected = {cordoned: ("cordon", "NIC flaps; look first"), uncordoned: ("uncordon", "NIC swapped")}
    for entry_id, (action, why) in expected.items():
        entry = entries[entry_id]
        assert (entry.action, entry.node, entry.reason) == (action, target, why)
        assert (entry.actor, entry.via) == ("olga", "proxy")
        request = world.store.get(keys.request(JOB, entry.request_id or "-"), OperatorRequest)
        assert request is not None and request.status is RequestStatus.DONE, request
    page.close()


# -- 6. the checks ------------------------------------------------------------------------------------------
def test_run_the_checks_on_a_node_and_see_their_results(world: World, operator: Any) -> None:
    """One node's checks (2 processes; the whole job's are the same request with no node, in the unit tests)."""
    s = state(world.store)
    assert s is not None
    target = s.slots[-1]
    page = operator.new_page()
    page.goto(f"{world.base}/jobs/{JOB}")
    link = page.locator(f".grid .node:has(strong:text-is('{target}')) a:text-is('Run checks')")
    checked = confirm(page, link, f"Check {target}", "nightly health check")
    row = page.locator(f"#audit tr[id='{checked}']")
    row.locator(".status-done, .status-failed").wait_for()  # the checks run as real processes: wait for them
    entry = audit(world.store)[checked]
    assert (entry.action, entry.node, entry.actor, entry.reason) == ("check", target, "olga", "nightly health check")
    request = world.store.get(keys.request(JOB, entry.request_id or "-"), OperatorRequest)
    assert request is not None and request.status is RequestStatus.DONE and request.result, request
    assert set(request.result) == {target} and request.result[target]["passed"] is True, request.result
    text = row.inner_text()
    assert "1/1 nodes passed" in text and f"{target}: passed" in text, text
    shot(page, "job-checked")
    page.close()


# -- 7. suspend, then resume ---------------------------------------------------------------------------------
def test_suspend_then_resume_and_the_job_trains_on_from_its_checkpoint(world: World, operator: Any) -> None:
    def saved() -> int | None:
        """The newest step every running rank has checkpointed."""
        steps = [w.last_checkpoint_step for w in current_workers(world.store)] if training(world.store) else []
        return min(steps) if steps and None not in steps else None  # type: ignore[type-var]

    assert wait_for(lambda: saved() is not None, 600, interval=0.5), "no checkpoint every rank saved"
    before = state(world.store)
    assert before is not None
    page = operator.new_page()
    page.goto(f"{world.base}/jobs/{JOB}")
    checkpoint = saved()
    assert checkpoint is not None
    suspended = confirm(page, page.locator("a:text-is('Suspend')"), "Suspend", "make room for an urgent eval")
    mark(page)
    page.locator(".summary .phase-suspended").wait_for()
    # The phase reads Suspended from the request on, while the workers still save the step asked for
    # (SuspendSaving) and stop: a Resume then would only withdraw the suspension. Wait for the nodes.
    assert wait_for(lambda: (st := state(world.store)) is not None and st.stage is JobStage.SUSPENDED, 600, 0.5)
    s = state(world.store)
    assert s is not None and s.phase is JobPhase.SUSPENDED and s.suspensions[-1].ended_at is None, s
    assert page.locator("rect.seg-suspended").count() == 1 and unchanged(page)
    assert page.locator("a:text-is('Run checks on every node')").count() == 0  # nothing to check while stopped
    assert page.locator(".grid .node").count() == 0 and "its nodes are stopped" in page.inner_text(".grid")
    shot(page, "job-suspended")

    resumed = confirm(page, page.locator("a:text-is('Resume')"), "Resume", "the eval is done")
    mark(page)
    assert wait_for(lambda: training(world.store) and state(world.store).generation > before.generation, 600, 0.5)  # type: ignore[union-attr]
    page.locator(".summary .phase-running").wait_for()
    page.locator("li.rank.health-ok").first.wait_for()
    assert unchanged(page)
    first = {w.first_step for w in current_workers(world.store)}
    after = state(world.store)
    assert after is not None and after.suspensions[-1].ended_at is not None and after.restarts == before.restarts
    # Every rank loaded the same checkpoint, past the one they all had saved before, and trained on from
    # the step after it: the one the platform asked them for before it stopped them (a suspension
    # checkpoints first), or a periodic one (every 10 steps) they committed after it, before the stop.
    assert len(first) == 1, first
    [step] = first
    saved_step = after.suspensions[-1].saved_step
    assert saved_step is not None and step is not None and step > checkpoint, (checkpoint, saved_step, step)
    assert step - 1 == saved_step or (step - 1 > saved_step and (step - 1) % 10 == 0), (saved_step, step)
    entries = audit(world.store)
    expected = {suspended: ("suspend", "make room for an urgent eval"), resumed: ("resume", "the eval is done")}
    for entry_id, (action, why) in expected.items():
        entry = entries[entry_id]
        assert (entry.action, entry.node, entry.actor, entry.reason) == (action, None, "olga", why)
        assert entry.request_id is None  # a spec change, as `kubectl patch` makes it: no request
        assert "spec changed" in page.locator(f"#audit tr[id='{entry_id}']").inner_text()
    shot(page, "job-resumed")
    page.close()


# -- 8. the finished job ----------------------------------------------------------------------------------
def test_every_page_renders_for_the_finished_job(world: World, operator: Any) -> None:
    evicted_at = max(i.failed_at for i in incidents(world.store))
    assert wait_for(lambda: training(world.store, after=evicted_at + 1), 600, interval=0.5)
    watching = operator.new_page()
    watching.goto(f"{world.base}/jobs/{JOB}")
    mark(watching)
    s = state(world.store)
    assert s is not None
    [victim] = [
        w
        for b in read_nodes(world.store, JOB).heartbeats.values()
        if b.generation == s.generation
        for w in b.workers
        if w.rank == 0
    ]
    os.kill(victim.pid, signal.SIGKILL)  # a counted failure with maxRestarts 0: the job fails
    assert wait_for(lambda: (st := state(world.store)) is not None and st.phase.terminal, 600, interval=0.5)
    watching.locator(".summary .phase-failed").wait_for()  # the open page saw the end without a reload
    assert unchanged(watching) and watching.locator("a:has-text('Evict')").count() == 0
    shot(watching, "job-finished")
    pages = {
        "/jobs": "Failed",
        f"/jobs/{JOB}": "Failed",
        f"/incidents?job={JOB}": incidents(world.store)[-1].failure_class.value,
        f"/jobs/{JOB}/incidents/{incidents(world.store)[0].id}": "Hang",
        f"/jobs/{JOB}/logs?rank=0": "its agents have exited",
        f"/jobs/{JOB}/stacks": "no workers whose stacks could be captured",
        "/runbooks/hang": "Hang",
    }
    for path, says in pages.items():
        response = watching.goto(f"{world.base}{path}")
        assert response is not None and response.status == 200, path
        assert says in watching.inner_text("main"), (path, watching.inner_text("main")[:500])
    watching.close()


# -- 9. nothing but the console -------------------------------------------------------------------------
def test_no_request_went_to_any_host_but_the_console(world: World) -> None:
    assert world.requests, "the browser made no request at all"
    others = sorted({u for u in world.requests if not u.startswith(world.base + "/")})
    assert not others, others
    assert any(u.endswith("/static/vendor/htmx.min.js") for u in world.requests)  # served by the console itself
