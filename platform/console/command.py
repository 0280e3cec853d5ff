"""`stalwart console`: serve the web console for the jobs in one etcd.

The command is the console's own: the CLI finds it through the `stalwart.cli.commands` entry point
(pyproject.toml) and imports nothing of the console, as the console imports nothing of the CLI.

It finds etcd as the on-call commands do (--etcd, $STALWART_ETCD, the config file). Who may view and
who may act is set by flags; with none, a console bound to loopback lets anyone on this machine view
(as the CLI would let them read) and nobody act, and a console bound elsewhere refuses to start.
"""

from __future__ import annotations

import functools
import ipaddress
import os
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from stalwart.console.access import AccessSettings, Role, read_tokens
from stalwart.ops.connection import ETCD_ENV, resolve
from stalwart.ops.errors import EXIT_USAGE, OpsError

SECRET_ENV = "STALWART_CONSOLE_SECRET"
EtcdOption = Annotated[
    str | None,
    typer.Option("--etcd", metavar="HOST:PORT", help=f"etcd to read (default: ${ETCD_ENV}, then the config file)."),
]
KUBERNETES_ENV = "STALWART_CONSOLE_KUBERNETES"  # the chart sets it: suspend/resume through the TrainingJob
DEFAULT_PORT = 8090
LOOPBACK_HOSTS = ["127.0.0.1", "localhost", "::1", "[::1]"]


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def read_secret(path: Path | None) -> bytes:
    """The key that signs sessions and CSRF tokens: shared by every replica behind one address, so it
    comes from a file or $STALWART_CONSOLE_SECRET; without either, a random one (sign-ins end when the
    console restarts)."""
    if path is not None:
        try:
            data = path.read_bytes().strip()
        except OSError as exc:
            raise OpsError(f"cannot read the secret file {path}: {exc.strerror}", EXIT_USAGE) from None
        if len(data) < 16:
            raise OpsError(f"the secret in {path} is too short (16 bytes at least)", EXIT_USAGE)
        return data
    if os.environ.get(SECRET_ENV):
        return os.environ[SECRET_ENV].encode()
    return secrets.token_bytes(32)


def access_settings(
    host: str,
    trust_proxy: list[str],
    operator_group: list[str],
    viewer_group: list[str],
    tokens: Path | None,
    anonymous: Role | None,
) -> AccessSettings:
    try:
        proxies = [ipaddress.ip_network(p, strict=False) for p in trust_proxy]
    except ValueError as exc:
        raise OpsError(f"--trust-proxy: {exc}", EXIT_USAGE) from None
    try:
        holders = read_tokens(tokens) if tokens is not None else []
    except ValueError as exc:
        raise OpsError(str(exc), EXIT_USAGE) from None
    settings = AccessSettings(
        trusted_proxies=proxies,
        operator_groups=operator_group or ["stalwart-operators"],
        viewer_groups=viewer_group,
        tokens=holders,
        anonymous=anonymous,
    )
    if not settings.configured:
        if not _is_loopback(host):
            raise OpsError(
                f"the console would listen on {host} with no way to tell who is asking: pass --trust-proxy CIDR "
                "(behind an authenticating proxy), --tokens FILE, or --anonymous viewer",
                EXIT_USAGE,
            )
        settings.anonymous = Role.VIEWER
    return settings


def _say(line: str) -> None:
    typer.echo(line, err=True)


def _one_line_errors(fn: Callable[..., None]) -> Callable[..., None]:
    """A refusal (bad flags, no etcd) is one line on stderr and its exit code, as the CLI's are."""

    @functools.wraps(fn)
    def wrapper(*args: object, **kwargs: object) -> None:
        try:
            fn(*args, **kwargs)
        except OpsError as exc:
            _say(f"error: {exc}")
            raise typer.Exit(exc.code) from None

    return wrapper


