"""A node's host-memory checkpoint store: an HTTP server holding objects in its own memory.

It runs as its own process on every node (the agent starts it), so checkpoints in it outlive a
restart of the workers and vanish with the node: which is why every object also goes to a peer.

    PUT    /o/PATH   (X-Offset: N)   write the body at offset N (N=0 replaces the object)
    GET    /o/PATH   (Range: bytes=a-b)
    HEAD   /o/PATH
    GET    /dirs?prefix=P            JSON list of folder names directly under P
    DELETE /dirs/NAME
    GET    /healthz                  {"ok": true}: the only request that needs no token

Every other request carries the job's token (`Authorization: Bearer TOKEN`), compared in constant
time: none is 401, a wrong one 403. The token comes from --token-file or STALWART_CHECKPOINT_TOKEN;
without one the server does not start. A PUT states its Content-Length (411 without, 400 when it is
not a non-negative number) and is refused with 413 before its body is read when it does not fit in
what is left of the capacity; an accepted body is read straight into the memory that keeps it.
"""

from __future__ import annotations

import argparse
import hmac
import ipaddress
import json
import os
import re
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from stalwart.checkpoint.memory_auth import TOKEN_ENV, TOKEN_HEADER_PREFIX
from stalwart.net import inherited_listener

_RANGE = re.compile(r"bytes=(\d{1,19})-(\d{1,19})")
_OFFSET = re.compile(r"\d{1,19}")
_PATH = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_./-]{0,1023}")
READ_TIMEOUT = 60.0  # a client that stops sending mid-body loses its reservation after this
DRAIN_MAX = 64 << 20  # a refused body up to this (the clients' largest PUT) is read and dropped


