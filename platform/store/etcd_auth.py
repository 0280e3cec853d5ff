"""How a Stalwart process proves itself to etcd and checks that it talks to the right one.

One setting for every process (agents, controllers, the operator, the diagnosis service, the
console, the job-metrics exporter, the CLI), read from the environment so that a process started by
another inherits it:

    STALWART_ETCD_CA             PEM file of the CA(s) that signed etcd's certificate: TLS on
    STALWART_ETCD_CERT, _KEY     this client's certificate and key (etcd --client-cert-auth)
    STALWART_ETCD_USER           an etcd user (etcd auth enabled) ...
    STALWART_ETCD_PASSWORD       ... and its password, or
    STALWART_ETCD_PASSWORD_FILE  a file holding it (a mounted Secret; read again at each login)

Unset (or empty) everywhere: plain gRPC without credentials, what `stalwart run`'s own etcd on
127.0.0.1 speaks. A password is never sent without TLS.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, SecretStr, model_validator

CA_ENV = "STALWART_ETCD_CA"
CERT_ENV = "STALWART_ETCD_CERT"
KEY_ENV = "STALWART_ETCD_KEY"
USER_ENV = "STALWART_ETCD_USER"
PASSWORD_ENV = "STALWART_ETCD_PASSWORD"
PASSWORD_FILE_ENV = "STALWART_ETCD_PASSWORD_FILE"
ENV_NAMES = (CA_ENV, CERT_ENV, KEY_ENV, USER_ENV, PASSWORD_ENV, PASSWORD_FILE_ENV)


class EtcdAuth(BaseModel):
    """TLS material (paths) and an etcd user; every field optional, checked together."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    ca: Path | None = None
    cert: Path | None = None
    key: Path | None = None
    user: str | None = None
    password: SecretStr | None = None
    password_file: Path | None = None

    @model_validator(mode="after")
    def _consistent(self) -> EtcdAuth:
        if (self.cert is None) != (self.key is None):
            raise ValueError(f"a client certificate needs both {CERT_ENV} and {KEY_ENV} (the certificate and its key)")
        if self.cert is not None and self.ca is None:
            raise ValueError(f"a client certificate needs {CA_ENV}, the CA that signed etcd's certificate")
        if self.password is not None and self.password_file is not None:
            raise ValueError(f"give {PASSWORD_ENV} or {PASSWORD_FILE_ENV}, not both")
        has_password = self.password is not None or self.password_file is not None
        if self.user and not has_password:
            raise ValueError(f"{USER_ENV} needs a password: set {PASSWORD_ENV} or {PASSWORD_FILE_ENV}")
        if has_password and not self.user:
            raise ValueError(f"a password needs its user: set {USER_ENV}")
        if self.user and self.ca is None:
            raise ValueError(f"etcd passwords are only sent over TLS: set {CA_ENV} (the CA of etcd's certificate)")
        return self

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> EtcdAuth:
        env = os.environ if env is None else env

        def get(name: str) -> str | None:
            return env.get(name) or None

        ca, cert, key, password_file = (get(n) for n in (CA_ENV, CERT_ENV, KEY_ENV, PASSWORD_FILE_ENV))
        password = get(PASSWORD_ENV)
        return cls(
            ca=Path(ca) if ca else None,
            cert=Path(cert) if cert else None,
            key=Path(key) if key else None,
            user=get(USER_ENV),
            password=SecretStr(password) if password else None,
            password_file=Path(password_file) if password_file else None,
        )

    def merged_over(self, base: EtcdAuth) -> EtcdAuth:
        """These settings where given, `base`'s elsewhere (flags over the environment over a file)."""
        ours = self.model_dump(exclude_none=True)
        if "password" in ours or "password_file" in ours:  # one way to give a password, the nearest one
            ours.setdefault("password", None)
            ours.setdefault("password_file", None)
        return EtcdAuth(**{**base.model_dump(), **ours})

    @property
    def tls(self) -> bool:
        return self.ca is not None

    def read_password(self) -> str:
        """The password, from the file each time it is asked for: a rotated Secret is picked up at the
        next login without a restart."""
        if self.password is not None:
            return self.password.get_secret_value()
        if self.password_file is None:
            raise ValueError("no etcd password configured")
        try:
            return self.password_file.read_text().strip()
        except OSError as exc:
            raise ValueError(f"cannot read the etcd password file {self.password_file}: {exc.strerror}") from None

    def channel_files(self) -> dict[str, bytes]:
        """The TLS files' contents (ca, cert, key), each checked readable: a typo fails here, naming
        the file, not at the first RPC as a handshake error."""
        out: dict[str, bytes] = {}
        for what, path in (("CA", self.ca), ("certificate", self.cert), ("key", self.key)):
            if path is None:
                continue
            try:
                data = path.read_bytes()
            except OSError as exc:
                raise ValueError(f"cannot read the etcd {what} file {path}: {exc.strerror}") from None
            if b"-----BEGIN " not in data:
                raise ValueError(f"the etcd {what} file {path} is not PEM")
            out[what] = data
        return out

    def describe(self) -> str:
        """For messages and logs: what is used, never a secret."""
        if not self.tls:
            return "plain, no TLS"
        parts = ["TLS"]
        if self.cert is not None:
            parts.append(f"client certificate {self.cert}")
        if self.user:
            parts.append(f"user {self.user}")
        return ", ".join(parts)

    def env(self) -> dict[str, str]:
        """These settings as the environment of a child process; every variable is set (empty when
        unused), so nothing of this process's own environment leaks into the child's."""
        password = self.password.get_secret_value() if self.password is not None else ""
        values: dict[str, Any] = {
            CA_ENV: self.ca,
            CERT_ENV: self.cert,
            KEY_ENV: self.key,
            USER_ENV: self.user,
            PASSWORD_ENV: password,
            PASSWORD_FILE_ENV: self.password_file,
        }
        return {name: "" if value is None else str(value) for name, value in values.items()}


PLAIN = EtcdAuth()
