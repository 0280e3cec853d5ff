"""The diagnosis service over real HTTP: uvicorn in its own process on a free loopback port, a real etcd
for the incidents, the client with its in-process fallback."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from support.paths import REPO

from stalwart.diagnosis import EvidenceBundle, diagnose
from stalwart.diagnosis.client import DiagnosisClient, DiagnosisUnavailable, IncidentNotFound, diagnose_local
from stalwart.diagnosis.corpus import CorpusCase, load_corpus
from stalwart.diagnosis.corpus_gen import expand_hang
from stalwart.net import free_port
from stalwart.processes import spawn, stop_process, wait_for
from stalwart.store import Store, keys
from stalwart.store.etcd_server import EtcdServer
from stalwart.store.records import Incident

CORPUS = REPO / "tests" / "data" / "diagnosis" / "corpus"
LIMIT_MIB = 2
DECODED_MIB = 8


def start_service(tmp: Path, *args: str) -> tuple[subprocess.Popen[bytes], str, Path]:
    port = free_port()
    log = tmp / f"service-{port}.log"
    with open(log, "wb") as f:
        proc = spawn(
            [sys.executable, "-m", "stalwart.diagnosis.service", "--host", "127.0.0.1", "--port", str(port), *args],
            stdout=f,
        )
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        if proc.poll() is not None:
            return True
        try:
            return httpx.get(f"{url}/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    if not wait_for(up, 120, 0.2) or proc.poll() is not None:
        stop_process(proc, grace=2)
        pytest.fail(f"the diagnosis service did not come up:\n{log.read_text()[-3000:]}")
    return proc, url, log


@pytest.fixture(scope="module")
def service(etcd: EtcdServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    proc, url, log = start_service(
        tmp_path_factory.mktemp("diagnosis"),
        "--etcd",
        etcd.endpoint,
        "--max-body-mib",
        str(LIMIT_MIB),
        "--max-decoded-mib",
        str(DECODED_MIB),
    )
    try:
        yield url
    finally:
        stop_process(proc, grace=10)


@pytest.fixture(scope="module")
def case() -> CorpusCase:
    return next(c for c in load_corpus(CORPUS) if c.name == "hang-t2p4d2-sleep-r5")


def test_openapi_is_published(service: str) -> None:
    doc = httpx.get(f"{service}/openapi.json", timeout=10).json()
    assert {
        "/v1/diagnose",
        "/v1/incidents/{job}/{incident_id}",
        "/v1/incidents/{incident_id}",
        "/healthz",
        "/metrics",
    } <= set(doc["paths"])
    schemas = doc["components"]["schemas"]
    assert {"EvidenceBundle", "Verdict", "Topology", "RankStack"} <= set(schemas)
    assert schemas["EvidenceBundle"]["properties"]["stacks"]["maxItems"] == 65536  # limits are in the contract


def test_a_verdict_over_http_equals_the_in_process_one(service: str, case: CorpusCase) -> None:
    remote = DiagnosisClient(service).diagnose(case.bundle)
    assert remote == diagnose(case.bundle)
    assert remote.flagged == ["node-2"] and remote.failure_class == "hang" and remote.runbook == "hang"
    metrics = httpx.get(f"{service}/metrics", timeout=10).text
    assert 'stalwart_diagnosis_requests_total{failure_class="hang",kind="hang"}' in metrics


def test_a_large_bundle_travels_gzipped(service: str, case: CorpusCase) -> None:
    big = expand_hang(case, tp=2, dp=128, ranks_per_node=2)  # 1,024 ranks, every text distinct
    raw = len(big.bundle.model_dump_json())
    assert LIMIT_MIB * 1024 * 1024 < raw < DECODED_MIB * 1024 * 1024  # too large to send plain, fine compressed
    verdict = DiagnosisClient(service).diagnose(big.bundle)
    assert verdict.flagged == big.truth.faulty_nodes


def test_bodies_over_the_limit_get_413(service: str) -> None:
    body = b"{" + b" " * (LIMIT_MIB * 1024 * 1024 + 10) + b"}"
    r = httpx.post(f"{service}/v1/diagnose", content=body, headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == 413 and f"the limit is {LIMIT_MIB} MiB" in r.json()["detail"]

    def chunks() -> Iterator[bytes]:  # no Content-Length: the service counts as it reads
        for _ in range(LIMIT_MIB + 2):
            yield b" " * (1024 * 1024)

    r = httpx.post(f"{service}/v1/diagnose", content=chunks(), headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == 413 and "exceeds the limit" in r.json()["detail"]
    bomb = gzip.compress(b" " * ((DECODED_MIB + 2) * 1024 * 1024))  # a few KiB that inflate past the limit
    r = httpx.post(
        f"{service}/v1/diagnose",
        content=bomb,
        timeout=60,
        headers={"content-type": "application/json", "content-encoding": "gzip"},
    )
    assert len(bomb) < LIMIT_MIB * 1024 * 1024
    assert r.status_code == 413 and "decompressed" in r.json()["detail"]


def test_bad_payloads_get_a_4xx_naming_the_problem(service: str) -> None:
    def post(body: bytes, **h: str) -> httpx.Response:
        return httpx.post(
            f"{service}/v1/diagnose", content=body, timeout=10, headers={"content-type": "application/json", **h}
        )

    r = post(b'{"job": "x", "stacks": [')
    assert r.status_code == 400 and "not valid JSON" in r.json()["detail"]
    r = post(b"not gzip at all", **{"content-encoding": "gzip"})
    assert r.status_code == 400 and "gzip" in r.json()["detail"]
    r = post(json.dumps({"job": "x", "stacks": [{"rank": -1, "text": "t"}]}).encode())
    assert r.status_code == 422 and "stacks.0.rank" in r.json()["detail"]
    r = post(json.dumps({"job": "x", "topology": {"world_size": 10, "tp": 3, "dp": 2}}).encode())
    assert r.status_code == 422 and "topology" in r.json()["detail"] and "world_size" in r.json()["detail"]
    r = post(json.dumps({"job": "x", "kind": "meltdown"}).encode())
    assert r.status_code == 422 and "kind" in r.json()["detail"]
    r = post(json.dumps({"job": "x", "stacks": [{"rank": 0, "text_ref": 3}]}).encode())
    assert r.status_code == 422 and "texts[3]" in r.json()["detail"]
    r = post(json.dumps({"job": "x", "topology": {"world_size": 2}, "stacks": [{"rank": 5, "text": "t"}]}).encode())
    assert r.status_code == 422 and "rank 5 is outside" in r.json()["detail"]
    r = post(b'{"job": "x"}', **{"content-encoding": "br"})
    assert r.status_code == 415


def test_incidents_are_read_from_etcd(service: str, store: Store) -> None:
    job = "diag-svc"
    now = time.time()
    incident = Incident(
        id="inc-0001",
        job=job,
        failure_class="Hang",
        generation=3,
        node="node-2",
        rank=5,
        evidence=["rank 5 stalled"],
        failed_at=now - 5,
        detected_at=now,
    )  # type: ignore[arg-type]
    store.put(keys.incident(job, incident.id), incident)
    client = DiagnosisClient(service)
    got = client.incident(job, "inc-0001")
    assert got["id"] == "inc-0001" and got["node"] == "node-2" and got["failure_class"] == "Hang"
    r = httpx.get(f"{service}/v1/incidents/inc-0001", params={"job": job}, timeout=10)
    assert r.status_code == 200 and r.json() == got
    with pytest.raises(IncidentNotFound, match="no incident 'inc-9999'"):
        client.incident(job, "inc-9999")
    r = httpx.get(f"{service}/v1/incidents/inc-0001", timeout=10)  # the job is required
    assert r.status_code == 422 and "job" in r.json()["detail"]
    r = httpx.get(f"{service}/v1/incidents/{job}/bad..id", timeout=10)
    assert r.status_code == 400 and "invalid" in r.json()["detail"]


def test_an_unreachable_service_is_unavailable_and_the_fallback_diagnoses(case: CorpusCase) -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with pytest.raises(DiagnosisUnavailable, match="cannot reach"):
        DiagnosisClient(url, timeout=2).diagnose(case.bundle)
    assert not DiagnosisClient(url, timeout=2).healthy()
    assert diagnose_local(case.bundle, url, timeout=2).flagged == ["node-2"]
    assert diagnose_local(case.bundle).flagged == ["node-2"]


def test_sigterm_stops_it_cleanly(tmp_path: Path) -> None:
    proc, url, log = start_service(tmp_path)
    assert httpx.get(f"{url}/healthz", timeout=5).json() == {"status": "ok", "store": "none"}
    assert httpx.get(f"{url}/v1/incidents/j/i", timeout=5).status_code == 503  # no etcd configured
    code = stop_process(proc, grace=15)  # SIGTERM first; SIGKILL only if it does not stop in time
    assert code == 0, log.read_text()


def test_bundles_validate_as_models(case: CorpusCase) -> None:
    again = EvidenceBundle.model_validate_json(case.bundle.model_dump_json())
    assert again == case.bundle
