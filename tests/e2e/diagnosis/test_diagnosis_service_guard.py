"""The diagnosis service attacked as a hostile caller would, on loopback: no token, a wrong token, a
body that never ends, more bundles than it has workers, a worker killed under it, the service
SIGKILLed. It must refuse early (before reading a body), stay answerable (/healthz), and leave no
process behind."""

from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest
from support.diagnosis_service import Service, running_service, start_service, worker_pids
from support.paths import REPO

from stalwart.diagnosis.client import DiagnosisClient, DiagnosisRejected, diagnose_local
from stalwart.diagnosis.corpus import CorpusCase, load_corpus
from stalwart.diagnosis.service import read_token
from stalwart.net import free_port
from stalwart.processes import stop_process, wait_for
from stalwart.store.credentials import DIAGNOSIS_TOKEN_ENV, new_token

CORPUS = REPO / "tests" / "data" / "diagnosis" / "corpus"


@pytest.fixture(scope="module")
def case() -> CorpusCase:
    return next(c for c in load_corpus(CORPUS) if c.name == "hang-t2p4d2-sleep-r5")


@pytest.fixture(scope="module")
def narrow(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    """One worker and no queue: the second bundle in flight is turned away."""
    with running_service(tmp_path_factory.mktemp("narrow"), "--max-concurrent", "1", "--max-queued", "0") as service:
        yield service


def raw_request(url: str, head: str, body: bytes = b"") -> socket.socket:
    """A request written by hand: headers (and maybe part of a body) sent, the socket left open."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=60)
    sock.sendall(head.replace("\n", "\r\n").encode() + b"\r\n" + body)
    return sock


def read_response(sock: socket.socket) -> tuple[int, str]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    head = data.split(b"\r\n\r\n", 1)[0].decode()
    return int(head.split()[1]), head


def post_head(length: int, token: str | None = None, path: str = "/v1/diagnose") -> str:
    auth = f"Authorization: Bearer {token}\n" if token else ""
    return f"POST {path} HTTP/1.1\nHost: x\nContent-Type: application/json\n{auth}Content-Length: {length}\n"


def in_flight(service: Service, state: str) -> float:
    metrics = httpx.get(f"{service.url}/metrics", timeout=30).text
    match = re.search(rf'stalwart_diagnosis_bundles_in_flight{{state="{state}"}} (\S+)', metrics)
    return float(match.group(1)) if match else -1.0


def test_no_token_or_a_wrong_one_is_refused_before_the_body_is_read(
    narrow: Service, case: CorpusCase, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A gigabyte announced and never sent: the answer comes anyway, so nothing waited for the body.
    for token, status in ((None, 401), ("x" * 43, 403), (narrow.token + "x", 403), (narrow.token[:-1], 403)):
        sock = raw_request(narrow.url, post_head(10**9, token))
        try:
            got, head = read_response(sock)
        finally:
            sock.close()
        assert got == status, head
        assert status == 403 or 'www-authenticate: bearer realm="stalwart-diagnosis"' in head.lower()
    for headers in ({}, {"authorization": "Basic Zm9vOmJhcg=="}, {"authorization": "Bearer"}, {"authorization": ""}):
        r = httpx.get(f"{narrow.url}/v1/incidents/job/inc-1", headers=headers, timeout=30)
        assert r.status_code == 401 and "bearer token" in r.json()["detail"]
    r = httpx.get(f"{narrow.url}/v1/incidents/job/inc-1", headers={"authorization": "bearer " + narrow.token})
    assert r.status_code == 503  # the scheme is case-insensitive; this service has no etcd
    # Open, and read-only.
    assert httpx.get(f"{narrow.url}/healthz", timeout=30).status_code == 200
    assert httpx.post(f"{narrow.url}/healthz", timeout=30).status_code == 405
    assert httpx.post(f"{narrow.url}/metrics", content=b"x", timeout=30).status_code == 405
    metrics = httpx.get(f"{narrow.url}/metrics", timeout=30).text
    assert 'stalwart_diagnosis_rejected_requests_total{status="401"}' in metrics
    assert 'stalwart_diagnosis_rejected_requests_total{status="403"}' in metrics
    # The client says what is missing; the controller's path falls back to the local engine.
    monkeypatch.delenv(DIAGNOSIS_TOKEN_ENV, raising=False)
    with pytest.raises(DiagnosisRejected, match=f"401.*{DIAGNOSIS_TOKEN_ENV}"):
        DiagnosisClient(narrow.url).diagnose(case.bundle)
    heard: list[Exception] = []
    verdict = diagnose_local(case.bundle, narrow.url, token="wrong-token-wrong-token", on_unavailable=heard.append)
    assert verdict.flagged == ["node-2"] and isinstance(heard[0], DiagnosisRejected) and heard[0].status == 403


def test_a_busy_service_turns_bundles_away_and_keeps_answering(narrow: Service, case: CorpusCase) -> None:
    body = case.bundle.model_dump_json().encode()
    holder = raw_request(narrow.url, post_head(len(body), narrow.token), body[:10])  # takes the only slot
    try:
        assert wait_for(lambda: in_flight(narrow, "working") == 1.0, 60, 0.1)
        r = httpx.post(
            f"{narrow.url}/v1/diagnose",
            content=body,
            headers={"content-type": "application/json", **narrow.auth},
            timeout=30,
        )
        assert r.status_code == 503 and r.headers["retry-after"] == "5" and "busy" in r.json()["detail"]
        assert httpx.get(f"{narrow.url}/healthz", timeout=30).status_code == 200
        holder.sendall(body[10:])  # the held request completes normally
        status, _ = read_response(holder)
        assert status == 200
    finally:
        holder.close()
    assert wait_for(lambda: in_flight(narrow, "working") == 0.0, 60, 0.1)
    verdict = DiagnosisClient(narrow.url, token=narrow.token).diagnose(case.bundle)
    assert verdict.flagged == ["node-2"]
    assert 'stalwart_diagnosis_rejected_requests_total{status="503"}' in httpx.get(f"{narrow.url}/metrics").text


def test_a_slow_body_a_dead_worker_and_a_killed_service(tmp_path: Path, case: CorpusCase) -> None:
    service = start_service(tmp_path, "--max-concurrent", "1", "--body-seconds", "1")
    try:
        # A body that never ends holds a slot for --body-seconds, then gets 408.
        sock = raw_request(service.url, post_head(1000, service.token), b"{")
        try:
            status, _ = read_response(sock)
        finally:
            sock.close()
        assert status == 408
        client = DiagnosisClient(service.url, token=service.token, timeout=60)
        assert client.diagnose(case.bundle).flagged == ["node-2"]
        [worker] = worker_pids(service)
        os.kill(worker, signal.SIGKILL)  # killed between bundles: the pool is replaced
        assert client.diagnose(case.bundle).flagged == ["node-2"]  # (a 503 first is retried)
        [replacement] = worker_pids(service)
        assert replacement != worker
        os.kill(service.proc.pid, signal.SIGKILL)  # nothing stops its workers but the kernel
        service.proc.wait(timeout=30)
        assert wait_for(
            lambda: not psutil.pid_exists(replacement) or psutil.Process(replacement).status() == "zombie", 30
        )
    finally:
        stop_process(service.proc, grace=5)


def test_it_listens_on_loopback_only(narrow: Service) -> None:
    port = int(narrow.url.rsplit(":", 1)[1])
    listening = [c.laddr for c in psutil.Process(narrow.proc.pid).net_connections("tcp") if c.status == "LISTEN"]
    assert [(a.ip, a.port) for a in listening] == [("127.0.0.1", port)]


def test_it_refuses_to_start_without_a_token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env = {k: v for k, v in os.environ.items() if k != DIAGNOSIS_TOKEN_ENV}
    argv = [sys.executable, "-m", "stalwart.diagnosis.service", "--port", str(free_port())]
    r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and DIAGNOSIS_TOKEN_ENV in r.stderr and "--no-auth" in r.stderr

    monkeypatch.delenv(DIAGNOSIS_TOKEN_ENV, raising=False)
    assert read_token(argparse.Namespace(token_file=None, no_auth=True, host="127.0.0.1")) is None
    with pytest.raises(ValueError, match="only on loopback, not on 0.0.0.0"):
        read_token(argparse.Namespace(token_file=None, no_auth=True, host="0.0.0.0"))
    monkeypatch.setenv(DIAGNOSIS_TOKEN_ENV, "short")
    with pytest.raises(ValueError, match="too short") as refused:
        read_token(argparse.Namespace(token_file=None, no_auth=False, host="127.0.0.1"))
    assert "'short'" not in str(refused.value)  # the message never quotes the token
    secret = tmp_path / "token"
    secret.write_text("with space " + new_token())
    with pytest.raises(ValueError, match="whitespace"):
        read_token(argparse.Namespace(token_file=str(secret), no_auth=False, host="127.0.0.1"))
    secret.write_text(new_token() + "\n")  # a mounted Secret's file may end with a newline
    assert (
        read_token(argparse.Namespace(token_file=str(secret), no_auth=False, host="127.0.0.1"))
        == secret.read_text().strip()
    )