class MemoryStore:
    """Objects as lists of immutable chunks: a PUT appends one, a reader holds references, so
    nothing is copied under the lock and a deleted object's memory goes once its readers finish."""

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity = capacity_bytes
        self.objects: dict[str, list[bytearray]] = {}
        self.sizes: dict[str, int] = {}
        self.lock = threading.Lock()
        self.used = 0  # bytes held
        self.reserved = 0  # bytes of bodies being read

    def reserve(self, path: str, offset: int, length: int) -> str | None:
        """Make room for a body before reading it; the reason it cannot be, or None."""
        with self.lock:
            size = self.sizes.get(path)
            if offset and size != offset:
                return f"409 offset {offset} but the object has {size or 0} bytes"
            freed = (size or 0) if offset == 0 else 0  # a replaced object's bytes go when the new one lands
            if self.used - freed + self.reserved + length > self.capacity:
                left = self.capacity - self.used - self.reserved
                return f"413 {length} bytes do not fit: {max(left, 0)} of {self.capacity} left"
            self.reserved += length
            return None

    def commit(self, path: str, offset: int, chunk: bytearray) -> str | None:
        with self.lock:
            self.reserved -= len(chunk)
            size = self.sizes.get(path, 0)
            if offset and size != offset:  # another writer of the same object came in between
                return f"409 offset {offset} but the object has {size} bytes"
            if offset == 0:
                self.used -= size
                self.objects[path], self.sizes[path] = [], 0
            self.objects[path].append(chunk)
            self.sizes[path] += len(chunk)
            self.used += len(chunk)
            return None

    def release(self, length: int) -> None:
        with self.lock:
            self.reserved -= length

    def delete_prefix(self, prefix: str) -> None:
        with self.lock:
            for k in [k for k in self.objects if k.startswith(prefix)]:
                del self.objects[k]
                self.used -= self.sizes.pop(k)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Small request/response pairs on a kept-alive connection: without this, Nagle's algorithm and
    # delayed ACKs add ~40 ms to every ranged read.
    disable_nagle_algorithm = True
    timeout = READ_TIMEOUT
    store: MemoryStore
    token: bytes

    def log_message(self, fmt: str, *args: object) -> None:  # quiet: one line per request is noise
        pass

    def _reply(
        self, code: int, body: bytes = b"", ctype: str = "application/octet-stream", close: bool = False
    ) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        if code == 401:
            self.send_header("WWW-Authenticate", "Bearer")
        if close:  # a body we did not read must not be taken for the next request
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        if body and self.command != "HEAD":
            self.wfile.write(body)

    def _authorized(self) -> bool:
        """401 without a token, 403 with a wrong one; the body, if any, is never read."""
        given = self.headers.get("Authorization", "")
        if not given.startswith(TOKEN_HEADER_PREFIX):
            self._reply(401, b"this store needs the job's checkpoint token", close=True)
            return False
        if not hmac.compare_digest(given[len(TOKEN_HEADER_PREFIX) :].encode(), self.token):
            self._reply(403, b"wrong checkpoint token", close=True)
            return False
        return True

    def _path(self) -> str | None:
        path = self.path[3:] if self.path.startswith("/o/") else ""
        return path if _PATH.fullmatch(path) and ".." not in path.split("/") else None

    def _refuse(self, code: int, why: bytes, length: int) -> None:
        """Refuse an authenticated PUT. A body of a size our clients send is read into a small
        scratch buffer and dropped, so the client reads the reason instead of a reset connection;
        a larger one is never read."""
        if length > DRAIN_MAX:
            self._reply(code, why, close=True)
            return
        scratch, left = memoryview(bytearray(min(length, 1 << 16))), length
        try:
            while left > 0:
                n = self.rfile.readinto(scratch[: min(left, len(scratch))])
                if not n:
                    break
                left -= n
        except OSError:
            self.close_connection = True
            return
        self._reply(code, why, close=left > 0)

    def do_PUT(self) -> None:
        if not self._authorized():
            return
        path = self._path()
        if path is None:
            self._reply(400, b"bad path", close=True)
            return
        if self.headers.get("Transfer-Encoding"):
            self._reply(411, b"send a Content-Length, not a chunked body", close=True)
            return
        raw_length, raw_offset = self.headers.get("Content-Length"), self.headers.get("X-Offset", "0")
        if raw_length is None:
            self._reply(411, b"Content-Length is required", close=True)
            return
        if not _OFFSET.fullmatch(raw_length.strip()) or not _OFFSET.fullmatch(raw_offset.strip()):
            self._reply(400, b"Content-Length and X-Offset must be non-negative integers", close=True)
            return
        length, offset = int(raw_length), int(raw_offset)
        refused = self.store.reserve(path, offset, length)
        if refused is not None:
            code, _, why = refused.partition(" ")
            self._refuse(int(code), why.encode(), length)
            return
        chunk = bytearray(length)  # the memory that keeps the object: the body is read into it
        try:
            view, got = memoryview(chunk), 0
            while got < length:
                n = self.rfile.readinto(view[got:])
                if not n:
                    raise ConnectionError(f"body ended after {got} of {length} bytes")
                got += n
        except (OSError, ConnectionError):
            self.store.release(length)
            self.close_connection = True
            return
        refused = self.store.commit(path, offset, chunk)
        if refused is not None:
            code, _, why = refused.partition(" ")
            self._reply(int(code), why.encode())
            return
        self._reply(200)

    def _range(self, size: int) -> tuple[int, int] | None | str:
        """(start, end) inclusive, None for the whole object, or an error."""
        header = self.headers.get("Range")
        if header is None:
            return None
        m = _RANGE.fullmatch(header.strip())
        if m is None or int(m.group(1)) > int(m.group(2)):
            return "bad"
        start, end = int(m.group(1)), int(m.group(2))
        return (start, end) if end < size else "outside"

    def do_GET(self) -> None:
        if self.path == "/healthz":
            self._reply(200, b'{"ok": true}', "application/json")
            return
        if not self._authorized():
            return
        if self.path == "/dirs" or self.path.startswith("/dirs?prefix="):
            prefix = self.path.partition("?prefix=")[2]
            with self.store.lock:
                rests = [k[len(prefix) :] for k in self.store.objects if k.startswith(prefix)]
            names = sorted({r.split("/", 1)[0] for r in rests if "/" in r})
            self._reply(200, json.dumps(names).encode(), "application/json")
            return
        path = self._path()
        with self.store.lock:  # references only: the chunks never change once stored
            chunks = list(self.store.objects.get(path or "", []))
            size = self.store.sizes.get(path or "")
        if size is None:
            self._reply(404)
            return
        wanted = self._range(size)
        if isinstance(wanted, str):
            self._reply(416 if wanted == "outside" else 400)
            return
        start, end = wanted if wanted is not None else (0, size - 1)
        self.send_response(206 if wanted is not None else 200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(end - start + 1))
        self.end_headers()
        if self.command == "HEAD":
            return
        pos = 0
        for chunk in chunks:  # only the range asked for: a load makes many ranged reads
            lo, hi = max(start - pos, 0), min(end + 1 - pos, len(chunk))
            if lo < hi:
                self.wfile.write(memoryview(chunk)[lo:hi])
            pos += len(chunk)

    do_HEAD = do_GET

    def do_DELETE(self) -> None:
        if not self._authorized():
            return
        name = self.path[len("/dirs/") :] if self.path.startswith("/dirs/") else ""
        if not _PATH.fullmatch(name) or ".." in name.split("/"):
            self._reply(400)
            return
        self.store.delete_prefix(name + "/")
        self._reply(200)


