"""Networking helpers: ports chosen for a server that binds them later, and listening on one
address rather than all of them."""

from __future__ import annotations

import datetime
import errno
import fcntl
import os
import random
import socket
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch.distributed as dist

WILDCARD_ADDRESSES = frozenset({"", "0.0.0.0", "::", "[::]"})

# A port chosen now and bound later by another process (a rendezvous port handed to workers, etcd's
# ports) comes from below the kernel's ephemeral range: the kernel draws from that range for every
# port-0 bind and every outgoing connection, any of which could take a port probed free there before
# its server binds it (or connect a client to itself on it). Below it, only other choosers compete,
# and those on this machine take turns through the range: a cursor in a file shared by this user's
# processes, moved under a lock, so two processes choosing at once never get the same port.
CHOSEN_PORTS_FLOOR = 20000
MIN_CHOSEN_PORTS = 1000  # fewer below the ephemeral range: fall back to the kernel's choice
EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
DEFAULT_EPHEMERAL_LOW = 32768  # Linux's default, where the range cannot be read
PORT_CURSOR_FILE = Path(tempfile.gettempdir()) / f"stalwart-port-cursor-{os.getuid()}"


def chosen_port_range() -> range:
    """The ports `free_port` chooses from: below the ephemeral range (empty when too few are)."""
    try:
        ephemeral_low = int(EPHEMERAL_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral_low = DEFAULT_EPHEMERAL_LOW
    if ephemeral_low - CHOSEN_PORTS_FLOOR < MIN_CHOSEN_PORTS:
        return range(0)
    return range(CHOSEN_PORTS_FLOOR, ephemeral_low)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on `host` for a server that binds it later, perhaps in another process: nobody
    holds it now, the kernel will not hand it out meanwhile, and no other process of this machine
    choosing through here gets it before the range has gone round. A server that can bind port 0
    itself and report the port should do that instead."""
    ports = chosen_port_range()
    if ports:
        with _port_cursor() as cursor:
            start = cursor.offset if cursor.offset >= 0 else random.randrange(len(ports))
            for step in range(1, len(ports) + 1):
                offset = (start + step) % len(ports)
                if _bindable(host, ports[offset]):
                    cursor.offset = offset
                    return ports[offset]
    with socket.socket(_family(host), socket.SOCK_STREAM) as s:  # every port below taken: the kernel's pick
        s.bind((host, 0))
        return int(s.getsockname()[1])


class _Cursor:
    """Where the last choice was, as an offset into `chosen_port_range()` (-1: none yet)."""

    def __init__(self, offset: int) -> None:
        self.offset = offset


_PROCESS_CURSOR = _Cursor(-1)  # where the shared file cannot be used: this process's own turns
_PROCESS_CURSOR_LOCK = threading.Lock()


@contextmanager
def _port_cursor() -> Iterator[_Cursor]:
    """The shared cursor, locked for the caller; this process's own where the file is unusable."""
    try:
        fd = os.open(PORT_CURSOR_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        with _PROCESS_CURSOR_LOCK:
            yield _PROCESS_CURSOR
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        text = os.pread(fd, 32, 0).decode(errors="replace").strip()
        cursor = _Cursor(int(text) if text.isdigit() else -1)
        yield cursor
        if str(cursor.offset) != text:
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(cursor.offset).encode(), 0)
    finally:
        os.close(fd)  # releases the lock


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def _bindable(host: str, port: int) -> bool:
    """Whether `port` on `host` is free (no listener, no connection lingering on it). Any other
    failure (an address that is not this machine's) is the caller's error, raised."""
    with socket.socket(_family(host), socket.SOCK_STREAM) as s:
        try:
            s.bind((host.strip("[]"), port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise
    return True


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
