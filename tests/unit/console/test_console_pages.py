"""The console's pages and actions over prepared records in a real etcd (no job runs here).

The records are written as the controller and the agents write them; the pages are asked for through
FastAPI's test client, with the peer address of a trusted proxy or of anyone else. These tests carry
the access rules, CSRF, the 4xx pages and what each page shows; the browser test
(tests/e2e/console/) checks the same pages against a real job.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Iterator
from html import unescape
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from stalwart.console import rendering
from stalwart.console.access import AccessSettings, Gate, Role, TokenHolder
from stalwart.console.app import ConsoleConfig, create_app
from stalwart.console.history import History
from stalwart.spec.model import FailureAction, FailureEvent
from stalwart.store import Store, keys
from stalwart.store.records import (
    Assignment,
    AuditEntry,
    CheckpointEntry,
    Heartbeat,
    Incident,
    JobPhase,
    JobStage,
    JobState,
    NodeAssignment,
    NodeRegistration,
    OperatorRequest,
    RequestKind,
    RequestStatus,
    Suspension,
    WorkerState,
    WorkerStatus,
)

LIVE, DONE = "console-live", "console-done"
NOW = time.time()
PROXY, STRANGER = "127.0.0.1", "127.0.0.9"
OPERATOR_TOKEN, VIEWER_TOKEN = "op-secret-token", "view-secret-token"
VERDICT = {
    "failure_class": "hang",
    "confidence": 0.9,
    "action": "evict",
    "summary": "rank 3 is stuck outside the collective the other ranks wait in",
    "suspects": [{"node": "node-b", "score": 0.95, "reasons": ["outlier stack group"], "ranks": [3]}],
    "stack_groups": [
        {"frames": ["all_reduce (c10d.py:2501)"], "ranks": [0, 1, 2], "count": 3, "outlier": False},
        {"frames": ["_injected_hang (faults.py:40)"], "ranks": [3], "count": 1, "outlier": True},
    ],
    "runbook": "hang",
}


def spec_doc(name: str, namespace: str = "default", suspend: bool = False) -> str:
    return json.dumps(
        {
            "apiVersion": "stalwart.dev/v1alpha1",
            "kind": "TrainingJob",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "roles": [
                    {
                        "name": "trainer",
                        "replicas": 2,
                        "processesPerNode": 2,
                        "parallelism": {"tensor": 2},
                        "command": ["python", "x.py"],
                    }
                ],
                "suspend": suspend,
            },
        }
    )


def worker(
    rank: int, step: int, progress_age: float = 0.2, exit_code: int | None = None, now: float = NOW
) -> WorkerStatus:
    return WorkerStatus(
        local_rank=rank % 2,
        rank=rank,
        pid=1000 + rank,
        state=WorkerState.EXITED if exit_code is not None else WorkerState.RUNNING,
        exit_code=exit_code,
        started_at=NOW - 100,
        step=step,
        loss=2.5 - step / 100,
        tokens_per_second=1000.0,
        step_time=0.1,
        last_progress_at=now - progress_age,
        last_checkpoint_step=40,
    )


def write_job(store: Store, job: str, phase: JobPhase, namespace: str) -> None:
    store.delete_prefix(keys.job_prefix(job))
    store.put(keys.job_spec(job), spec_doc(job, namespace))
    finished = phase.terminal
    store.put(
        keys.job_state(job),
        JobState(
            job=job,
            phase=phase,
            generation=2,
            restarts=1,
            infra_restarts=2,
            slots=["node-a", "node-b"] if not finished else [],
            standbys=["node-c"] if not finished else [],
            evicted=["node-x"],
            created_at=NOW - 300,
            started_at=NOW - 290,
            first_step_at=NOW - 280,
            finished_at=NOW - 10 if finished else None,
            reason="Completed" if finished else None,
            updated_at=NOW,
        ),
    )
    for gen, at in ((1, NOW - 290), (2, NOW - 150)):
        store.put(
            keys.generation(job, gen),
            Assignment(
                job=job,
                generation=gen,
                world_size=4,
                master_addr="127.0.0.1",
                master_port=29500,
                nodes=[
                    NodeAssignment(node="node-a", node_rank=0, role="trainer", first_rank=0, local_world_size=2),
                    NodeAssignment(node="node-b", node_rank=1, role="trainer", first_rank=2, local_world_size=2),
                ],
                created_at=at,
            ),
        )
    store.put(
        keys.incident(job, "inc-0001-abc123"),
        Incident(
            id="inc-0001-abc123",
            job=job,
            failure_class=FailureEvent.HANG,
            generation=1,
            node="node-x",
            rank=3,
            evidence=["no step for 30s on every rank", "stack round 1: rank 3 outside the collective"],
            action="evict node-x, standby node-b takes its ranks",
            policy_action=FailureAction.EVICT,
            suspects=["node-x"],
            evicted=["node-x"],
            replacements={"node-x": "node-b"},
            counted=False,
            verdict=VERDICT,
            failed_at=NOW - 200,
            detected_at=NOW - 170,
            diagnosed_at=NOW - 168,
            restarted_at=NOW - 155,
            first_step_at=NOW - 140,
        ),
    )
    store.put(
        keys.checkpoint_entry(job, 40),
        CheckpointEntry(
            step=40, uri="file:///ckpt/40", committed_at=NOW - 30, tiers=["memory", "file"], bytes=3 * 1024 * 1024
        ),
    )
    if not finished:
        write_nodes(store, job, NOW)


def write_nodes(store: Store, job: str, now: float) -> None:
    """The live job's nodes as of `now`: rank 3 behind and silent for 20 s, the others stepping. A
    test that reads ranks' health calls it again with the time it reads at (the module's records are
    written once, and on a loaded machine its later tests run minutes after)."""
    for node, ranks in (("node-a", (0, 1)), ("node-b", (2, 3)), ("node-c", ())):
        store.put(
            keys.node_registration(job, node),
            NodeRegistration(node=node, job=job, host="127.0.0.1", agent_pid=1, registered_at=NOW - 100, lease_id=1),
        )
        workers = [worker(r, 50 if r != 3 else 47, progress_age=0.2 if r != 3 else 20, now=now) for r in ranks]
        store.put(keys.node_heartbeat(job, node), Heartbeat(node=node, generation=2, sent_at=now, workers=workers))


@pytest.fixture(scope="module")
def records(etcd) -> Iterator[Store]:  # type: ignore[no-untyped-def]
    store = Store(etcd.endpoint)
    write_job(store, LIVE, JobPhase.RUNNING, "research")
    write_job(store, DONE, JobPhase.SUCCEEDED, "default")
    yield store
    for job in (LIVE, DONE):
        store.delete_prefix(keys.job_prefix(job))
    store.close()


def holder(user: str, role: Role, token: str) -> TokenHolder:
    return TokenHolder(user=user, role=role, sha256=hashlib.sha256(token.encode()).hexdigest())


def console(records: Store, htmx: Path):  # type: ignore[no-untyped-def]
    """The console as if htmx were installed at `htmx` (or not, where nothing is there): its pages
    poll only with htmx beside them, and `make install`, not the tests, puts it there."""
    settings = AccessSettings(
        trusted_proxies=[f"{PROXY}/32"],  # type: ignore[list-item]
        operator_groups=["sre"],
        tokens=[holder("tok-op", Role.OPERATOR, OPERATOR_TOKEN), holder("tok-view", Role.VIEWER, VIEWER_TOKEN)],
    )
    history = History(records, interval=60, points=5)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(rendering, "HTMX", htmx)
        return create_app(records, Gate(settings, b"k" * 32), history, ConsoleConfig(allowed_hosts=["*"]))


@pytest.fixture(scope="module")
def app(records: Store, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    htmx = tmp_path_factory.mktemp("vendor") / "htmx.min.js"
    htmx.write_text("/* htmx */\n")
    return console(records, htmx)


def client(app, peer: str = PROXY) -> TestClient:  # type: ignore[no-untyped-def]
    return TestClient(app, client=(peer, 40000), raise_server_exceptions=False, follow_redirects=False)


VIEWER = {"X-Forwarded-User": "vera", "X-Forwarded-Groups": "ml-team"}
OPERATOR = {"X-Forwarded-User": "olga", "X-Forwarded-Groups": "ml-team, sre"}


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found, html[:2000]
    return found.group(1)


def no_trace(html: str) -> None:
    assert "Traceback" not in html and 'File "' not in html


# -- pages ------------------------------------------------------------------------------------------
def test_jobs_page_lists_and_filters_by_phase_and_namespace(app) -> None:  # type: ignore[no-untyped-def]
    c = client(app)
    page = c.get("/jobs", headers=VIEWER)
    assert page.status_code == 200, page.text
    assert LIVE in page.text and DONE in page.text and "research" in page.text
    assert "1 + 2 infra" in page.text  # restarts counted + infrastructure
    only_live = c.get("/jobs?phase=Running", headers=VIEWER).text
    assert f"/jobs/{LIVE}" in only_live and f"/jobs/{DONE}" not in only_live
    only_default = c.get("/jobs?namespace=default", headers=VIEWER).text
    assert f"/jobs/{DONE}" in only_default and f'/jobs/{LIVE}"' not in only_default


def test_job_page_shows_grid_standbys_timeline_checkpoints_and_charts(app, records: Store) -> None:  # type: ignore[no-untyped-def]
    write_nodes(records, LIVE, time.time())
    page = client(app).get(f"/jobs/{LIVE}?tp=2&group=tp", headers=VIEWER)
    assert page.status_code == 200, page.text
    html = page.text
    for rank in range(4):
        assert f">r{rank}<" in html
    assert "health-ok" in html and "straggler" in html  # rank 3 is behind and silent
    assert re.search(r'class="rank health-stalled straggler g\d"', html) or "health-ok straggler" in html
    assert "tp1 pp2 dp0" in html  # rank 2 with TP=2: the second TP group, the first DP group
    assert "node-c" in html and "standby" in html
    assert "generation 2" in html and 'class="timeline"' in html and "seg-down" in html
    assert "3.0 MiB" in html and "memory+file" in html  # the checkpoint in the catalog
    assert "newest checkpoint: step 40 saved by every rank" in html  # and what the ranks report
    assert "Sampled by this console" in html
    assert "<time datetime=" in html
    # A viewer sees no action.
    assert "/actions/evict" not in html


def test_the_grid_shows_the_parallel_groups_of_the_jobs_spec_unless_the_page_gives_sizes(app, records: Store) -> None:  # type: ignore[no-untyped-def]
    write_nodes(records, LIVE, time.time())
    c = client(app)
    html = unescape(c.get(f"/jobs/{LIVE}?group=dp", headers=VIEWER).text)
    assert "layout trainer: tp 2 x pp 1 x dp 2 (the job's spec)" in html
    assert "tp1 pp2 dp0" in html and re.search(r'class="rank health-ok g0"', html)  # rank 0: dp group 0
    given = unescape(c.get(f"/jobs/{LIVE}?tp=&pp=4&group=pp", headers=VIEWER).text)
    assert "layout tp 1 x pp 4 x dp 1 (given on this page" in given and "tp3 pp0 dp3" in given  # rank 3: groups
    assert c.get(f"/jobs/{LIVE}?tp=3", headers=VIEWER).status_code == 200  # 3 does not divide 4: the page says so
    assert "TP × PP must divide the world size" in c.get(f"/jobs/{LIVE}?tp=3", headers=VIEWER).text
    assert c.get(f"/jobs/{LIVE}?tp=&pp=", headers=VIEWER).status_code == 200  # blank boxes: the spec's layout
    bad = c.get(f"/jobs/{LIVE}?tp=two", headers=VIEWER)
    assert bad.status_code == 400 and "tp: a whole number" in bad.text


def test_a_check_shows_each_nodes_verdict_and_a_suspension_its_stretch(app, records: Store) -> None:  # type: ignore[no-untyped-def]
    request = OperatorRequest(
        id="req-check-1",
        kind=RequestKind.CHECK,
        reason="nightly",
        requested_by="olga (console)",
        requested_at=NOW - 20,
        status=RequestStatus.DONE,
        message="1/2 nodes passed; failed: node-b",
        result={
            "node-a": {"passed": True, "reasons": []},
            "node-b": {"passed": False, "reasons": ["all_reduce: 2 GB/s"]},
        },
        finished_at=NOW - 10,
    )
    entry = AuditEntry(
        id="audit-check-1",
        job=LIVE,
        action="check",
        reason="nightly",
        actor="olga",
        via="proxy",
        at=NOW - 20,
        request_id=request.id,
    )
    state = records.get(keys.job_state(LIVE), JobState)
    assert state is not None
    state.suspensions = [Suspension(started_at=NOW - 100, ended_at=NOW - 60)]
    records.put(keys.job_state(LIVE), state)
    records.put(keys.request(LIVE, request.id), request)
    records.put(keys.audit_entry(LIVE, entry.id), entry)
    c = client(app)
    try:
        html = unescape(c.get(f"/jobs/{LIVE}", headers=VIEWER).text)
        row = html[html.index('<tr id="audit-check-1"') :].split("</tr>", 1)[0]
        assert "1/2 nodes passed" in row and "node-a: passed" in row and "node-b: failed: all_reduce: 2 GB/s" in row
        assert 'class="seg seg-suspended"' in html and "· suspended" in html and "· resumed" in html

        # Suspending, checkpoint first: the workers still step, so the nodes are shown, and nothing is evicted.
        state.stage = JobStage.SAVING
        records.put(keys.job_state(LIVE), state)
        html = unescape(c.get(f"/jobs/{LIVE}", headers=OPERATOR).text)
        assert "saving a checkpoint before suspending" in html and 'class="rank' in html, html[-2000:]
        assert "its nodes are stopped" not in html and "<dt>tokens/s</dt><dd>-</dd>" not in html
        csrf = csrf_of(c.get(f"/jobs/{LIVE}/actions/suspend", headers=OPERATOR).text)
        refused = c.post(
            f"/jobs/{LIVE}/actions/evict", data={"node": "node-a", "reason": "x", "csrf": csrf}, headers=OPERATOR
        )
        assert refused.status_code == 409 and "saves a checkpoint, then its nodes stop" in unescape(refused.text)

        # Suspended again, now: the nodes' last heartbeats are still there, but the nodes are stopped.
        state.stage = JobStage.SUSPENDED
        state.suspensions.append(Suspension(started_at=NOW - 5))
        records.put(keys.job_state(LIVE), state)
        html = unescape(c.get(f"/jobs/{LIVE}", headers=OPERATOR).text)
        assert "the job is suspended: its nodes are stopped" in html and 'class="rank' not in html
        assert "<dt>tokens/s</dt><dd>-</dd>" in html  # the last heartbeats' throughput is not now's
        assert "standby pool empty" in html and "/actions/evict" not in html and "/actions/check" not in html
        csrf = csrf_of(c.get(f"/jobs/{LIVE}/actions/suspend", headers=OPERATOR).text)
        for action, node in (("evict", "node-a"), ("check", "")):
            refused = c.post(
                f"/jobs/{LIVE}/actions/{action}", data={"node": node, "reason": "x", "csrf": csrf}, headers=OPERATOR
            )
            assert refused.status_code == 409 and "is suspended" in unescape(refused.text), refused.text[-600:]
    finally:
        write_job(records, LIVE, JobPhase.RUNNING, "research")


def test_live_parts_come_alone_and_a_finished_job_stops_the_polling(app) -> None:  # type: ignore[no-untyped-def]
    c = client(app)
    part = c.get(f"/jobs/{LIVE}", headers={**VIEWER, "HX-Request": "true"})
    assert part.status_code == 200 and "<html" not in part.text and "node-a" in part.text
    assert part.headers["vary"] == "HX-Request"
    done = c.get(f"/jobs/{DONE}", headers={**VIEWER, "HX-Request": "true"})
    assert done.status_code == 286  # htmx: stop polling
    full = c.get(f"/jobs/{DONE}", headers=VIEWER)
    assert full.status_code == 200 and "Succeeded" in full.text and "hx-trigger" not in full.text


def test_incidents_show_class_evidence_suspects_verdict_timings_and_runbook(app) -> None:  # type: ignore[no-untyped-def]
    c = client(app)
    html = c.get(f"/incidents?job={LIVE}", headers=VIEWER).text
    assert "inc-0001-abc123" in html and "Hang" in html
    assert "stack round 1: rank 3 outside the collective" in html  # evidence
    assert "node-x" in html and "0.95" in html and "outlier" in html  # suspects and the verdict
    assert "+30.00s" in html and "+45.00s" in html and "+60.00s" in html  # detect, restart, first step
    assert 'class="markdown"' in html and "<h1>" in html  # the runbook, rendered
    one = c.get(f"/jobs/{LIVE}/incidents/0001-abc", headers=VIEWER)
    assert one.status_code == 200 and "Runbook" in one.text and "evict node-x" in one.text


def test_every_page_renders_for_a_live_and_a_finished_job(app) -> None:  # type: ignore[no-untyped-def]
    c = client(app)
    for job in (LIVE, DONE):
        for path in (
            f"/jobs/{job}",
            f"/incidents?job={job}",
            f"/jobs/{job}/incidents/inc-0001-abc123",
            f"/jobs/{job}/stacks",
            "/runbooks/hang",
            "/jobs",
            "/incidents",
        ):
            page = c.get(path, headers=VIEWER)
            assert page.status_code == 200, (path, page.text[:500])
            no_trace(page.text)
    logs = c.get(f"/jobs/{DONE}/logs", headers=VIEWER)
    assert logs.status_code == 200 and "its agents have exited" in logs.text


def test_pages_load_nothing_from_another_host(app) -> None:  # type: ignore[no-untyped-def]
    c = client(app)
    page = c.get(f"/jobs/{LIVE}", headers=VIEWER)
    assert "default-src 'self'" in page.headers["content-security-policy"]
    assert page.headers["x-frame-options"] == "DENY"
    for html in (page.text, c.get("/incidents", headers=VIEWER).text):
        assert not re.search(r'(src|href)="(https?:)?//', html), re.findall(r'(?:src|href)="[^"]+"', html)


# -- bad input: clear 4xx pages ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("path", "status", "says"),
    [
        ("/jobs/no-such-job", 404, "no job 'no-such-job'"),
        ("/jobs/..%2Fetc", 404, "not found"),
        ("/jobs/Bad$Name", 404, "not a valid job name"),
        (f"/jobs/{LIVE}/incidents/inc-9999", 404, "no incident"),
        (f"/jobs/{LIVE}/logs?rank=99", 404, "has no rank 99"),
        (f"/jobs/{LIVE}/logs?rank=x", 400, "rank"),
        (f"/jobs/{LIVE}?tp=0", 400, "tp"),
        ("/runbooks/no-such-thing", 404, "no runbook"),
        ("/nowhere", 404, "no such page"),
        (f"/jobs/{LIVE}/actions/reboot?node=node-a", 400, "action"),
    ],
)
def test_bad_input_is_a_clear_4xx_page(app, path: str, status: int, says: str) -> None:  # type: ignore[no-untyped-def]
    page = client(app).get(path, headers=OPERATOR)
    assert page.status_code == status, page.text[:500]
    assert says.lower() in unescape(page.text).lower(), page.text[:1500]
    assert "<html" in page.text
    no_trace(page.text)


# -- access -----------------------------------------------------------------------------------------
def test_nobody_identified_is_asked_to_sign_in(app) -> None:  # type: ignore[no-untyped-def]
    page = client(app).get("/jobs")
    assert page.status_code == 401 and "sign in" in page.text.lower()


def test_proxy_headers_count_only_from_a_trusted_proxy(app) -> None:  # type: ignore[no-untyped-def]
    assert client(app, STRANGER).get("/jobs", headers=OPERATOR).status_code == 401
    assert client(app, PROXY).get("/jobs", headers=OPERATOR).status_code == 200


def test_a_viewer_cannot_act(app, records: Store) -> None:  # type: ignore[no-untyped-def]
    c = client(app)
    confirm = c.get(f"/jobs/{LIVE}/actions/evict?node=node-a", headers=VIEWER)
    assert confirm.status_code == 403 and "may view but not act" in confirm.text
    csrf = "x"  # refused before the token is looked at
    posted = c.post(f"/jobs/{LIVE}/actions/evict", data={"node": "node-a", "reason": "r", "csrf": csrf}, headers=VIEWER)
    assert posted.status_code == 403
    viewer_token = c.post(
        f"/jobs/{LIVE}/actions/evict",
        data={"node": "node-a", "reason": "r"},
        headers={"Authorization": f"Bearer {VIEWER_TOKEN}"},
    )
    assert viewer_token.status_code == 403
    assert not [r for r in records.get_prefix(keys.requests_prefix(LIVE), OperatorRequest) if r.node == "node-a"]


def test_an_operator_post_needs_the_csrf_token_and_the_same_origin(app, records: Store) -> None:  # type: ignore[no-untyped-def]
    c = client(app)
    confirm = c.get(f"/jobs/{LIVE}/actions/cordon?node=node-a", headers=OPERATOR)
    assert confirm.status_code == 200 and "Cordon node-a" in confirm.text
    csrf = csrf_of(confirm.text)
    form = {"node": "node-a", "reason": "ECC errors rising"}
    assert c.post(f"/jobs/{LIVE}/actions/cordon", data=form, headers=OPERATOR).status_code == 403
    assert c.post(f"/jobs/{LIVE}/actions/cordon", data={**form, "csrf": "forged"}, headers=OPERATOR).status_code == 403
    other = {**OPERATOR, "X-Forwarded-User": "mallory"}
    assert c.post(f"/jobs/{LIVE}/actions/cordon", data={**form, "csrf": csrf}, headers=other).status_code == 403
    cross = {**OPERATOR, "Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"}
    assert c.post(f"/jobs/{LIVE}/actions/cordon", data={**form, "csrf": csrf}, headers=cross).status_code == 403
    assert not records.get_prefix(keys.requests_prefix(LIVE), OperatorRequest)
    done = c.post(f"/jobs/{LIVE}/actions/cordon", data={**form, "csrf": csrf}, headers=OPERATOR)
    assert done.status_code == 303 and done.headers["location"].startswith(f"/jobs/{LIVE}?done=audit-")
    requests = records.get_prefix(keys.requests_prefix(LIVE), OperatorRequest)
    assert [(r.kind, r.node, r.reason, r.requested_by) for r in requests] == [
        (RequestKind.CORDON, "node-a", "ECC errors rising", "olga (console)")
    ]
    entries = records.get_prefix(keys.audit_prefix(LIVE), AuditEntry)
    assert [(e.action, e.node, e.actor, e.via, e.request_id) for e in entries] == [
        ("cordon", "node-a", "olga", "proxy", requests[0].id)
    ]
    # The controller's answer shows in the audit trail on the job page.
    answered = requests[0].model_copy(update={"status": RequestStatus.DONE, "message": "node-a cordoned"})
    records.put(keys.request(LIVE, answered.id), answered)
    html = c.get(f"/jobs/{LIVE}", headers=VIEWER).text
    audit = html[html.index('id="audit"') :]
    assert "olga" in audit and "ECC errors rising" in audit and "node-a cordoned" in audit
    records.delete_prefix(keys.requests_prefix(LIVE))
    records.delete_prefix(keys.audit_prefix(LIVE))


def test_malformed_forms_are_400_pages_and_unknown_nodes_404(app, records: Store) -> None:  # type: ignore[no-untyped-def]
    c = client(app)
    csrf = csrf_of(c.get(f"/jobs/{LIVE}/actions/check", headers=OPERATOR).text)
    cases = [
        ({"node": "node-a", "csrf": csrf}, 400, "reason"),  # no reason at all
        ({"node": "node-a", "reason": "   ", "csrf": csrf}, 400, "say why"),
        ({"reason": "why", "csrf": csrf}, 400, "needs a node"),
        ({"node": "node-zz", "reason": "why", "csrf": csrf}, 404, "not in job"),
    ]
    for form, status, says in cases:
        page = c.post(f"/jobs/{LIVE}/actions/evict", data=form, headers=OPERATOR)
        assert page.status_code == status and says in unescape(page.text), (form, page.text[:800])
        no_trace(page.text)
    finished = c.post(f"/jobs/{DONE}/actions/check", data={"reason": "why", "csrf": csrf}, headers=OPERATOR)
    assert finished.status_code == 409 and "already finished" in finished.text
    assert not records.get_prefix(keys.requests_prefix(LIVE), OperatorRequest)


def test_bearer_tokens_and_the_login_session(app, records: Store) -> None:  # type: ignore[no-untyped-def]
    c = client(app, STRANGER)
    assert c.get("/jobs", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert c.get("/jobs", headers={"Authorization": f"Bearer {VIEWER_TOKEN}"}).status_code == 200
    api = c.post(
        f"/jobs/{LIVE}/actions/check", data={"reason": "nightly"}, headers={"Authorization": f"Bearer {OPERATOR_TOKEN}"}
    )
    assert api.status_code == 303  # the Authorization header is no browser's doing: no CSRF token needed
    assert [r.requested_by for r in records.get_prefix(keys.requests_prefix(LIVE), OperatorRequest)] == [
        "tok-op (console)"
    ]
    bad = c.post("/login", data={"token": "nope"})
    assert bad.status_code == 401 and "not one the console knows" in bad.text
    signed_in = c.post("/login", data={"token": VIEWER_TOKEN})
    assert signed_in.status_code == 303 and "httponly" in signed_in.headers["set-cookie"].lower()
    assert "samesite=strict" in signed_in.headers["set-cookie"].lower()
    page = c.get("/jobs")  # the cookie, now in the client
    assert page.status_code == 200 and "tok-view" in page.text
    try:
        # The forged session alone: beside the real one, which of two same-named cookies a request
        # carries first is the cookie jar's order, not the console's doing.
        c.cookies.clear()
        c.cookies.set("stalwart_session", "tok-op|operator|9999999999|forged")
        assert c.get("/jobs").status_code == 401
    finally:
        records.delete_prefix(keys.requests_prefix(LIVE))
        records.delete_prefix(keys.audit_prefix(LIVE))


def test_suspend_and_resume_change_the_spec_and_are_audited(app, records: Store) -> None:  # type: ignore[no-untyped-def]
    c = client(app)
    csrf = csrf_of(c.get(f"/jobs/{LIVE}/actions/suspend", headers=OPERATOR).text)
    assert (
        c.post(f"/jobs/{LIVE}/actions/resume", data={"reason": "x", "csrf": csrf}, headers=OPERATOR).status_code == 409
    )  # not suspended
    done = c.post(
        f"/jobs/{LIVE}/actions/suspend", data={"reason": "maintenance window", "csrf": csrf}, headers=OPERATOR
    )
    assert done.status_code == 303
    assert json.loads(records.get_raw(keys.job_spec(LIVE)) or "{}")["spec"]["suspend"] is True
    html = c.get(f"/jobs/{LIVE}", headers=OPERATOR).text
    assert "suspend requested" in html and "/actions/resume" in html
    c.post(f"/jobs/{LIVE}/actions/resume", data={"reason": "window over", "csrf": csrf}, headers=OPERATOR)
    assert json.loads(records.get_raw(keys.job_spec(LIVE)) or "{}")["spec"]["suspend"] is False
    entries = sorted(records.get_prefix(keys.audit_prefix(LIVE), AuditEntry), key=lambda e: e.at)
    assert [(e.action, e.reason, e.actor, e.request_id) for e in entries] == [
        ("suspend", "maintenance window", "olga", None),
        ("resume", "window over", "olga", None),
    ]
    records.delete_prefix(keys.audit_prefix(LIVE))


# -- history ----------------------------------------------------------------------------------------
def test_history_samples_unfinished_jobs_and_stays_bounded(records: Store) -> None:
    history = History(records, interval=60, points=3)
    for _ in range(5):
        history.sample_once()
        time.sleep(0.01)
    live = history.series(LIVE)
    assert len(live) == 3 and all(s.step == 50 and s.phase == "Running" for s in live)
    assert len(history.series(DONE)) == 1  # a finished job: one sample of its end


def test_an_open_incidents_page_of_a_live_job_keeps_asking(app, records: Store) -> None:  # type: ignore[no-untyped-def]
    c = client(app)
    live = c.get(f"/incidents?job={LIVE}", headers=VIEWER).text
    assert 'hx-trigger="every' in live  # a new incident would appear
    assert 'hx-trigger="every' not in c.get(f"/incidents?job={DONE}", headers=VIEWER).text
    runbook = c.get("/runbooks/hang", headers=VIEWER).text
    assert 'href="/runbooks/' in runbook and '.md"' not in runbook  # links between runbooks stay in the console


def test_without_htmx_a_live_page_says_so_and_does_not_poll(records: Store, tmp_path: Path) -> None:
    page = client(console(records, tmp_path / "missing" / "htmx.min.js")).get(f"/incidents?job={LIVE}", headers=VIEWER)
    assert page.status_code == 200 and 'hx-trigger="every' not in page.text
    assert "Live updates are off: htmx is not installed" in page.text


def test_the_console_refuses_to_listen_beyond_loopback_with_no_sign_in() -> None:
    from stalwart.console.command import access_settings
    from stalwart.ops.errors import OpsError as CliError

    assert access_settings("127.0.0.1", [], [], [], None, None).anonymous is Role.VIEWER
    with pytest.raises(CliError, match="no way to tell who is asking"):
        access_settings("0.0.0.0", [], [], [], None, None)
    with pytest.raises(CliError, match="--trust-proxy"):
        access_settings("0.0.0.0", ["not-a-network"], [], [], None, None)


def test_metrics_for_prometheus_need_no_sign_in_and_count_actions(app) -> None:  # type: ignore[no-untyped-def]
    from support.metrics_doc import documented, families, promtool_check

    c = client(app, STRANGER)
    c.post(f"/jobs/{DONE}/actions/check", data={"reason": "x"}, headers={"Authorization": f"Bearer {OPERATOR_TOKEN}"})
    scrape = c.get("/metrics")
    assert scrape.status_code == 200
    promtool_check(scrape.content)
    found = families(scrape.text)
    doc = documented("Web console")
    assert set(doc) <= set(found), (sorted(doc), sorted(found))
    routes = {s["route"] for s in found["stalwart_console_http_request_duration_seconds"][1]}
    assert "/jobs/{job}/actions/{action}" in routes and not any("console-done" in r for r in routes)


def test_logs_of_a_job_between_generations_say_so(app, records: Store) -> None:  # type: ignore[no-untyped-def]
    pending = "console-pending"
    records.put(keys.job_state(pending), JobState(job=pending, created_at=NOW, updated_at=NOW))
    try:
        page = client(app).get(f"/jobs/{pending}/logs", headers=VIEWER)
        assert page.status_code == 200 and "has no running generation" in unescape(page.text), page.text[:800]
    finally:
        records.delete_prefix(keys.job_prefix(pending))