@_one_line_errors
def console(
    etcd: EtcdOption = None,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="Port to listen on.")] = DEFAULT_PORT,
    trust_proxy: Annotated[
        list[str] | None,
        typer.Option(
            "--trust-proxy",
            metavar="CIDR",
            help="Believe X-Forwarded-User/-Groups from these addresses (the authenticating proxy). Repeatable.",
        ),
    ] = None,
    operator_group: Annotated[
        list[str] | None,
        typer.Option(
            "--operator-group", help="Proxy groups whose users may act (default: stalwart-operators). Repeatable."
        ),
    ] = None,
    viewer_group: Annotated[
        list[str] | None,
        typer.Option(
            "--viewer-group", help="Proxy groups whose users may view (default: anyone the proxy names). Repeatable."
        ),
    ] = None,
    tokens: Annotated[
        Path | None,
        typer.Option(metavar="FILE", help="Bearer tokens (YAML: tokens: [{user, role, sha256}]), for /login and APIs."),
    ] = None,
    anonymous: Annotated[
        Role | None,
        typer.Option(help="Role of a request nobody identified (default: viewer on loopback, else refused)."),
    ] = None,
    secret_file: Annotated[
        Path | None,
        typer.Option(metavar="FILE", help=f"Key that signs sign-ins and forms (default: ${SECRET_ENV}, else random)."),
    ] = None,
    allowed_host: Annotated[
        list[str] | None,
        typer.Option(
            "--allowed-host",
            help="Host names the console answers to (default: loopback names on loopback, else any). Repeatable.",
        ),
    ] = None,
    root_path: Annotated[str, typer.Option(help="Path prefix the proxy serves the console under, e.g. /console.")] = "",
    secure_cookies: Annotated[bool, typer.Option(help="Mark the sign-in cookie Secure (served over HTTPS).")] = False,
    refresh: Annotated[float, typer.Option(min=0.5, max=60, help="Seconds between live updates of a page.")] = 2.0,
    sample_seconds: Annotated[
        float, typer.Option(min=0.5, max=600, help="Seconds between the samples of the charts.")
    ] = 2.0,
    history_points: Annotated[int, typer.Option(min=10, max=100_000, help="Samples kept per job (in memory).")] = 1800,
    kubernetes: Annotated[
        bool,
        typer.Option(
            "--kubernetes",
            envvar=KUBERNETES_ENV,
            help="This console serves a Kubernetes cluster: suspend and resume patch the TrainingJob's spec.suspend "
            "through the Kubernetes API (the pod's service account, or the kubeconfig), so the operator keeps it.",
        ),
    ] = False,
) -> None:
    """Serve the operator web console: jobs, one job's nodes and ranks, incidents with their runbooks,
    live logs, stacks now, and the actions on a bad node (cordon, uncordon, evict, checks, suspend).

    Examples:

        stalwart console --etcd 127.0.0.1:2379

        stalwart console --host 0.0.0.0 --trust-proxy 10.0.0.0/8 --operator-group sre

        stalwart console --tokens tokens.yaml --anonymous viewer
    """
    import uvicorn

    from stalwart.console.access import Gate
    from stalwart.console.app import ConsoleConfig, create_app
    from stalwart.console.history import History
    from stalwart.logs import configure
    from stalwart.store.client import Store, StoreUnavailable

    settings = access_settings(host, trust_proxy or [], operator_group or [], viewer_group or [], tokens, anonymous)
    conn = resolve(etcd)
    if conn.etcd is None:
        raise OpsError(
            "no etcd given: pass --etcd HOST:PORT, set STALWART_ETCD, or write 'etcd: HOST:PORT' in the config file",
            EXIT_USAGE,
        )
    hosts = allowed_host or (LOOPBACK_HOSTS if _is_loopback(host) else ["*"])
    store = Store(conn.etcd)
    try:
        try:
            store.ping()
        except StoreUnavailable as exc:
            _say(f"warning: {exc}; serving anyway (pages say so until it answers)")
        history = History(store, interval=sample_seconds, points=history_points)
        app = create_app(
            store,
            Gate(settings, read_secret(secret_file)),
            history,
            ConsoleConfig(
                refresh_seconds=refresh, allowed_hosts=hosts, secure_cookies=secure_cookies, kubernetes=kubernetes
            ),
        )
        who = []
        if settings.trusted_proxies:
            who.append(f"proxy headers from {', '.join(str(p) for p in settings.trusted_proxies)}")
        if settings.tokens:
            who.append(f"{len(settings.tokens)} token(s)")
        if settings.anonymous:
            who.append(f"anyone else as {settings.anonymous.value}")
        _say(
            f"stalwart console on http://{host}:{port}{root_path} · etcd {conn.etcd} ({conn.etcd_source}) · "
            f"sign-in: {'; '.join(who)}" + (" · suspend/resume through the Kubernetes API" if kubernetes else "")
        )
        configure("INFO")
        uvicorn.run(app, host=host, port=port, root_path=root_path, log_config=None, access_log=True)
    finally:
        store.close()
