"""Tokens that internal services check: the job's credential and a service's bearer token.

A job's token is created when the job is submitted (`stalwart run`, or the operator when it writes
the job into etcd), kept at keys.job_token(job) and, on Kubernetes, in a Secret the job's pods read
as STALWART_JOB_TOKEN. The agent hands it to the memory store and the workers it starts as
STALWART_CHECKPOINT_TOKEN. A service's token (the diagnosis service's) is the cluster's: a Secret on
Kubernetes; `stalwart run` makes one and publishes it at keys.service_token(name) beside the URL.

Tokens are compared in constant time and never printed or logged: the functions here return them,
and nothing else in the product formats them.
"""

from __future__ import annotations

import hmac
import os
import secrets
from collections.abc import Mapping

from stalwart.store import keys
from stalwart.store.client import Store

JOB_TOKEN_ENV = "STALWART_JOB_TOKEN"  # the job's credential, in a job pod (from the job's Secret)
DIAGNOSIS_TOKEN_ENV = "STALWART_DIAGNOSIS_TOKEN"  # the diagnosis service's bearer token
MIN_TOKEN_CHARS = 16


def new_token() -> str:
    """256 random bits, URL-safe (it travels in headers and environment variables)."""
    return secrets.token_urlsafe(32)


def tokens_match(given: str | bytes | None, expected: str | bytes) -> bool:
    """Constant time in the length of `expected`: a wrong guess learns nothing from the timing."""
    if given is None:
        return False
    a = given.encode() if isinstance(given, str) else given
    b = expected.encode() if isinstance(expected, str) else expected
    return hmac.compare_digest(a, b)


def bearer_token(authorization: str | bytes | None) -> bytes | None:
    """The token of an `Authorization: Bearer <token>` header, or None."""
    if not authorization:
        return None
    raw = authorization if isinstance(authorization, bytes) else authorization.encode("latin-1", "replace")
    scheme, _, token = raw.strip().partition(b" ")
    if scheme.lower() != b"bearer" or not token.strip():
        return None
    return token.strip()


def check_token(token: str, what: str) -> str:
    """A usable token, or ValueError saying why not (without the token)."""
    token = token.strip()
    if len(token) < MIN_TOKEN_CHARS:
        raise ValueError(f"{what} is too short ({len(token)} characters; at least {MIN_TOKEN_CHARS})")
    if any(c.isspace() or not c.isprintable() for c in token):
        raise ValueError(f"{what} contains whitespace or unprintable characters")
    return token


# -- the job's token ------------------------------------------------------------------------------
def replace_job_token(store: Store, job: str) -> str:
    """A fresh token for a job submitted anew (`stalwart run`)."""
    token = new_token()
    store.put(keys.job_token(job), token)
    return token


def ensure_job_token(store: Store, job: str) -> str:
    """The job's token, created if it has none yet (the operator, on every reconcile)."""
    store.create(keys.job_token(job), new_token())
    token = job_token(store, job)
    if token is None:  # deleted between the two calls: the job is being cleaned up
        raise LookupError(f"job {job!r} has no token in etcd")
    return token


def job_token(store: Store, job: str) -> str | None:
    raw = store.get_raw(keys.job_token(job))
    return raw.decode() if raw else None


def agent_job_token(store: Store, job: str, env: Mapping[str, str] | None = None) -> str | None:
    """What an agent uses: the Secret's value in its environment when the pod has one, else etcd's."""
    env = os.environ if env is None else env
    return env.get(JOB_TOKEN_ENV) or job_token(store, job)


# -- a service's token ----------------------------------------------------------------------------
def publish_service_token(store: Store, name: str, token: str) -> None:
    store.put(keys.service_token(name), token)


def service_token(store: Store, name: str) -> str | None:
    raw = store.get_raw(keys.service_token(name))
    return raw.decode() if raw else None
