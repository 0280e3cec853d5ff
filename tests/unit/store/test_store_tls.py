"""The store client against real etcds with TLS: one that checks client certificates (what the Helm
chart runs) and one with etcd users and roles (an external etcd run that way). Callers without the
right credentials are refused with a message that says what to change."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import SecretStr, ValidationError
from support.certs import Authority

from stalwart.store import Store, StoreAccessDenied, StoreUnavailable
from stalwart.store.etcd_auth import EtcdAuth
from stalwart.store.etcd_server import EtcdServer, ServerTLS

ROOT_PASSWORD = "root-secret"
JOB_PASSWORD = "job-secret"
# A call's deadline bounds a broken run only: the first call logs in over TLS and etcd checks the
# password with bcrypt, which took more than 2 s beside the end-to-end tests (failed a fresh clone).
CALL_TIMEOUT = 30.0


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> Authority:
    return Authority(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def client_auth(ca: Authority) -> EtcdAuth:
    cert, key = ca.issue("stalwart-client")
    return EtcdAuth(ca=ca.ca_file, cert=cert, key=key)


@pytest.fixture(scope="module")
def mtls_etcd(tmp_path_factory: pytest.TempPathFactory, ca: Authority, client_auth: EtcdAuth) -> Iterator[EtcdServer]:
    cert, key = ca.issue("etcd-mtls", hosts=("127.0.0.1", "localhost"))
    tls = ServerTLS(ca=ca.ca_file, cert=cert, key=key, client_cert_auth=True)
    with EtcdServer(tmp_path_factory.mktemp("etcd-mtls"), tls=tls, client=client_auth) as server:
        yield server


@pytest.fixture(scope="module")
def users_etcd(tmp_path_factory: pytest.TempPathFactory, ca: Authority) -> Iterator[EtcdServer]:
    cert, key = ca.issue("etcd-users", hosts=("127.0.0.1",))
    tls = ServerTLS(ca=ca.ca_file, cert=cert, key=key, client_cert_auth=False)
    root = EtcdAuth(ca=ca.ca_file)
    with EtcdServer(tmp_path_factory.mktemp("etcd-users"), tls=tls, client=root) as server:
        server.enable_auth(ROOT_PASSWORD, {"job": (JOB_PASSWORD, "/stalwart/")})
        yield server


def test_a_client_certificate_opens_etcd_and_nothing_else_does(
    mtls_etcd: EtcdServer, ca: Authority, client_auth: EtcdAuth, tmp_path: Path
) -> None:
    store = Store(mtls_etcd.endpoint, timeout=CALL_TIMEOUT, auth=client_auth)
    try:
        store.put("/stalwart/v1/probe", "yes")
        assert store.get_raw("/stalwart/v1/probe") == b"yes"
    finally:
        store.close()
    stranger = Authority(tmp_path / "other", name="other-ca")
    cert, key = stranger.issue("intruder")
    refused = {
        "plain gRPC": EtcdAuth(),
        "TLS without a client certificate": EtcdAuth(ca=ca.ca_file),
        "a certificate from another CA": EtcdAuth(ca=ca.ca_file, cert=cert, key=key),
    }
    for what, auth in refused.items():
        intruder = Store(mtls_etcd.endpoint, timeout=2.0, auth=auth)
        try:
            with pytest.raises(StoreUnavailable) as denied:
                intruder.get_raw("/stalwart/v1/probe")
        finally:
            intruder.close()
        assert mtls_etcd.endpoint in str(denied.value), what


def test_etcd_users_need_the_right_password_and_stay_in_their_prefix(users_etcd: EtcdServer, ca: Authority) -> None:
    job = Store(
        users_etcd.endpoint,
        timeout=CALL_TIMEOUT,
        auth=EtcdAuth(ca=ca.ca_file, user="job", password=SecretStr(JOB_PASSWORD)),
    )
    try:
        job.put("/stalwart/v1/jobs/a", "state")
        assert job.get_raw("/stalwart/v1/jobs/a") == b"state"
        with pytest.raises(StoreAccessDenied, match="user job"):
            job.put("/elsewhere", "x")
    finally:
        job.close()
    cases = {
        "no credentials": (EtcdAuth(ca=ca.ca_file), "wants credentials"),
        "a wrong password": (
            EtcdAuth(ca=ca.ca_file, user="job", password=SecretStr("guess")),
            "wrong user name or password",
        ),
    }
    for what, (auth, message) in cases.items():
        intruder = Store(users_etcd.endpoint, timeout=CALL_TIMEOUT, auth=auth)
        try:
            with pytest.raises(StoreAccessDenied, match=message):
                intruder.get_raw("/stalwart/v1/jobs/a")
                pytest.fail(f"{what} was let in")
        finally:
            intruder.close()


def test_a_password_file_is_read_at_login(users_etcd: EtcdServer, ca: Authority, tmp_path: Path) -> None:
    secret = tmp_path / "password"
    secret.write_text(JOB_PASSWORD + "\n")
    env = {"STALWART_ETCD_CA": str(ca.ca_file), "STALWART_ETCD_USER": "job", "STALWART_ETCD_PASSWORD_FILE": str(secret)}
    store = Store(users_etcd.endpoint, timeout=CALL_TIMEOUT, auth=EtcdAuth.from_env(env))
    try:
        store.put("/stalwart/v1/jobs/b", "ok")
        assert store.get_raw("/stalwart/v1/jobs/b") == b"ok"
    finally:
        store.close()


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"STALWART_ETCD_USER": "job", "STALWART_ETCD_PASSWORD": "x"}, "only sent over TLS"),
        ({"STALWART_ETCD_CA": "/ca.pem", "STALWART_ETCD_CERT": "/c.pem"}, "STALWART_ETCD_KEY"),
        ({"STALWART_ETCD_CA": "/ca.pem", "STALWART_ETCD_USER": "job"}, "needs a password"),
    ],
)
def test_incomplete_settings_are_refused_naming_the_variable(env: dict[str, str], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        EtcdAuth.from_env(env)


def test_an_unreadable_ca_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="missing.pem"):
        Store("127.0.0.1:1", auth=EtcdAuth(ca=tmp_path / "missing.pem"))
