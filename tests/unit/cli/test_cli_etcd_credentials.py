"""The CLI's etcd credentials: the STALWART_ETCD_* variables over the config file's etcd_* keys,
and a clear usage error when they do not fit together."""

from __future__ import annotations

from pathlib import Path

import pytest

from stalwart.ops.connection import store_auth
from stalwart.ops.errors import OpsError


@pytest.fixture
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in ("CA", "CERT", "KEY", "USER", "PASSWORD", "PASSWORD_FILE"):
        monkeypatch.delenv(f"STALWART_ETCD_{name}", raising=False)
    path = tmp_path / "config.yaml"
    monkeypatch.setenv("STALWART_CONFIG", str(path))
    return path


def test_the_config_file_names_the_files_and_the_environment_wins(
    config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config.write_text("etcd: e:2379\netcd_ca: /pki/ca.crt\netcd_cert: /pki/me.crt\netcd_key: /pki/me.key\n")
    auth = store_auth()
    assert (auth.ca, auth.cert, auth.key) == (Path("/pki/ca.crt"), Path("/pki/me.crt"), Path("/pki/me.key"))
    monkeypatch.setenv("STALWART_ETCD_CA", "/other/ca.crt")
    assert store_auth().ca == Path("/other/ca.crt") and store_auth().cert == Path("/pki/me.crt")


def test_no_settings_anywhere_is_plain(config: Path) -> None:
    assert not store_auth().tls


def test_settings_that_do_not_fit_are_a_usage_error(config: Path) -> None:
    config.write_text("etcd_user: oncall\netcd_password_file: /secret\n")
    with pytest.raises(OpsError, match="only sent over TLS"):
        store_auth()