class Server(ThreadingHTTPServer):
    # After a node loss every restarted rank opens a connection per reading thread to the same
    # store at once. socketserver's default backlog of 5 drops the SYNs past it, and the kernel
    # resends them only after a second: that second was most of a hot-swap's checkpoint load.
    request_queue_size = 1024


def check_bind_address(host: str, allow_all: bool) -> None:
    """Refuse to listen on every interface unless asked: the store holds a job's weights."""
    try:
        unspecified = ipaddress.ip_address(host).is_unspecified
    except ValueError:
        unspecified = host == ""
    if unspecified and not allow_all:
        raise ValueError(
            f"refusing to listen on {host or 'every interface'}: give the node's address "
            "(or --allow-all-interfaces where a network policy guards the port)"
        )


def serve(
    host: str,
    port: int,
    capacity_bytes: int,
    token: str,
    *,
    allow_all_interfaces: bool = False,
    listening: socket.socket | None = None,
) -> Server:
    """The store on host:port, or on `listening`, a socket already listening there (handed over by
    the agent, which chose the port by binding it: no other process can take it in between)."""
    if not token:
        raise ValueError("the memory store needs a token")
    check_bind_address(host, allow_all_interfaces)
    bound = {"store": MemoryStore(capacity_bytes), "token": token.encode()}
    handler = type("BoundHandler", (Handler,), bound)
    if listening is None:
        server = Server((host, port), handler)
    else:
        server = Server((host, port), handler, bind_and_activate=False)
        server.socket.close()
        server.socket = listening
        server.server_address = listening.getsockname()[:2]
    server.daemon_threads = True
    return server


def _read_token(args: argparse.Namespace) -> str:
    if args.token_file:
        return Path(args.token_file).read_text().strip()
    return os.environ.get(TOKEN_ENV, "").strip()


def main() -> None:
    parser = argparse.ArgumentParser(description="Stalwart host-memory checkpoint store")
    parser.add_argument("--host", default="127.0.0.1")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--port", type=int)
    where.add_argument(
        "--listen-fd", type=int, help="serve on this inherited socket, already listening on --host (the agent's way)"
    )
    parser.add_argument("--capacity-gib", type=float, default=16.0)
    parser.add_argument("--token-file", help=f"file holding the job's token (default: ${TOKEN_ENV})")
    parser.add_argument("--allow-all-interfaces", action="store_true", help="allow --host 0.0.0.0 or ::")
    args = parser.parse_args()
    try:
        token = _read_token(args)
        if not token:
            raise ValueError(f"no token: set {TOKEN_ENV} or pass --token-file")
        listening = inherited_listener(args.listen_fd) if args.listen_fd is not None else None
        server = serve(
            args.host,
            args.port or 0,
            int(args.capacity_gib * (1 << 30)),
            token,
            allow_all_interfaces=args.allow_all_interfaces,
            listening=listening,
        )
    except (OSError, ValueError) as exc:
        print(f"memory store: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    host, port = server.server_address[:2]
    print(f"memory store listening on {host!s}:{port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
