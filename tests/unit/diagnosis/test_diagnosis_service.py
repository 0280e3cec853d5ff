"""The diagnosis service over real HTTP: uvicorn in its own process on a free loopback port, a real etcd
for the incidents, the client (with the service's token) and its in-process fallback."""

from __future__ import annotations

import gzip
import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from support.diagnosis_service import Service, running_service, start_service, worker_pids
from support.paths import REPO

from stalwart.diagnosis import EvidenceBundle, diagnose
from stalwart.diagnosis.client import DiagnosisClient, DiagnosisUnavailable, IncidentNotFound, diagnose_local
from stalwart.diagnosis.corpus import CorpusCase, load_corpus
from stalwart.diagnosis.corpus_gen import expand_hang
from stalwart.net import free_port
from stalwart.processes import stop_process, wait_for
from stalwart.store import Store, keys
from stalwart.store.etcd_server import EtcdServer
from stalwart.store.records import Incident

CORPUS = REPO / "tests" / "data" / "diagnosis" / "corpus"
LIMIT_MIB = 2
DECODED_MIB = 8


@pytest.fixture(scope="module")
def service(etcd: EtcdServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    with running_service(
        tmp_path_factory.mktemp("diagnosis"),
        "--etcd",
        etcd.endpoint,
        "--max-body-mib",
        str(LIMIT_MIB),
        "--max-decoded-mib",
        str(DECODED_MIB),
    ) as service:
        yield service


@pytest.fixture(scope="module")
def case() -> CorpusCase:
    return next(c for c in load_corpus(CORPUS) if c.name == "hang-t2p4d2-sleep-r5")


def test_openapi_is_published(service: Service) -> None:
    doc = httpx.get(f"{service.url}/openapi.json", timeout=10).json()  # open: it is the contract
    assert {
        "/v1/diagnose",
        "/v1/incidents/{job}/{incident_id}",
        "/v1/incidents/{incident_id}",
        "/healthz",
        "/metrics",
    } <= set(doc["paths"])
    schemas = doc["components"]["schemas"]
    assert {"EvidenceBundle", "Verdict", "Topology", "RankStack"} <= set(schemas)
    assert schemas["EvidenceBundle"]["properties"]["stacks"]["maxItems"] == 131_072  # limits are in the contract
    body = doc["paths"]["/v1/diagnose"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert body == {"$ref": "#/components/schemas/EvidenceBundle"}
    assert doc["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    assert {"401", "403", "413", "503"} <= set(doc["paths"]["/v1/diagnose"]["post"]["responses"])


def test_a_worker_is_ready_before_the_first_bundle(tmp_path: Path) -> None:
    """The first failure's diagnosis does not wait for a worker to start and import the engine."""
    with running_service(tmp_path) as service:
        assert wait_for(lambda: len(worker_pids(service)) == 1, 120), service.log.read_text()[-2000:]


def test_a_verdict_over_http_equals_the_in_process_one(service: Service, case: CorpusCase) -> None:
    remote = DiagnosisClient(service.url, token=service.token).diagnose(case.bundle)
    assert remote == diagnose(case.bundle)
    assert remote.flagged == ["node-2"] and remote.failure_class == "hang" and remote.runbook == "hang"
    metrics = httpx.get(f"{service.url}/metrics", timeout=10).text
    assert 'stalwart_diagnosis_requests_total{failure_class="hang",kind="hang"}' in metrics


def test_a_large_bundle_travels_gzipped(service: Service, case: CorpusCase) -> None:
    big = expand_hang(case, tp=2, dp=128, ranks_per_node=2)  # 1,024 ranks, every text distinct
    raw = len(big.bundle.model_dump_json())
    assert LIMIT_MIB * 1024 * 1024 < raw < DECODED_MIB * 1024 * 1024  # too large to send plain, fine compressed
    verdict = DiagnosisClient(service.url, token=service.token).diagnose(big.bundle)
    assert verdict.flagged == big.truth.faulty_nodes


def test_bodies_over_the_limit_get_413(service: Service) -> None:
    headers = {"content-type": "application/json", **service.auth}
    body = b"{" + b" " * (LIMIT_MIB * 1024 * 1024 + 10) + b"}"
    r = httpx.post(f"{service.url}/v1/diagnose", content=body, headers=headers, timeout=30)
    assert r.status_code == 413 and f"the limit is {LIMIT_MIB} MiB" in r.json()["detail"]

    def chunks() -> Iterator[bytes]:  # no Content-Length: the service counts as it reads
        for _ in range(LIMIT_MIB + 2):
            yield b" " * (1024 * 1024)

    r = httpx.post(f"{service.url}/v1/diagnose", content=chunks(), headers=headers, timeout=30)
    assert r.status_code == 413 and "exceeds the limit" in r.json()["detail"]
    bomb = gzip.compress(b" " * ((DECODED_MIB + 2) * 1024 * 1024))  # a few KiB that inflate past the limit
    r = httpx.post(
        f"{service.url}/v1/diagnose", content=bomb, timeout=60, headers={**headers, "content-encoding": "gzip"}
    )
    assert len(bomb) < LIMIT_MIB * 1024 * 1024
    assert r.status_code == 413 and "decompressed" in r.json()["detail"]


def test_bad_payloads_get_a_4xx_naming_the_problem(service: Service) -> None:
    def post(body: bytes, **h: str) -> httpx.Response:
        headers = {"content-type": "application/json", **service.auth, **h}
        return httpx.post(f"{service.url}/v1/diagnose", content=body, timeout=10, headers=headers)

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


def test_incidents_are_read_from_etcd(service: Service, store: Store) -> None:
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
    client = DiagnosisClient(service.url, token=service.token)
    got = client.incident(job, "inc-0001")
    assert got["id"] == "inc-0001" and got["node"] == "node-2" and got["failure_class"] == "Hang"
    r = httpx.get(f"{service.url}/v1/incidents/inc-0001", params={"job": job}, headers=service.auth, timeout=10)
    assert r.status_code == 200 and r.json() == got
    with pytest.raises(IncidentNotFound, match="no incident 'inc-9999'"):
        client.incident(job, "inc-9999")
    r = httpx.get(f"{service.url}/v1/incidents/inc-0001", headers=service.auth, timeout=10)  # the job is required
    assert r.status_code == 422 and "job" in r.json()["detail"]
    r = httpx.get(f"{service.url}/v1/incidents/{job}/bad..id", headers=service.auth, timeout=10)
    assert r.status_code == 400 and "invalid" in r.json()["detail"]


def test_an_unreachable_service_is_unavailable_and_the_fallback_diagnoses(case: CorpusCase) -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with pytest.raises(DiagnosisUnavailable, match="cannot reach"):
        DiagnosisClient(url, timeout=2).diagnose(case.bundle)
    assert not DiagnosisClient(url, timeout=2).healthy()
    assert diagnose_local(case.bundle, url, timeout=2).flagged == ["node-2"]
    assert diagnose_local(case.bundle).flagged == ["node-2"]


def test_sigterm_stops_it_cleanly(tmp_path: Path) -> None:
    service = start_service(tmp_path)
    assert httpx.get(f"{service.url}/healthz", timeout=5).json() == {"status": "ok", "store": "none"}
    r = httpx.get(f"{service.url}/v1/incidents/j/i", headers=service.auth, timeout=5)
    assert r.status_code == 503  # no etcd configured
    code = stop_process(service.proc, grace=15)  # SIGTERM first; SIGKILL only if it does not stop in time
    assert code == 0, service.log.read_text()


def test_bundles_validate_as_models(case: CorpusCase) -> None:
    again = EvidenceBundle.model_validate_json(case.bundle.model_dump_json())
    assert again == case.bundle
