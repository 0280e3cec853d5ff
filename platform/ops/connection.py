"""Where the CLI, the console and the kubectl plugin find etcd and the diagnosis service.

The same commands work against a local `stalwart run` and a cluster, so the endpoints come from,
first to last: the command's flags (--etcd, --diagnosis-url), the environment (STALWART_ETCD,
STALWART_DIAGNOSIS_URL), the config file ($STALWART_CONFIG, else
$XDG_CONFIG_HOME/stalwart/config.yaml, else ~/.config/stalwart/config.yaml):

    etcd: etcd.stalwart.svc:2379
    diagnosis_url: http://diagnosis.stalwart.svc:8080
    etcd_ca: ~/.stalwart/etcd-ca.crt        # etcd with TLS (STALWART_ETCD_CA)
    etcd_cert: ~/.stalwart/etcd-client.crt  # client certificate (STALWART_ETCD_CERT, _KEY)
    etcd_key: ~/.stalwart/etcd-client.key
    etcd_user: oncall                       # or an etcd user (STALWART_ETCD_USER) ...
    etcd_password_file: ~/.stalwart/etcd-password   # ... and its password's file

The diagnosis URL may also be absent everywhere: the service publishes itself in etcd. How the
CLI proves itself to etcd: the STALWART_ETCD_* variables (stalwart.store.etcd_auth), each over the
config file's key of the same name; neither: plain, as `stalwart run`'s own etcd on 127.0.0.1.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from stalwart.ops.errors import EXIT_USAGE, OpsError
from stalwart.store.client import Store
from stalwart.store.etcd_auth import EtcdAuth

ETCD_ENV = "STALWART_ETCD"
DIAGNOSIS_ENV = "STALWART_DIAGNOSIS_URL"
CONFIG_ENV = "STALWART_CONFIG"
STORE_TIMEOUT_SECONDS = 5.0


class ConfigFile(BaseModel):
    """~/.config/stalwart/config.yaml; unknown keys are refused, a typo must not pass silently."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    etcd: str | None = None
    diagnosis_url: str | None = Field(default=None, alias="diagnosisUrl")
    etcd_ca: Path | None = None
    etcd_cert: Path | None = None
    etcd_key: Path | None = None
    etcd_user: str | None = None
    etcd_password_file: Path | None = None

    def etcd_auth(self) -> EtcdAuth:
        def expand(path: Path | None) -> Path | None:
            return path.expanduser() if path is not None else None

        return EtcdAuth.model_construct(
            ca=expand(self.etcd_ca),
            cert=expand(self.etcd_cert),
            key=expand(self.etcd_key),
            user=self.etcd_user,
            password=None,
            password_file=expand(self.etcd_password_file),
        )


class Connection(BaseModel):
    etcd: str | None
    etcd_source: str
    diagnosis_url: str | None
    diagnosis_source: str


def config_path() -> Path:
    if os.environ.get(CONFIG_ENV):
        return Path(os.environ[CONFIG_ENV])
    base = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return base / "stalwart" / "config.yaml"


def read_config(path: Path | None = None) -> ConfigFile:
    path = path or config_path()
    if not path.exists():
        return ConfigFile()
    try:
        doc = yaml.safe_load(path.read_text()) or {}
        return ConfigFile.model_validate(doc)
    except (OSError, yaml.YAMLError, ValidationError) as exc:
        first = str(exc).strip().splitlines()
        raise OpsError(f"bad config file {path}: {' '.join(first[:3])}", EXIT_USAGE) from None


def normalize_endpoint(value: str) -> str:
    """'http://host:2379/' and 'host:2379' are the same etcd; anything else is a usage error."""
    text = value.strip().removeprefix("http://").removeprefix("https://").rstrip("/")
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or "," in text:
        raise OpsError(f"etcd endpoint must be HOST:PORT, got {value!r}", EXIT_USAGE)
    return text


def resolve(etcd: str | None = None, diagnosis_url: str | None = None) -> Connection:
    """Flags, then the environment, then the config file; the config is read only when needed."""
    etcd_value, etcd_source = etcd, "--etcd"
    diag_value, diag_source = diagnosis_url, "--diagnosis-url"
    if etcd_value is None and os.environ.get(ETCD_ENV):
        etcd_value, etcd_source = os.environ[ETCD_ENV], ETCD_ENV
    if diag_value is None and os.environ.get(DIAGNOSIS_ENV):
        diag_value, diag_source = os.environ[DIAGNOSIS_ENV], DIAGNOSIS_ENV
    if etcd_value is None or diag_value is None:
        config = read_config()
        if etcd_value is None and config.etcd:
            etcd_value, etcd_source = config.etcd, str(config_path())
        if diag_value is None and config.diagnosis_url:
            diag_value, diag_source = config.diagnosis_url, str(config_path())
    return Connection(
        etcd=normalize_endpoint(etcd_value) if etcd_value else None,
        etcd_source=etcd_source if etcd_value else "unset",
        diagnosis_url=diag_value.rstrip("/") if diag_value else None,
        diagnosis_source=diag_source if diag_value else "unset",
    )


def store_auth() -> EtcdAuth:
    """The STALWART_ETCD_* variables over the config file's etcd_* keys, checked together."""
    try:
        return EtcdAuth.from_env().merged_over(read_config().etcd_auth())
    except ValidationError as exc:
        problem = exc.errors()[0]["msg"].removeprefix("Value error, ")
        raise OpsError(f"etcd credentials ({config_path()} and STALWART_ETCD_*): {problem}", EXIT_USAGE) from None


@contextmanager
def open_store(etcd: str | None) -> Iterator[Store]:
    """A connected Store (checked with one round trip, so 'unreachable' is said before anything else)."""
    conn = resolve(etcd)
    if conn.etcd is None:
        raise OpsError(
            f"no etcd given: pass --etcd HOST:PORT, set {ETCD_ENV}, or write 'etcd: HOST:PORT' in {config_path()} "
            "(`stalwart run` prints its etcd on its first line)",
            EXIT_USAGE,
        )
    try:
        store = Store(conn.etcd, timeout=STORE_TIMEOUT_SECONDS, auth=store_auth())
    except ValueError as exc:  # an unreadable or non-PEM certificate file, named
        raise OpsError(str(exc), EXIT_USAGE) from None
    try:
        store.ping()
        yield store
    finally:
        store.close()
