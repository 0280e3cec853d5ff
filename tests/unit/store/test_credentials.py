"""Tokens: made random, kept in etcd under the job's key, compared in constant time, parsed from
headers strictly, and never part of what lists a job."""

from __future__ import annotations

import pytest

from stalwart.store import Store, keys
from stalwart.store.credentials import (
    JOB_TOKEN_ENV,
    agent_job_token,
    bearer_token,
    check_token,
    ensure_job_token,
    job_token,
    new_token,
    publish_service_token,
    replace_job_token,
    service_token,
    tokens_match,
)


def test_tokens_are_random_and_compared_whole() -> None:
    a, b = new_token(), new_token()
    assert a != b and len(a) >= 43 and check_token(a, "t") == a
    assert tokens_match(a, a) and tokens_match(a.encode(), a)
    assert not tokens_match(b, a) and not tokens_match(a[:-1], a) and not tokens_match(a + "x", a)
    assert not tokens_match(None, a) and not tokens_match("", a)
    with pytest.raises(ValueError, match="too short"):
        check_token("abc", "the token")
    with pytest.raises(ValueError, match="whitespace") as refused:
        check_token("a" * 20 + "\x00" + "b" * 20, "the token")
    assert "aaaa" not in str(refused.value)


def test_bearer_headers_are_parsed_strictly() -> None:
    assert bearer_token(b"Bearer abc") == b"abc" and bearer_token("bearer  abc ") == b"abc"
    for header in (None, b"", b"Bearer", b"Bearer ", b"Basic abc", b"abc", "Token abc"):
        assert bearer_token(header) is None


def test_the_jobs_token_is_kept_under_its_key(store: Store) -> None:
    job = "cred-job"
    store.delete_prefix(keys.job_prefix(job))
    assert job_token(store, job) is None
    first = ensure_job_token(store, job)
    assert ensure_job_token(store, job) == first == job_token(store, job)  # created once
    second = replace_job_token(store, job)  # a resubmitted job gets a new one
    assert second != first and job_token(store, job) == second
    assert keys.job_token(job) == f"/stalwart/v1/jobs/{job}/token"
    assert agent_job_token(store, job, {}) == second
    assert agent_job_token(store, job, {JOB_TOKEN_ENV: "from-the-secret"}) == "from-the-secret"
    publish_service_token(store, "diagnosis", first)
    assert service_token(store, "diagnosis") == first
    assert not keys.service_token("diagnosis").startswith(keys.service("diagnosis"))  # not listed with the URLs
    store.delete_prefix(keys.job_prefix(job))
    store.delete(keys.service_token("diagnosis"))
