"""Networking helpers: free loopback ports, and listening on one address rather than all of them."""

from __future__ import annotations

import datetime
import socket
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch.distributed as dist

WILDCARD_ADDRESSES = frozenset({"", "0.0.0.0", "::", "[::]"})


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago. Callers bind it soon after; races are retried upstream."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def listen_on(host: str, port: int, backlog: int = 1024) -> socket.socket:
    """A TCP socket listening on `host` only (a name is resolved; its first address is used).

    OSError when the address is not this machine's or the port is taken."""
    if host in WILDCARD_ADDRESSES:
        raise ValueError(f"{host!r} is every interface; name the address to listen on")
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as torch does: a restart reuses the port
        sock.bind(address)
        sock.listen(backlog)
    except OSError:
        sock.close()
        raise
    return sock


def inherited_listener(fd: int) -> socket.socket:
    """The listening TCP socket open on descriptor `fd`, handed over by the process that bound it
    (`--listen-fd`: a port chosen by binding it cannot be taken by another process before the
    server starts, as a port chosen free and bound later can). ValueError when it is not one."""
    try:
        sock = socket.socket(fileno=fd)
    except OSError as exc:
        raise ValueError(f"--listen-fd {fd}: {exc.strerror or exc}") from None
    if sock.type != socket.SOCK_STREAM or not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
        sock.detach()
        raise ValueError(f"--listen-fd {fd} is not a listening TCP socket")
    return sock


def bound_tcp_store(
    host: str, port: int, world_size: int, timeout: datetime.timedelta, *, wait_for_workers: bool = False
) -> dist.TCPStore:
    """torch.distributed's rendezvous server, listening on `host` only (with `wait_for_workers`, the
    call returns once `world_size` clients, itself included, have connected, as torch's does).

    torch's TCPStore binds every interface whatever `host_name` says (that is only where clients
    connect); given a socket already listening (`master_listen_fd`, libuv backend) it serves that one.
    The store owns the socket from then on."""
    # Detached: the store closes the descriptor when it goes. If it fails to start, the descriptor is
    # left open (closing it here could close another socket that reused its number).
    fd = listen_on(host, port).detach()
    return tcp_store_on(fd, host, port, world_size, timeout, wait_for_workers=wait_for_workers)


def tcp_store_on(
    fd: int,
    host: str,
    port: int,
    world_size: int,
    timeout: datetime.timedelta,
    *,
    wait_for_workers: bool = False,
) -> dist.TCPStore:
    """torch.distributed's rendezvous server on the socket `fd` already listens on (`host`:`port`,
    which is where clients connect): one this process opened, or one it inherited, so the port was
    never free for another process to take. The store owns the descriptor from then on."""
    import torch.distributed as dist

    return dist.TCPStore(
        host,
        port,
        world_size,
        True,
        timeout=timeout,
        wait_for_workers=wait_for_workers,
        master_listen_fd=fd,
        use_libuv=True,
    )
