"""stalwart.store.jobs: the one reader of a job's spec in etcd (controller, agents, exporter)."""

from __future__ import annotations

import json
import uuid

import pytest

from stalwart.spec import SpecError
from stalwart.store import Store, keys
from stalwart.store.jobs import read_spec

DOCUMENT = {
    "apiVersion": "stalwart.dev/v1alpha1",
    "kind": "TrainingJob",
    "metadata": {"name": "d"},
    "spec": {"roles": [{"name": "t", "command": ["x"]}], "codeVersion": "v7"},
}


def test_read_spec_parses_what_is_there_and_names_the_key_when_it_cannot(store: Store) -> None:
    job = f"spec-{uuid.uuid4().hex[:6]}"
    assert read_spec(store, job) is None
    store.put(keys.job_spec(job), json.dumps(DOCUMENT))
    spec = read_spec(store, job)
    assert spec is not None and spec.spec.code_version == "v7"
    store.put(keys.job_spec(job), "{not json")
    with pytest.raises(SpecError, match=rf"{keys.job_spec(job)}: invalid TrainingJob:\n  - \(document\): not JSON"):
        read_spec(store, job)
    store.put(keys.job_spec(job), json.dumps({**DOCUMENT, "spec": {"roles": []}}))
    with pytest.raises(SpecError, match=keys.job_spec(job)):
        read_spec(store, job)
