"""The Grafana dashboard: generated from code and committed, queries by training_job, panels the
runbooks cite exist, and `stalwart dashboards push` speaks Grafana's API (to a recording server)."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from support.paths import REPO
from typer.testing import CliRunner

from stalwart.cli.main import app
from stalwart.telemetry import dashboard

COMMITTED = REPO / "charts" / "stalwart" / "dashboards" / "stalwart.json"
CITATION = re.compile(r'panel "([^"]+)"')


def test_the_committed_dashboard_is_generated_from_the_code() -> None:
    assert COMMITTED.read_text() == dashboard.render(), (
        "charts/stalwart/dashboards/stalwart.json differs from the generator: run "
        "`python -m stalwart.telemetry.dashboard > charts/stalwart/dashboards/stalwart.json`"
    )


def queries(model: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in model["panels"] for t in p.get("targets", [])]


def test_every_query_selects_by_training_job_and_never_by_job() -> None:
    model = json.loads(COMMITTED.read_text())
    exprs = queries(model)
    assert len(exprs) >= 30
    for expr in exprs:
        assert not re.search(r"[{,]\s*job\s*=", expr), expr
        assert not re.search(r"by \(job\)", expr), expr
    titles = [p["title"] for p in model["panels"] if p["type"] != "row"]
    assert len(titles) == len(set(titles)), "panel titles are how runbooks cite panels: keep them unique"
    for needed in ("Phase timeline", "ETTR", "Incidents", "Throughput", "Loss", "Standbys", "Node heartbeat age"):
        assert needed in titles


def test_runbooks_cite_only_panels_that_exist_and_name_one_whenever_they_say_grafana() -> None:
    titles = set(dashboard.panel_titles())
    cited = 0
    for path in sorted((REPO / "runbooks").glob("*.md")):
        text = path.read_text()
        for title in CITATION.findall(text):
            assert title in titles, f"{path.name} cites panel {title!r}, which the dashboard does not have"
            cited += 1
        for paragraph in re.split(r"\n\s*\n|\n- ", text):
            if "Grafana" in paragraph:
                assert CITATION.search(paragraph), f"{path.name}: a Grafana reference without a panel: {paragraph!r}"
    assert cited >= 20


class Recorder(BaseHTTPRequestHandler):
    calls: list[tuple[str, str, dict[str, str], Any]] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.calls.append(("POST", self.path, dict(self.headers), body))
        if self.headers.get("Authorization") != "Bearer s3cret":
            self._answer(401, {"message": "Unauthorized"})
            return
        self._answer(200, {"status": "success", "uid": body["dashboard"]["uid"], "url": "/d/stalwart-training/x"})

    def _answer(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *_args: object) -> None:
        pass


@pytest.fixture
def grafana() -> Iterator[str]:
    Recorder.calls = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


def test_push_uploads_the_dashboard_through_grafanas_api(grafana: str) -> None:
    result = CliRunner().invoke(
        app, ["dashboards", "push", "--grafana", grafana, "--token", "s3cret", "--folder", "ml"]
    )
    assert result.exit_code == 0, result.output
    assert "pushed" in result.output and "/d/stalwart-training/x" in result.output
    [(method, path, headers, body)] = Recorder.calls
    assert (method, path) == ("POST", "/api/dashboards/db")
    assert headers["Authorization"] == "Bearer s3cret"
    assert body["overwrite"] is True and body["folderUid"] == "ml"
    assert body["dashboard"]["uid"] == "stalwart-training" and body["dashboard"]["id"] is None
    assert body["dashboard"]["panels"] == json.loads(COMMITTED.read_text())["panels"]


def test_push_says_in_one_line_when_grafana_refuses_or_the_url_is_bad(grafana: str) -> None:
    refused = CliRunner().invoke(app, ["dashboards", "push", "--grafana", grafana, "--token", "wrong"])
    assert refused.exit_code == 1 and "refused" in refused.output
    bad = CliRunner().invoke(app, ["dashboards", "push", "--grafana", "grafana:3000"])
    assert bad.exit_code == 2 and "http(s) URL" in bad.output
