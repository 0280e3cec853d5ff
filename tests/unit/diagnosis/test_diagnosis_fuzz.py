"""Schemathesis against the diagnosis service's own OpenAPI document, on loopback: valid and invalid
requests for every operation, with the token and without. Nothing may answer 5xx (but a 503 that
the document names), every answer must be one the document lists with the body it describes, and
without the token every protected operation answers 401. Bounded: a few dozen examples each."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import ignored_auth, positive_data_acceptance
from support.diagnosis_service import Service, running_service

from stalwart.store.etcd_server import EtcdServer

EXAMPLES = 12
OPEN = {"/healthz", "/metrics"}


@pytest.fixture(scope="module")
def service(etcd: EtcdServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    with running_service(tmp_path_factory.mktemp("fuzz"), "--etcd", etcd.endpoint, "--max-body-mib", "4") as svc:
        yield svc


@pytest.fixture(scope="module")
def schema(service: Service) -> schemathesis.BaseSchema:
    return schemathesis.openapi.from_url(f"{service.url}/openapi.json")


def operations(schema: schemathesis.BaseSchema) -> list[schemathesis.APIOperation]:
    return [result.ok() for result in schema.get_all_operations()]


def fuzz(operation: schemathesis.APIOperation, mode: GenerationMode, check: object) -> None:
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        derandomize=True,
        database=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(generation_mode=mode))
    def run(case: schemathesis.Case) -> None:
        check(case)  # type: ignore[operator]

    run()


def test_every_operation_answers_as_documented(service: Service, schema: schemathesis.BaseSchema) -> None:
    ops = operations(schema)
    assert {op.path for op in ops} >= {"/v1/diagnose", "/v1/incidents/{job}/{incident_id}", "/healthz", "/metrics"}
    for op in ops:
        # /healthz and /metrics take no input: nothing in them to make invalid.
        for mode in (
            (GenerationMode.POSITIVE,) if op.path in OPEN else (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
        ):

            def check(case: schemathesis.Case) -> None:
                response = case.call(base_url=service.url, headers=service.auth, timeout=60)
                assert response.status_code < 500 or response.status_code == 503, (
                    f"{case.method} {case.formatted_path} -> {response.status_code}: {response.text[:300]}"
                )
                # Our token replaces whatever auth the case made up, so its "ignored auth" check does not
                # apply here; the test below sends none.
                case.validate_response(response, excluded_checks=[positive_data_acceptance, ignored_auth])

            fuzz(op, mode, check)


def test_without_the_token_every_protected_operation_is_refused(
    service: Service, schema: schemathesis.BaseSchema
) -> None:
    for op in operations(schema):
        if op.path in OPEN:
            continue

        def check(case: schemathesis.Case) -> None:
            headers = {k: v for k, v in (case.headers or {}).items() if k.lower() != "authorization"}
            case.headers = headers
            response = case.call(base_url=service.url, timeout=60)
            assert response.status_code == 401, f"{case.method} {case.formatted_path} -> {response.status_code}"

        fuzz(op, GenerationMode.POSITIVE, check)
